#include "worker/data/batch_loader.h"

namespace pstar {

Result<BatchLoader> BatchLoader::Create(TrainingData data, int64_t batch, int64_t seq, int rank, int world,
                                        int64_t accum) {
  const std::string step = accum > 1 ? "ranks*batch_size*grad_accum_steps" : "ranks*batch_size";
  if (data.rows() != nullptr) {
    const PackedRows& rows = *data.rows();
    if (rows.seq() != seq) {
      return Status::Internal("packed rows of " + std::to_string(rows.seq()) + " positions for seq_len " +
                              std::to_string(seq));
    }
    const int64_t need = accum * int64_t(world) * batch;
    if (rows.rows() < need) {
      return Status::InvalidArgument("the examples pack into " + std::to_string(rows.rows()) +
                                     " rows, fewer than one step needs (" + step + " = " + std::to_string(need) +
                                     ")");
    }
    return BatchLoader(data, batch, seq, rank, world, accum);
  }
  const TokenSource& source = *data.tokens();
  const int64_t need = accum * int64_t(world) * batch * seq + 1;
  if (source.size() < need) {
    return Status::InvalidArgument("data holds " + std::to_string(source.size()) + " tokens, fewer than one step needs (" +
                                   step + "*seq_len+1 = " + std::to_string(need) + ")");
  }
  return BatchLoader(data, batch, seq, rank, world, accum);
}

int64_t BatchLoader::StepStart(int64_t cursor) const {
  const int64_t step_rows = accum_ * int64_t(world_) * batch_;
  // Compared without overflow, whatever cursor a checkpoint restored.
  if (rows_ != nullptr) {
    return cursor < 0 || cursor % seq_ != 0 || cursor / seq_ > rows_->rows() - step_rows ? 0 : cursor;
  }
  return cursor < 0 || cursor > source_->size() - (step_rows * seq_ + 1) ? 0 : cursor;
}

void BatchLoader::Next(int32_t* tokens, int32_t* targets, int32_t* positions) {
  const int64_t global_rows = int64_t(world_) * batch_;
  if (micro_ == 0) cursor_ = StepStart(cursor_);
  micro_ = (micro_ + 1) % accum_;
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t offset = (int64_t(rank_) * batch_ + b) * seq_;
    if (rows_ != nullptr) {
      rows_->Row((cursor_ + offset) / seq_, tokens + b * seq_, targets + b * seq_,
                 positions != nullptr ? positions + b * seq_ : nullptr);
      continue;
    }
    source_->Read(cursor_ + offset, seq_ + 1, window_.data());
    for (int64_t t = 0; t < seq_; ++t) {
      tokens[b * seq_ + t] = window_[size_t(t)];
      targets[b * seq_ + t] = window_[size_t(t + 1)];
    }
  }
  cursor_ += global_rows * seq_;
}

int64_t BatchLoader::CountedAhead(int64_t batches) const {
  const int64_t global_rows = int64_t(world_) * batch_;
  if (rows_ == nullptr) return batches * global_rows * seq_;
  int64_t counted = 0, cursor = cursor_;
  for (int64_t k = 0; k < batches; ++k) {
    if ((micro_ + k) % accum_ == 0) cursor = StepStart(cursor);
    for (int64_t r = 0; r < global_rows; ++r) counted += rows_->Counted(cursor / seq_ + r);
    cursor += global_rows * seq_;
  }
  return counted;
}

}  // namespace pstar

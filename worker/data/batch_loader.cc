#include "worker/data/batch_loader.h"

namespace pstar {

Result<BatchLoader> BatchLoader::Create(const TokenSource& source, int64_t batch, int64_t seq, int rank,
                                        int world) {
  const int64_t need = int64_t(world) * batch * seq + 1;
  if (source.size() < need) {
    return Status::InvalidArgument("data holds " + std::to_string(source.size()) +
                                   " tokens, fewer than one batch needs (ranks*batch_size*seq_len+1 = " +
                                   std::to_string(need) + ")");
  }
  return BatchLoader(source, batch, seq, rank, world);
}

void BatchLoader::Next(int32_t* tokens, int32_t* targets) {
  const int64_t global_rows = int64_t(world_) * batch_;
  // Compared without overflow, whatever cursor a checkpoint restored: a
  // cursor that leaves no room for the batch starts the data again.
  if (cursor_ < 0 || cursor_ > source_->size() - (global_rows * seq_ + 1)) cursor_ = 0;
  for (int64_t b = 0; b < batch_; ++b) {
    source_->Read(cursor_ + (int64_t(rank_) * batch_ + b) * seq_, seq_ + 1, window_.data());
    for (int64_t t = 0; t < seq_; ++t) {
      tokens[b * seq_ + t] = window_[size_t(t)];
      targets[b * seq_ + t] = window_[size_t(t + 1)];
    }
  }
  cursor_ += global_rows * seq_;
}

}  // namespace pstar

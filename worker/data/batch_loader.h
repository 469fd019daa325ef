// BatchLoader: cuts (batch, seq) windows and their next-token targets from a
// token stream, or takes packed rows of examples, in a fixed order, so a run
// is reproducible and its cursor can be saved and restored.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/core/status.h"
#include "worker/data/packed_rows.h"
#include "worker/data/token_source.h"

namespace pstar {

// What a run trains or validates on: a token stream, cut into windows, or
// examples packed into rows (data.source jsonl). A view: what it names must
// outlive its users.
class TrainingData {
 public:
  TrainingData(const TokenSource& tokens) : tokens_(&tokens) {}  // NOLINT(google-explicit-constructor)
  TrainingData(const PackedRows& rows) : rows_(&rows) {}         // NOLINT(google-explicit-constructor)
  const TokenSource* tokens() const { return tokens_; }
  const PackedRows* rows() const { return rows_; }

 private:
  const TokenSource* tokens_ = nullptr;
  const PackedRows* rows_ = nullptr;
};

class BatchLoader {
 public:
  // A step is `accum` global batches of world*batch rows. Fails when the
  // data holds less than one step: accum*world*batch*seq + 1 tokens of a
  // stream, accum*world*batch packed rows (of length seq). With `world`
  // ranks each global batch is read by all and rank r takes its rows
  // [r*batch, (r+1)*batch): disjoint slices, and together exactly what one
  // rank with world*batch rows would read.
  static Result<BatchLoader> Create(TrainingData data, int64_t batch, int64_t seq, int rank = 0, int world = 1,
                                    int64_t accum = 1);

  // Fills tokens and targets (batch*seq each; a target is -1 where the loss
  // ignores it) and advances; a step that would run past the end starts
  // from the beginning, so a step sees the same rows at any accumulation
  // and world size. Packed rows also fill `positions` (each token's
  // position in its example); a stream leaves it untouched.
  void Next(int32_t* tokens, int32_t* targets, int32_t* positions = nullptr);
  // Whether the rows hold packed examples (Next's positions matter).
  bool packed() const { return rows_ != nullptr; }
  // The targets the loss counts in the next `batches` global batches, every
  // rank's rows: a step's loss divides by it. Does not advance.
  int64_t CountedAhead(int64_t batches) const;

  // The global cursor: tokens (positions, for packed rows) of the data
  // consumed so far by all ranks.
  // Set at a step's start (a checkpoint's cursor).
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t cursor) {
    cursor_ = cursor;
    micro_ = 0;
  }

 private:
  BatchLoader(TrainingData data, int64_t batch, int64_t seq, int rank, int world, int64_t accum)
      : source_(data.tokens()), rows_(data.rows()), batch_(batch), seq_(seq), rank_(rank), world_(world),
        accum_(accum), window_(size_t(seq + 1)) {}
  // Where a step starting at `cursor` starts: there, or at 0 where the
  // step would run past the end (or the cursor is not a step's start).
  int64_t StepStart(int64_t cursor) const;
  const TokenSource* source_;
  const PackedRows* rows_;
  int64_t batch_, seq_;
  int rank_, world_;
  int64_t accum_;
  int64_t cursor_ = 0;
  int64_t micro_ = 0;  // global batches of the step under way read so far
  std::vector<int32_t> window_;  // one sequence plus its last target
};

}  // namespace pstar

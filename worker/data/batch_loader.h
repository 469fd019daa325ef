// BatchLoader: cuts (batch, seq) windows and their next-token targets from a
// TokenSource in a fixed order, so a run is reproducible and its cursor can be
// saved and restored.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/core/status.h"
#include "worker/data/token_source.h"

namespace pstar {

class BatchLoader {
 public:
  // Fails when the source holds fewer than world*batch*seq + 1 tokens. With
  // `world` ranks each step reads one global batch of world*batch rows and
  // rank r takes rows [r*batch, (r+1)*batch): disjoint slices, and together
  // exactly what one rank with world*batch rows would read.
  static Result<BatchLoader> Create(const TokenSource& source, int64_t batch, int64_t seq, int rank = 0,
                                    int world = 1);

  // Fills tokens and targets (batch*seq each) and advances; wraps to the start
  // when the next batch would run past the end.
  void Next(int32_t* tokens, int32_t* targets);

  // The global cursor: tokens of the data consumed so far by all ranks.
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t cursor) { cursor_ = cursor; }

 private:
  BatchLoader(const TokenSource& source, int64_t batch, int64_t seq, int rank, int world)
      : source_(&source), batch_(batch), seq_(seq), rank_(rank), world_(world), window_(size_t(seq + 1)) {}
  const TokenSource* source_;
  int64_t batch_, seq_;
  int rank_, world_;
  int64_t cursor_ = 0;
  std::vector<int32_t> window_;  // one sequence plus its last target
};

}  // namespace pstar

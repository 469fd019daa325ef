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
  // Fails when the source holds fewer than batch*seq + 1 tokens.
  static Result<BatchLoader> Create(const TokenSource& source, int64_t batch, int64_t seq);

  // Fills tokens and targets (batch*seq each) and advances; wraps to the start
  // when the next batch would run past the end.
  void Next(int32_t* tokens, int32_t* targets);

  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t cursor) { cursor_ = cursor; }

 private:
  BatchLoader(const TokenSource& source, int64_t batch, int64_t seq)
      : source_(&source), batch_(batch), seq_(seq), window_(size_t(seq + 1)) {}
  const TokenSource* source_;
  int64_t batch_, seq_;
  int64_t cursor_ = 0;
  std::vector<int32_t> window_;  // one sequence plus its last target
};

}  // namespace pstar

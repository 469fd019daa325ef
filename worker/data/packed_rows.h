// PackedRows: tokenized examples packed into rows of a fixed length, each
// position with its next-token target (-1 where the loss ignores it) and its
// position within its example, so attention stays inside an example
// (kernels/attention.h) and positions restart per example. A pure function
// of the examples, the row length and the seed: every rank, world size and
// resume sees the same rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/core/status.h"
#include "worker/data/chat_examples.h"

namespace pstar {

// data.overlong: an example longer than a row is cut to the row, or refused.
enum class OverlongPolicy { kTruncate, kError };

class PackedRows {
 public:
  struct Counts {
    int64_t examples = 0;   // packed
    int64_t truncated = 0;  // cut to the row length
    int64_t dropped = 0;    // truncated to nothing the loss counts, so left out
  };

  // An example of n ids fills n - 1 positions: inputs ids[0..n-2], targets
  // ids[1..n-1], a target kept where the example counts it and -1
  // elsewhere. Examples are placed best-fit in decreasing length (ties in
  // line order) and the rows then shuffled by `seed`; the rest of a row is
  // padding (token `pad`, target -1, each padding position its own
  // example). An example longer than `seq` is cut to seq + 1 ids or, with
  // kError, refused naming its line.
  static Result<PackedRows> Pack(std::span<const TokenizedExample> examples, int64_t seq, OverlongPolicy overlong,
                                 uint64_t seed, int32_t pad);

  int64_t rows() const { return int64_t(counted_.size()); }
  int64_t seq() const { return seq_; }
  const Counts& counts() const { return counts_; }
  // Row r's seq tokens, targets and positions.
  void Row(int64_t r, int32_t* tokens, int32_t* targets, int32_t* positions) const;
  // Targets of row r the loss counts (>= 0).
  int64_t Counted(int64_t r) const { return counted_[size_t(r)]; }

 private:
  int64_t seq_ = 0;
  Counts counts_;
  std::vector<int32_t> tokens_, targets_, positions_;  // rows * seq each
  std::vector<int64_t> counted_;
};

}  // namespace pstar

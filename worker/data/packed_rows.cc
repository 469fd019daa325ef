#include "worker/data/packed_rows.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>

namespace pstar {

Result<PackedRows> PackedRows::Pack(std::span<const TokenizedExample> examples, int64_t seq, OverlongPolicy overlong,
                                    uint64_t seed, int32_t pad) {
  if (seq <= 0) return Status::InvalidArgument("packing needs a positive row length");
  PackedRows p;
  p.seq_ = seq;
  // Each example's positions (ids it keeps, less one), 0 when left out.
  std::vector<int64_t> length(examples.size(), 0);
  for (size_t e = 0; e < examples.size(); ++e) {
    const TokenizedExample& x = examples[e];
    int64_t n = int64_t(x.ids.size());
    if (n - 1 > seq) {
      if (overlong == OverlongPolicy::kError) {
        return Status::InvalidArgument("line " + std::to_string(x.line) + ": " + std::to_string(n) +
                                       " tokens, longer than a row of train.seq_len " + std::to_string(seq) +
                                       " + 1 (data.overlong: error; truncate cuts it)");
      }
      n = seq + 1;
      ++p.counts_.truncated;
    }
    bool counts = false;
    for (int64_t i = 1; i < n && !counts; ++i) counts = x.counted[size_t(i)] != 0;
    if (!counts) {
      ++p.counts_.dropped;
      continue;
    }
    length[e] = n - 1;
    ++p.counts_.examples;
  }
  // Best fit, longest first: each example into the row with the least room
  // that holds it.
  std::vector<size_t> order(examples.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length[a] > length[b]; });
  std::vector<std::vector<size_t>> rows;
  std::multimap<int64_t, size_t> room;  // free positions -> row
  for (size_t e : order) {
    const int64_t len = length[e];
    if (len == 0) break;
    auto it = room.lower_bound(len);
    size_t r;
    int64_t left;
    if (it == room.end()) {
      r = rows.size();
      rows.emplace_back();
      left = seq - len;
    } else {
      r = it->second;
      left = it->first - len;
      room.erase(it);
    }
    rows[r].push_back(e);
    if (left > 0) room.emplace(left, r);
  }
  // The rows in an order of the seed's (Fisher-Yates over the 64-bit Mersenne
  // Twister, whose outputs the C++ standard fixes), so no batch is all long
  // or all short examples.
  std::mt19937_64 rng(seed);
  for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[size_t(rng() % i)]);
  const size_t S = size_t(seq);
  p.tokens_.assign(rows.size() * S, pad);
  p.targets_.assign(rows.size() * S, -1);
  p.positions_.assign(rows.size() * S, 0);
  p.counted_.assign(rows.size(), 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    size_t at = r * S;
    for (size_t e : rows[r]) {
      const TokenizedExample& x = examples[e];
      for (int64_t i = 0; i < length[e]; ++i, ++at) {
        p.tokens_[at] = x.ids[size_t(i)];
        p.positions_[at] = int32_t(i);
        if (x.counted[size_t(i + 1)] != 0) {
          p.targets_[at] = x.ids[size_t(i + 1)];
          ++p.counted_[r];
        }
      }
    }
  }
  return p;
}

void PackedRows::Row(int64_t r, int32_t* tokens, int32_t* targets, int32_t* positions) const {
  const size_t at = size_t(r * seq_);
  std::copy_n(tokens_.begin() + std::ptrdiff_t(at), seq_, tokens);
  std::copy_n(targets_.begin() + std::ptrdiff_t(at), seq_, targets);
  if (positions != nullptr) std::copy_n(positions_.begin() + std::ptrdiff_t(at), seq_, positions);
}

}  // namespace pstar

// ChunkTrace: the sequence of moments of a training step (the streaming
// chunks each Access pins), recorded in the first step and checked in every
// later one. While the steps repeat it, it predicts each chunk's next use,
// which OPT eviction and prefetch read; a moment unlike the recorded one (or
// one beyond it) invalidates it until the step ends and is adopted anew.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pstar {

class ChunkTrace {
 public:
  explicit ChunkTrace(int32_t total_chunks) : total_chunks_(total_chunks) {}

  void BeginStep();
  // This step's next moment: checked against the trace, then kept.
  void Observe(std::vector<int32_t> moment);
  // The moment Observe saw is over.
  void Advance() { ++moment_; }
  // Adopts this step's moments when the trace was invalid or the step was
  // shorter than it.
  void EndStep();

  bool valid() const { return valid_; }
  int64_t recordings() const { return recordings_; }
  int64_t size() const { return int64_t(trace_.size()); }
  // The moment index within the step (of the moment being served). Set to
  // -1 while prefetching for the next step, so distances count from just
  // before its first moment.
  int64_t moment() const { return moment_; }
  void set_moment(int64_t moment) { moment_ = moment; }
  // The streaming chunks of the recorded moment `m`.
  const std::vector<int32_t>& MomentAt(int64_t m) const { return trace_[size_t(m)]; }
  // Moments from now until chunk `index` is next used (a later step's first
  // use counts on); a very large number when it never is.
  int64_t NextUseDistance(int32_t index) const;
  // For a chunk the current moment uses: moments from now until the first
  // moment after its run of consecutive uses (when its pin ends), and from
  // now until its first use after that run (a later step's first use counts
  // on). Both 0 when the current moment does not use it.
  struct HeldRun {
    int64_t release = 0;
    int64_t next_use = 0;
  };
  HeldRun CurrentRun(int32_t index) const;

 private:
  const int32_t total_chunks_;
  std::vector<std::vector<int32_t>> trace_;  // chunk indices per moment
  std::vector<std::vector<int32_t>> uses_;   // each chunk's moments
  bool valid_ = false;
  int64_t recordings_ = 0;
  std::vector<std::vector<int32_t>> step_moments_;  // this step's, so far
  int64_t moment_ = 0;
};

}  // namespace pstar

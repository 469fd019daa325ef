#include "worker/train/step_payload.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "worker/data/generated_corpus.h"
#include "worker/data/token_source.h"
#include "worker/dist/communicator.h"
#include "worker/train/trainer.h"

namespace pstar {

namespace {

// Rank 0 of `world` ranks whose shards are copies of rank 0's: a gather
// repeats this rank's shard, a reduce-scatter takes N times its part, an
// all-reduce N times its value. The numbers stay finite and in scale; the
// bytes are counted as the ring collectives send them.
class StandInCommunicator final : public Communicator {
 public:
  explicit StandInCommunicator(int world) : world_(world) {}
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  Status AllGather(const float* shard, float* full, int64_t n) override {
    for (int r = 0; r < world_; ++r) {
      if (full + r * n != shard) std::memmove(full + r * n, shard, size_t(n) * sizeof(float));
    }
    Count(CollectiveOp::kAllGather, (world_ - 1) * n * 4);
    return Status();
  }
  Status ReduceScatter(const float* full, float* shard, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) shard[i] = full[i] * float(world_);
    Count(CollectiveOp::kReduceScatter, (world_ - 1) * n * 4);
    return Status();
  }
  Status ReduceScatterHalf(const uint16_t* full, uint16_t* shard, int64_t n, HalfFormat) override {
    if (shard != full) std::memmove(shard, full, size_t(n) * sizeof(uint16_t));
    Count(CollectiveOp::kReduceScatter, (world_ - 1) * n * 2);
    return Status();
  }
  Status AllReduceSum(double* data, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) data[i] *= double(world_);
    return Status();
  }
  Status Broadcast(void*, int64_t, int) override { return Status(); }
  Status Barrier() override { return Status(); }

 private:
  void Count(CollectiveOp op, int64_t bytes) {
    ++counters_.calls[size_t(op)];
    counters_.bytes[size_t(op)] += bytes;
  }
  const int world_;
};

}  // namespace

Result<StepPayload> SimulateStepPayload(const Config& config, int world_size, int steps) {
  if (config.runtime.device != ComputeDevice::kCpu) {
    return Status::FailedPrecondition("the payload is simulated for CPU jobs (runtime.device: cpu), not " +
                                      std::string(ComputeDeviceName(config.runtime.device)));
  }
  if (world_size < 2) return Status::InvalidArgument("the payload needs a world size of at least 2");
  if (steps < 2) return Status::InvalidArgument("the payload needs at least 2 steps");
  Config c = config;
  c.train.steps = steps;
  c.checkpoint.dir.clear();
  c.train.eval_every = 0;
  c.train.sample_every = 0;
  // Tokens for the steps: which chunks move does not depend on them.
  const int64_t tokens = (int64_t(steps) + 1) * c.train.batch_size * c.train.grad_accum_steps * world_size *
                             (c.train.seq_len + 1) + 1;
  VectorTokenSource data(GenerateCorpus(c.model.gpt.vocab_size, std::max<int64_t>(tokens, 1024), c.data.seed));
  StandInCommunicator comm(world_size);
  PSTAR_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, data, &comm));
  StepPayload p;
  int64_t before[2] = {0, 0}, last[2] = {0, 0}, previous[2] = {-1, -1};
  const CollectiveCounters& counters = comm.counters();
  for (int s = 0; s < steps; ++s) {
    before[0] = counters.bytes[size_t(CollectiveOp::kAllGather)];
    before[1] = counters.bytes[size_t(CollectiveOp::kReduceScatter)];
    PSTAR_RETURN_IF_ERROR(trainer->Step().status().WithPrefix("payload simulation"));
    trainer->store().chunks().WaitCollectives();
    previous[0] = last[0], previous[1] = last[1];
    last[0] = counters.bytes[size_t(CollectiveOp::kAllGather)] - before[0];
    last[1] = counters.bytes[size_t(CollectiveOp::kReduceScatter)] - before[1];
  }
  p.all_gather_bytes = last[0];
  p.reduce_scatter_bytes = last[1];
  p.steps = steps;
  p.steady = previous[0] == last[0] && previous[1] == last[1];
  return p;
}

}  // namespace pstar

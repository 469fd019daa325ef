#include "worker/ckpt/checkpoint.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "worker/ckpt/checkpoint_dir.h"
#include "worker/ckpt/crc64.h"
#include "worker/model/gpt.h"

namespace pstar {

namespace {

// Every rank learns whether every rank succeeded; this is also the barrier
// between the phases of a save. A failed collective wins over everything.
Status AgreeAll(Communicator& comm, const Status& local, const std::string& phase) {
  double failed = local.ok() ? 0.0 : 1.0;
  PSTAR_RETURN_IF_ERROR(comm.AllReduceSum(&failed, 1));
  if (!local.ok()) return local;
  if (failed > 0) {
    return Status::Internal("checkpoint " + phase + " failed on " + std::to_string(int64_t(failed)) +
                            " other rank(s)");
  }
  return Status::Ok();
}

Status CheckState(const TrainingState& state) {
  if (state.step < 0) return Status::InvalidArgument("checkpoint step must not be negative");
  if (!std::isfinite(state.loss_scale) || state.loss_scale <= 0) {
    return Status::InvalidArgument("checkpoint loss scale must be finite and positive");
  }
  return Status::Ok();
}

}  // namespace

std::string LayoutFingerprint(const std::vector<TensorSpec>& specs) {
  Crc64 crc;
  for (const TensorSpec& s : specs) {
    // The visible shape: padding rows do not change what a checkpoint holds.
    const std::vector<int64_t> shape = s.visible_shape();
    std::string line = s.name + ":";
    for (size_t i = 0; i < shape.size(); ++i) line += (i ? "x" : "") + std::to_string(shape[i]);
    line += "\n";
    crc.Update(line.data(), line.size());
  }
  return FormatCrc64(crc.value());
}

std::string ModelFingerprint(const GptConfig& g) {
  const std::vector<TensorSpec> specs = GptTensorSpecs(g);
  if (g.architecture == Architecture::kGpt2) return LayoutFingerprint(specs);
  std::vector<TensorSpec> described = specs;
  TensorSpec d;
  char line[512];
  std::snprintf(line, sizeof line, "description %s %s %.17g %s %.17g %d %.17g %.17g %.17g %lld %s %s %d",
                ArchitectureName(g.architecture), NormKindName(g.norm), g.norm_eps, PositionKindName(g.positions),
                g.rope_theta, int(g.rope_scaling.llama3), g.rope_scaling.factor, g.rope_scaling.low_freq_factor,
                g.rope_scaling.high_freq_factor, (long long)g.rope_scaling.original_max_position_embeddings,
                MlpKindName(g.mlp), LinearBiasName(g.linear_bias), int(g.tied_embeddings));
  d.name = line;
  d.shape = {1};
  described.push_back(d);
  return LayoutFingerprint(described);
}

Status SaveCheckpoint(const std::string& root, int64_t keep, const std::vector<OwnedRange>& ranges,
                      const TrainingState& state, Communicator& comm, DeviceCopier* device,
                      const std::string& tokenizer_file, const std::vector<NamedFile>& model_files) {
  Status valid = CheckState(state);
  if (valid.ok()) valid = CheckOwnedRanges(ranges, device);
  PSTAR_RETURN_IF_ERROR(AgreeAll(comm, valid, "arguments"));

  const std::string name = StepDirName(state.step);
  Status prepared = comm.rank() == 0 ? PrepareStagingDir(root, state.step) : Status::Ok();
  PSTAR_RETURN_IF_ERROR(AgreeAll(comm, prepared, name + " (preparing " + root + ")"));

  Status written =
      WriteRankFile(StagingDir(root, state.step), comm.rank(), comm.world_size(), state.step, ranges, device);
  PSTAR_RETURN_IF_ERROR(AgreeAll(comm, written, name + " (writing rank files)"));

  Status published =
      comm.rank() == 0 ? PublishCheckpoint(root, comm.world_size(), state, keep, tokenizer_file, model_files)
                       : Status::Ok();
  return AgreeAll(comm, published, name + " (publishing)");
}

Result<TrainingState> LoadLatestCheckpoint(const std::string& root, const std::string& layout_fingerprint,
                                           const std::vector<OwnedRange>& ranges, Communicator& comm,
                                           std::vector<std::string>* warnings, DeviceCopier* device) {
  std::vector<std::string> local_warnings;
  if (warnings == nullptr) warnings = &local_warnings;
  PSTAR_RETURN_IF_ERROR(AgreeAll(comm, CheckOwnedRanges(ranges, device), "load (arguments)"));

  // Rank 0 decides which checkpoints to try, in which order: {found, status
  // code, count}, then the steps.
  auto candidates = CheckpointCandidates(root, warnings);
  std::vector<int64_t> steps = candidates.ok() ? *candidates : std::vector<int64_t>{};
  int64_t head[3] = {candidates.ok() ? 1 : 0, int64_t(candidates.status().code()), int64_t(steps.size())};
  PSTAR_RETURN_IF_ERROR(comm.Broadcast(head, sizeof(head), 0));
  if (head[0] == 0) {
    if (!candidates.ok()) return candidates.status();
    return Status(StatusCode(head[1]), root + ": no usable checkpoint (as rank 0 sees it)");
  }
  steps.resize(size_t(head[2]));
  PSTAR_RETURN_IF_ERROR(comm.Broadcast(steps.data(), int64_t(steps.size() * sizeof(int64_t)), 0));

  std::vector<std::string> tried;
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t step = steps[i];
    const std::string dir = (std::filesystem::path(root) / StepDirName(step)).string();
    Result<TrainingState> loaded = LoadCheckpointDir(dir, layout_fingerprint, ranges, device);
    // {failed, different model, failed but not damaged}, summed over ranks.
    // Only DataLoss means a damaged checkpoint; any other error (the device
    // copier failing, say) would fail on an older checkpoint too.
    const StatusCode code = loaded.status().code();
    const bool other_error = !loaded.ok() && code != StatusCode::kDataLoss && code != StatusCode::kFailedPrecondition;
    double verdict[3] = {loaded.ok() ? 0.0 : 1.0, code == StatusCode::kFailedPrecondition ? 1.0 : 0.0,
                         other_error ? 1.0 : 0.0};
    PSTAR_RETURN_IF_ERROR(comm.AllReduceSum(verdict, 3));
    if (verdict[1] > 0) {
      if (code == StatusCode::kFailedPrecondition) return loaded.status();
      return Status::FailedPrecondition(dir + ": checkpoint was written for a different model (reported by another rank)");
    }
    if (verdict[2] > 0) {
      if (other_error) return loaded.status();
      return Status::Internal(dir + ": loading failed on another rank");
    }
    if (verdict[0] == 0) return loaded;
    const std::string problem = loaded.ok() ? dir + ": damaged (reported by another rank)" : loaded.status().message();
    warnings->push_back("checkpoint unusable: " + problem +
                        (i + 1 < steps.size() ? "; trying an older one" : "; no older one left"));
    tried.push_back(problem);
  }
  std::string message = root + ": no usable checkpoint; tried:";
  for (const std::string& t : tried) message += " " + t + ";";
  message.pop_back();
  return Status::DataLoss(message);
}

}  // namespace pstar

// Sharded checkpoints. Every rank saves the pieces of tensor state it owns
// into one safetensors file of a per-step directory; rank 0 adds a manifest
// (training state, checksums) and publishes the directory, then moves the
// `latest` pointer. Pieces are matched by tensor element ranges on load, so a
// checkpoint written by N ranks loads into any number of ranks. The format is
// described in docs/checkpoints.md.
//
// All ranks must share one filesystem under `root` (a local disk for a
// single-node job, NFS or a shared volume across nodes): files a rank has
// written and closed before a collective are visible to every rank after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"
#include "worker/model/gpt_config.h"
#include "worker/model/param_layout.h"
#include "worker/runtime/runtime_counters.h"

namespace pstar {

// One contiguous piece of one tensor's state that this rank holds: elements
// [begin, end) of tensor `tensor` of kind `kind`, at `data` (end-begin floats).
struct OwnedRange {
  StateKind kind = StateKind::kParam;
  std::string tensor;
  int64_t begin = 0, end = 0;
  float* data = nullptr;
  // The range is not in host memory the host may address (in device memory,
  // or homed on disk): it is reached only through the DeviceCopier given to
  // the save or load, and `data` (a device pointer, or null) is never
  // dereferenced on the host.
  bool on_device = false;
  // Where the copier finds it: the chunk holding it, and the offset of its
  // first float in this rank's shard of that chunk.
  int32_t chunk = -1;
  int64_t chunk_offset = 0;
};

// Copies between host memory and the ranges the host cannot address, `offset`
// bytes into the range. Synchronous: the bytes are in place when a call
// returns.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  virtual Status ToHost(void* host_dst, const OwnedRange& src, int64_t offset, size_t bytes) = 0;
  virtual Status ToDevice(const OwnedRange& dst, int64_t offset, const void* host_src, size_t bytes) = 0;
};

// Everything besides tensors a resume needs (same on every rank).
struct TrainingState {
  int64_t step = 0;                // optimizer steps completed; names the directory
  int64_t data_position = 0;       // global data cursor (tokens consumed in order)
  int64_t optimizer_steps = 0;     // Adam's step count (bias correction)
  double loss_scale = 1.0;         // finite and positive
  std::string layout_fingerprint;  // identifies model shapes (same fingerprint required to load)
  // The model's description, for `pstar export` and `pstar sample`.
  // Manifests from before the architecture was recorded read as GPT-2.
  GptConfig model;
  // What made the tokens (data.tokenizer): "byte", "gpt2", "hf" (their
  // tokenizer.json is in the checkpoint), "tiktoken" (its rank file is) or
  // "none". Checkpoints from before
  // it was recorded read as "byte", the only tokenizer there was.
  std::string tokenizer = "none";
};

// A small file a checkpoint carries by name (the imported Hugging Face
// directory's config.json, generation_config.json and tokenizer files), so
// that they travel with the run into its exports.
struct NamedFile {
  std::string name;      // as in the directory it came from: "tokenizer.json"
  std::string contents;
};

// A fingerprint of model shapes: the CRC-64 of every tensor's name and shape,
// in order ("crc64:..."). Chunk sizes do not enter it: pieces are matched by
// tensor ranges, so a checkpoint loads under any chunk layout.
std::string LayoutFingerprint(const std::vector<TensorSpec>& specs);
// The fingerprint a model's checkpoints carry: GPT-2's is its layout's; any
// other architecture's covers its description too (RoPE's theta and scaling,
// the norm's epsilon: what no tensor shape shows), so a checkpoint resumes
// only into the model that wrote it.
std::string ModelFingerprint(const GptConfig& model);

// Saves `ranges` (this rank's pieces; empty ones are skipped) and `state` as
// root/step-<state.step>/, replacing a directory of that step. Every rank
// calls it with the same root, keep and state. Keeps the newest `keep`
// complete checkpoints with steps up to state.step (keep <= 0: all) and
// deletes the others, including newer ones left by an abandoned run. On
// success every rank returns after the checkpoint is published; a failure on
// any rank fails the call on every rank.
//
// `device` reads the ranges marked on_device (required when there are any:
// InvalidArgument otherwise). Their bytes pass through one host buffer of at
// most 4 MiB per rank, never a whole piece at once; the file is the same as
// for host ranges. A copier error fails the save and publishes nothing.
// With state.tokenizer "gpt2", "hf" or "tiktoken", `tokenizer_file`
// (BpeTokenizer::SavedText) is saved beside the manifest, checksummed by it; so are
// `model_files` (the imported Hugging Face directory's own files).
Status SaveCheckpoint(const std::string& root, int64_t keep, const std::vector<OwnedRange>& ranges,
                      const TrainingState& state, Communicator& comm, DeviceCopier* device = nullptr,
                      const std::string& tokenizer_file = "", const std::vector<NamedFile>& model_files = {});

// Fills `ranges` from the checkpoint `latest` names and returns its state.
// A damaged checkpoint (missing, truncated or corrupt file, bad manifest, a
// piece of an owned range missing) adds a warning naming the file and the
// problem, and the next older complete checkpoint is tried. All ranks use the
// same checkpoint. NotFound: root holds no checkpoint (start fresh).
// FailedPrecondition: written for a model with another layout fingerprint.
// DataLoss: no checkpoint was usable; the message lists what was tried. After
// an error the contents of `ranges` are unspecified. `warnings` may be null.
//
// `device` fills the ranges marked on_device (required when there are any:
// InvalidArgument otherwise), from the same bounded read buffer the host
// ranges are copied from. A copier error is not a damaged checkpoint: it is
// returned (Internal, naming the file and the copier's message) without
// trying older checkpoints.
Result<TrainingState> LoadLatestCheckpoint(const std::string& root, const std::string& layout_fingerprint,
                                           const std::vector<OwnedRange>& ranges, Communicator& comm,
                                           std::vector<std::string>* warnings, DeviceCopier* device = nullptr);

}  // namespace pstar

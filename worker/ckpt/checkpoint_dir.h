// The on-disk checkpoint format, one process at a time: the steps
// SaveCheckpoint and LoadLatestCheckpoint take on each rank between their
// collectives, and what `pstar export` reads. Tests call them directly to
// play several ranks in one process.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "worker/ckpt/checkpoint.h"
#include "worker/core/file_util.h"
#include "worker/core/status.h"

namespace pstar {

inline constexpr int kCheckpointFormatVersion = 1;

std::string StepDirName(int64_t step);  // "step-00000123"
std::string RankFileName(int rank);     // "rank-00000.safetensors"
std::string RankSidecarName(int rank);  // "rank-00000.json"
// The safetensors name of a piece: "param/transformer.wte.weight@1024".
std::string PieceName(StateKind kind, const std::string& tensor, int64_t begin);
// The step of a complete step directory's name, or -1 (".tmp" names too).
int64_t ParseStepDirName(std::string_view name);

// InvalidArgument for a range with begin > end, a negative begin, no data, an
// empty tensor name, a duplicate (kind, tensor, begin), or one on_device when
// `device` is null.
Status CheckOwnedRanges(const std::vector<OwnedRange>& ranges, const DeviceCopier* device = nullptr);

// Steps of the complete (published) checkpoint directories in `root`, newest first.
std::vector<int64_t> ListCompleteSteps(const std::string& root);
// The step `root/latest` names. NotFound when there is no such file.
Result<int64_t> ReadLatestStep(const std::string& root);
// The steps a load tries, in order: the one `latest` names, then the older
// complete directories newest first. Problems with `latest` become warnings.
// NotFound when root holds no checkpoint. `warnings` may be null.
Result<std::vector<int64_t>> CheckpointCandidates(const std::string& root, std::vector<std::string>* warnings);

// Where ranks write step `step` before it is published: root/step-<step>.tmp.
std::string StagingDir(const std::string& root, int64_t step);
// Rank 0, before any rank writes: creates root, removes leftovers of
// interrupted saves (step-*.tmp) and creates an empty staging directory.
Status PrepareStagingDir(const std::string& root, int64_t step);
// Every rank: writes its pieces (rank file) and their size and checksum
// (sidecar) into the staging directory. Pieces on_device are fetched with
// `device` through a bounded host buffer; a copier error leaves no rank file.
Status WriteRankFile(const std::string& staging_dir, int rank, int world_size, int64_t step,
                     const std::vector<OwnedRange>& ranges, DeviceCopier* device = nullptr);
// Rank 0, after every rank wrote: the manifest from the sidecars, then the
// rename to root/step-<step>, the `latest` pointer, and pruning to `keep`.
// With state.tokenizer "gpt2" or "hf" it writes `tokenizer_file` as
// tokenizer.json first, with "tiktoken" as tokenizer.model (the rank file),
// named and checksummed in the manifest.
// The files of a Hugging Face directory that travel with a run's
// checkpoints into its exports: config.json, generation_config.json and the
// tokenizer's (tokenizer.json, tokenizer_config.json with its chat template,
// special_tokens_map.json, SentencePiece's tokenizer.model, a separate
// chat_template.jinja).
const std::vector<std::string>& CarriedModelFileNames();
bool IsCarriedModelFile(const std::string& name);

// `model_files` are written as "hf.<name>", each named and checksummed in
// the manifest (names as IsCarriedModelFile takes them).
Status PublishCheckpoint(const std::string& root, int world_size, const TrainingState& state, int64_t keep,
                         const std::string& tokenizer_file = "", const std::vector<NamedFile>& model_files = {});

struct ManifestFile {
  std::string name;  // within the step directory
  int64_t bytes = 0;
  uint64_t crc64 = 0;
};
struct Manifest {
  int world_size = 0;
  TrainingState state;
  std::vector<ManifestFile> files;  // one per saving rank, in rank order
  ManifestFile tokenizer_file;      // tokenizer.json (gpt2, hf) or tokenizer.model (tiktoken)
  std::vector<ManifestFile> model_files;  // "hf.<name>": the imported directory's own files
};
// Reads and verifies step_dir/manifest.json (its own checksum, fields, and
// that its step matches the directory's name). DataLoss names the problem.
Result<Manifest> ReadManifest(const std::string& step_dir);

// Every parameter of the checkpoint in `step_dir`, whole, for a model of
// shape `model` (its manifest's): in GptVisibleTensorSpecs order and the
// shapes users see (no vocabulary padding), assembled from whichever rank
// files hold the pieces. For export and sampling.
Result<std::vector<std::vector<float>>> LoadWholeParams(const std::string& step_dir, const GptConfig& model);

// A checkpoint's parameters read by element range, for exporting a model
// far larger than memory: opening verifies every rank file whole (its size
// and checksum, streamed through a bounded buffer) and indexes the param
// pieces from the headers; reads then take the bytes they need with pread,
// from whichever rank files hold them (any world size).
class CheckpointParamReader {
 public:
  // DataLoss names a damaged or missing file.
  static Result<CheckpointParamReader> Open(const std::string& step_dir);

  const Manifest& manifest() const { return manifest_; }
  // Elements [begin, begin + count) of param tensor `tensor` (its whole,
  // visible form, as checkpoints name it) into dst; DataLoss where no piece
  // holds some of them.
  Status Read(const std::string& tensor, int64_t begin, int64_t count, float* dst) const;

 private:
  struct Piece {
    int file = 0;
    int64_t begin = 0, end = 0;  // tensor elements
    int64_t offset = 0;          // file offset of element `begin`
  };
  std::string step_dir_;
  Manifest manifest_;
  std::vector<RandomAccessFile> files_;
  std::map<std::string, std::vector<Piece>> pieces_;  // by tensor, sorted by begin
};

// The imported Hugging Face directory's files a checkpoint carries, by
// their names there, each verified against the manifest (DataLoss); none for
// a run that imported nothing or a checkpoint from before they were carried.
Result<std::vector<NamedFile>> ReadCheckpointModelFiles(const std::string& step_dir);

// The tokenizer's file a checkpoint carries (data.tokenizer gpt2 or hf: its
// tokenizer.json; tiktoken: its rank file), verified against its manifest;
// NotFound when its tokens were made otherwise. BpeTokenizer::FromSaved
// reads it, given the manifest's state.tokenizer.
Result<std::string> ReadCheckpointTokenizer(const std::string& step_dir);

// Fills `ranges` from one checkpoint directory, reading only the rank files
// that hold pieces of them, each verified whole against the manifest's size
// and checksum. An empty `layout_fingerprint` accepts any. FailedPrecondition
// on a fingerprint mismatch; DataLoss naming the file otherwise (including a
// missing piece, named by tensor and range). Ranges on_device are filled with
// `device` from the read buffer; InvalidArgument (CheckOwnedRanges) when one
// is on_device and `device` is null, Internal naming the file when the
// copier fails. DataLoss is the only code that means a damaged checkpoint.
Result<TrainingState> LoadCheckpointDir(const std::string& step_dir, const std::string& layout_fingerprint,
                                        const std::vector<OwnedRange>& ranges, DeviceCopier* device = nullptr);

}  // namespace pstar

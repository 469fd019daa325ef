// The training job's configuration: PatrickStar's keys (optimizer, fp16,
// default_chunk_size, release_after_init, use_cpu_embedding, client.mem_tracer)
// plus model, data and train sections. One table of keys (config.cc) drives
// the parser, the checks of each value and --print-config; parsing rejects
// unknown keys and bad values with the key path and the reason. Choices the
// rest of pstar acts on are enums from here on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/core/status.h"
#include "worker/model/compute.h"
#include "worker/model/gpt_config.h"
#include "worker/runtime/eviction_policy.h"

namespace pstar {

enum class DataSourceKind { kGenerated, kText, kTokens, kJsonl };

// What the disk tier homes (runtime.nvme_spill).
enum class DiskSpill { kAuto, kAll };
// How the optimizer's host updates overlap the step (runtime.optimizer_overlap).
enum class OptimizerOverlap { kOff, kPipeline, kSpeculate };
const char* OptimizerOverlapName(OptimizerOverlap overlap);  // "off", "pipeline" or "speculate"
// The gradients' format (train.grad_precision).
enum class GradPrecision { kFp32, k16Bit };

// The largest sizes a config may ask for: beyond them it is refused with a
// message naming the limit, before anything is planned or allocated (planning
// is arithmetic bounded by these). Far beyond any model trained today.
inline constexpr int64_t kMaxLayers = 10000;
inline constexpr int64_t kMaxEmbd = int64_t(1) << 20;
inline constexpr int64_t kMaxIntermediate = int64_t(1) << 23;
inline constexpr int64_t kMaxSeqLen = int64_t(1) << 20;
inline constexpr int64_t kMaxVocab = 2147483647;  // token ids are int32
inline constexpr double kMaxParameters = 1e13;
inline constexpr int64_t kMaxMicroBatchTokens = int64_t(1) << 24;
inline constexpr double kMaxActivationBytes = 1125899906842624.0;  // 1 PiB per micro-batch

struct ModelSection {
  std::string preset;  // empty when every shape key is given
  GptConfig gpt;
  // A Hugging Face model directory (config.json and model.safetensors or
  // its sharded form) whose weights replace the initialization; its
  // config.json describes the model (worker/ckpt/hf_config.h), and a model
  // key given beside it must agree. Empty: none.
  std::string init_from;
};

struct DataSection {
  DataSourceKind source = DataSourceKind::kGenerated;
  std::string path;                    // text file, shard file, glob or shard directory
  std::string val_path;                // validation data, read as `path` is; empty: none
  // What made (text: makes) the tokens: "byte", "gpt2", "hf", "tiktoken" or
  // "none". After parsing never empty: unset, byte for text and none
  // otherwise. gpt2 needs `vocab` + `merges` (GPT-2's encoder.json,
  // vocab.bpe) or `tokenizer_json`; hf needs `tokenizer_json` (any supported
  // model's); tiktoken needs `tokenizer_ranks` (Llama 3's rank file, Meta's
  // original/tokenizer.model). Checkpoints record it, for `pstar sample`
  // and `pstar export`.
  std::string tokenizer;
  std::string vocab, merges, tokenizer_json, tokenizer_ranks;
  // jsonl (chat and instruction examples, worker/data/chat_examples.h): the
  // chat format (auto: the one the tokenizer's special tokens name, or
  // llama3, chatml, qwen3, none) and what an example longer than a row
  // does (truncate or error).
  std::string chat_format = "auto";
  // llama3.1's "Today Date" in the system block: the template's own when a
  // renderer defines no clock (transformers gives the day it renders).
  std::string chat_date = "26 Jul 2024";
  std::string overlong = "truncate";
  int64_t generated_tokens = 1 << 21;  // size of the built-in corpus
  uint64_t seed = 1234;                // built-in corpus seed; the packed rows' order for jsonl
};

struct OptimizerSection {
  std::string type = "AdamW";  // "AdamW" (decoupled decay) or "Adam" (L2)
  float lr = 6e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  bool use_hybrid_adam = true;
};

struct Fp16Section {
  bool enabled = false;
  float loss_scale = 0.0f;  // 0 = dynamic
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  float min_loss_scale = 1.0f;
};

struct MemTracerSection {
  bool use_async_mem_monitor = true;
  double warmup_gpu_chunk_mem_ratio = 0.1;
  double overall_gpu_mem_ratio = 0.8;
  double overall_cpu_mem_ratio = 0.8;
  double margin_use_ratio = 0.8;
  bool use_fake_dist = false;
  bool with_static_partition = false;
};

// PatrickStar's client.opts, accepted so that its configs paste as they are.
// Each names what pstar always does, so none changes anything
// (docs/config.md): chunk-wise collectives in place, a fixed pool of chunk
// slots, and asynchronous moves with prefetch.
struct ClientOptsSection {
  bool with_mem_saving_comm = false;
  bool with_mem_cache = false;
  bool with_async_move = false;
};

// Where model data lives and how it moves (the chunk runtime).
struct RuntimeSection {
  ComputeDevice device = ComputeDevice::kCpu;  // cpu (device tier emulated in RAM) or cuda (GPU local_rank)
  int64_t device_memory = 0;  // bytes of the device tier; 0 = room for all model data
  int64_t host_memory = 0;    // host budget; 0 = the cgroup v2 limit, else physical RAM
  EvictionPolicy eviction = EvictionPolicy::kOpt;  // opt (farthest next use, from the trace) or lru
  int64_t prefetch_depth = 2;    // moments of lookahead; 0 = off
  // The disk tier (docs/config.md): a directory on a local disk where the
  // optimizer moments the host budget cannot hold are homed; empty = none.
  std::string nvme_path;
  // Bytes the disk tier may take there; 0 = the free space less a margin.
  int64_t nvme_memory = 0;
  // Chunks read ahead of the optimizer's sweep, and the I/O threads serving
  // the disk tier's reads and writes.
  int64_t nvme_read_ahead = 2;
  int64_t nvme_io_threads = 2;
  // What the disk tier homes: auto as much as host_memory needs (all of it
  // when host_memory is 0), all every moment and 16-bit run's master that
  // may go there, whatever the budget (the operator's pods are sized so).
  DiskSpill nvme_spill = DiskSpill::kAuto;
  // How the optimizer's host updates overlap the rest of the step: off
  // (after the gradient norm, the step waits for every update), pipeline
  // (the updates run on a thread of their own in the order the next forward
  // needs the chunks, each use waiting for its own chunk's update),
  // speculate (pipeline, and each chunk's update starts during the backward
  // pass once its gradient is final, assuming no clip and no overflow,
  // undone and redone when that was wrong). A file may say auto: speculate
  // on cuda, off on cpu (where the updates would take cores from the compute).
  OptimizerOverlap optimizer_overlap = OptimizerOverlap::kOff;
  // Host bytes for speculation's undo copies (3 shards per speculated
  // chunk); 0 = what the host budget has beyond the plan. A value is counted
  // in the plan's host minimum (and so in a pod's memory).
  int64_t undo_memory = 0;
  // With several ranks, run the chunks' all-gathers and reduce-scatters
  // under the compute (gathers queued ahead along the chunk trace, each
  // gradient reduce-scattered once final); false waits for each as it
  // starts. The results are the same either way up to reduction order.
  bool comm_overlap = true;
};

// Sharded checkpoints (docs/checkpoints.md).
struct CheckpointSection {
  std::string dir;          // empty: no checkpoints
  int64_t every_steps = 0;  // save every N steps (0: only when training ends or stops)
  int64_t keep = 3;         // newest complete checkpoints kept; 0 keeps all
  bool resume = true;       // continue from the newest usable checkpoint in dir
  // When set, rank 0 exports the final checkpoint there as a Hugging Face
  // model directory when training ends (worker/ckpt/hf_export.h), in
  // export_dtype: "auto" (the architecture's default), fp32, bf16 or fp16.
  std::string export_dir;
  std::string export_dtype = "auto";
};

// Data-parallel ranks.
struct DistSection {
  int64_t timeout_seconds = 300;  // rendezvous and every collective
};

// The Prometheus endpoint.
struct MetricsSection {
  int64_t port = 0;  // 0 = no endpoint; rank r listens on port + LOCAL_RANK
  std::string bind_address = "0.0.0.0";
  // Also label the tier series `device` (the tier label's name before 0.2,
  // which collides with DCGM's GPU label): for dashboards and queries not yet
  // moved to `tier`. Deprecated.
  bool device_label = false;
  // Also label every series `job` and `namespace` (from PSTAR_JOB_NAME and
  // PSTAR_NAMESPACE), as before 0.2; they collide with Prometheus' own target
  // labels and need honor_labels. Deprecated: the scrape target sets them.
  bool job_labels = false;
};

struct TrainSection {
  int64_t batch_size = 8;
  int64_t seq_len = 0;  // 0 = model max_seq_len
  int64_t steps = 100;
  int64_t grad_accum_steps = 1;
  uint64_t seed = 42;
  bool activation_checkpointing = false;
  int64_t log_every = 10;
  // Validation loss on data.val_path every eval_every steps (and after the
  // last); 0 = never. eval_batches micro-batches, the same ones every time.
  int64_t eval_every = 0;
  int64_t eval_batches = 20;
  // A sample of sample_tokens tokens after sample_prompt every sample_every
  // steps (0 = never), printed with the data's tokenizer (byte or gpt2).
  int64_t sample_every = 0;
  int64_t sample_tokens = 32;
  std::string sample_prompt;
  float grad_clip = 1.0f;  // 0 = off
  int64_t warmup_steps = 0;
  float min_lr = 0.0f;
  std::string lr_decay = "cosine";  // "cosine" or "constant"
  int64_t threads = 0;              // 0 = all cores
  // The linear layers' operand precision (fp32 accumulation in every case).
  // A file may say auto: fp16 when fp16.enabled, else bf16 on cuda and fp32
  // on cpu.
  Precision precision = Precision::kFp32;
  // Gradients in fp32, or 16bit: rounded to the precision's 16-bit format
  // after every op that adds to them (each op still accumulates in fp32) and
  // homed on the host at half size. A 16-bit precision only.
  GradPrecision grad_precision = GradPrecision::kFp32;
};

struct Config {
  ModelSection model;
  DataSection data;
  OptimizerSection optimizer;
  Fp16Section fp16;
  int64_t default_chunk_size = 0;  // elements per chunk; 0 = chosen by the planner
  bool release_after_init = false;
  bool use_cpu_embedding = false;
  MemTracerSection mem_tracer;
  ClientOptsSection client_opts;
  RuntimeSection runtime;
  CheckpointSection checkpoint;
  DistSection dist;
  MetricsSection metrics;
  TrainSection train;
};

struct ConfigOptions {
  // Whether model.init_from's config.json is read (and describes the model).
  // Off where the directory is not at hand (the operator, which sizes pods
  // before a rank reads it): the config must then describe the model itself,
  // and the worker checks it against the directory.
  bool read_init_from = true;
};

// Parses YAML text; `source_name` prefixes every error ("job.yaml: model.n_head: ...").
// `overrides` are "dotted.key=yaml-value" pairs applied before validation.
Result<Config> ParseConfig(const std::string& yaml, const std::string& source_name,
                           const std::vector<std::string>& overrides = {}, const ConfigOptions& options = {});

// Reads and parses a config file.
Result<Config> LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides = {});

// The embedded default job (examples/default.yaml, built in).
const std::string& DefaultConfigYaml();

// The config as YAML, every key with its effective value (those that only
// apply with others, e.g. data.path, when they do).
std::string ConfigToYaml(const Config& config);

// Every key the parser takes, dotted, in the order ConfigToYaml writes them.
std::vector<std::string> ConfigKeyPaths();

}  // namespace pstar

#include "worker/config/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "kernels/attention.h"
#include "worker/core/bytes.h"
#include "worker/core/file_util.h"

namespace pstar {

namespace {

// Thrown inside the parser and turned into a Status at the boundary.
struct ConfigError {
  std::string message;
};

[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw ConfigError{path + ": " + what};
}

std::string Describe(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

// A mapping node whose keys are checked against the ones read from it.
class Section {
 public:
  Section(YAML::Node node, std::string path) : node_(std::move(node)), path_(std::move(path)) {
    if (node_ && !node_.IsNull() && !node_.IsMap()) Fail(path_.empty() ? "config" : path_, "expected a mapping, got " + Describe(node_));
    // YAML parsers keep the first of duplicate keys; a config with two
    // values for one key is refused instead of half-read.
    if (node_ && node_.IsMap()) {
      std::set<std::string> seen;
      for (const auto& kv : node_) {
        const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : Describe(kv.first);
        if (!seen.insert(k).second) Fail(Key(k), "appears twice in the mapping");
      }
    }
  }

  std::string Key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  const std::string& path() const { return path_; }

  YAML::Node Get(const std::string& k) {
    known_.insert(k);
    if (!node_ || node_.IsNull()) return YAML::Node();
    return node_[k];
  }

  bool Has(const std::string& k) {
    YAML::Node n = Get(k);
    return n && !n.IsNull();
  }

  Section Child(const std::string& k) { return Section(Get(k), Key(k)); }

  template <typename T>
  void Read(const std::string& k, T& out) {
    YAML::Node n = Get(k);
    if (!n || !node_ || node_.IsNull()) return;  // absent (or its whole section is)
    // `key: ~`, `key:` or `--set key=`: a value was meant but none given;
    // falling back to the default would hide it.
    if (n.IsNull()) Fail(Key(k), "has no value; give one (\"\" for an empty string) or leave the key out");
    if (!n.IsScalar()) Fail(Key(k), "expected a scalar, got " + Describe(n));
    try {
      out = n.as<T>();
    } catch (const YAML::Exception&) {
      Fail(Key(k), "expected " + TypeName<T>() + ", got " + Describe(n));
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(out)) Fail(Key(k), "must be a finite number, got " + Describe(n));
    }
  }

  // Rejects every key that no Get() asked for.
  void CheckNoUnknownKeys() const {
    if (!node_ || !node_.IsMap()) return;
    for (const auto& kv : node_) {
      std::string k = kv.first.as<std::string>();
      if (!known_.count(k)) {
        std::string allowed;
        for (const auto& a : known_) allowed += (allowed.empty() ? "" : ", ") + a;
        Fail(Key(k), "unknown key (allowed here: " + allowed + ")");
      }
    }
  }

 private:
  template <typename T>
  static std::string TypeName() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else return "a string";
  }

  YAML::Node node_;
  std::string path_;
  std::set<std::string> known_;
};

// The shortest text that reads back as the same value (0.003, not
// 0.00300000003): what --print-config shows for a number.
template <typename T>
std::string Shortest(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// At most `limit`, or the key is refused naming the limit (what pstar can
// plan, allocate and index; checked before anything is sized).
void RequireAtMost(const std::string& key, int64_t v, int64_t limit, const std::string& what) {
  if (v > limit) Fail(key, "is " + std::to_string(v) + ", more than the " + std::to_string(limit) + " " + what);
}

template <typename T>
void RequirePositive(const std::string& key, T v) {
  if (!(v > 0)) {
    std::ostringstream ss;
    ss << "must be positive, got " << v;
    Fail(key, ss.str());
  }
}

template <typename T>
void RequireNonNegative(const std::string& key, T v) {
  if (v < 0) {
    std::ostringstream ss;
    ss << "must not be negative, got " << v;
    Fail(key, ss.str());
  }
}

void RequireRatio(const std::string& key, double v, bool allow_zero) {
  if (v > 1.0 || v < 0.0 || (!allow_zero && v == 0.0)) {
    std::ostringstream ss;
    ss << "must be in " << (allow_zero ? "[0, 1]" : "(0, 1]") << ", got " << v;
    Fail(key, ss.str());
  }
}

void ParseModel(Section s, ModelSection& m) {
  s.Read("preset", m.preset);
  if (!m.preset.empty()) {
    auto preset = FindGptPreset(m.preset);
    if (!preset) {
      std::string names;
      for (const auto& p : GptPresets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
      Fail(s.Key("preset"), "unknown preset '" + m.preset + "' (known: " + names + ")");
    }
    m.gpt = *preset;
  }
  s.Read("n_layer", m.gpt.n_layer);
  s.Read("n_head", m.gpt.n_head);
  s.Read("n_embd", m.gpt.n_embd);
  s.Read("vocab_size", m.gpt.vocab_size);
  s.Read("max_seq_len", m.gpt.max_seq_len);
  s.Read("init_from", m.init_from);
  s.CheckNoUnknownKeys();
  RequirePositive(s.Key("n_layer"), m.gpt.n_layer);
  RequirePositive(s.Key("n_head"), m.gpt.n_head);
  RequirePositive(s.Key("n_embd"), m.gpt.n_embd);
  RequirePositive(s.Key("vocab_size"), m.gpt.vocab_size);
  RequirePositive(s.Key("max_seq_len"), m.gpt.max_seq_len);
  RequireAtMost(s.Key("n_layer"), m.gpt.n_layer, kMaxLayers, "layers pstar takes");
  RequireAtMost(s.Key("n_embd"), m.gpt.n_embd, kMaxEmbd, "channels pstar takes");
  RequireAtMost(s.Key("max_seq_len"), m.gpt.max_seq_len, kMaxSeqLen, "positions pstar takes");
  RequireAtMost(s.Key("vocab_size"), m.gpt.vocab_size, kMaxVocab, "tokens pstar takes (int32 token ids)");
  if (m.gpt.n_embd % m.gpt.n_head != 0) {
    Fail(s.Key("n_head"), std::to_string(m.gpt.n_head) + " does not divide n_embd " +
                              std::to_string(m.gpt.n_embd));
  }
  // Each bound alone still allows absurd products: the parameter count, in
  // floating point so that it cannot overflow.
  const double params = m.gpt.NumParametersApprox();
  if (params > kMaxParameters) {
    std::ostringstream ss;
    ss << "has " << params << " parameters, more than the " << kMaxParameters << " pstar takes";
    Fail(s.path(), ss.str());
  }
}

void ParseData(Section s, DataSection& d) {
  std::string source = "generated";
  s.Read("source", source);
  if (source == "generated") d.source = DataSourceKind::kGenerated;
  else if (source == "text") d.source = DataSourceKind::kText;
  else if (source == "tokens") d.source = DataSourceKind::kTokens;
  else Fail(s.Key("source"), "must be generated, text or tokens, got '" + source + "'");
  s.Read("path", d.path);
  s.Read("val_path", d.val_path);
  s.Read("tokenizer", d.tokenizer);
  s.Read("vocab", d.vocab);
  s.Read("merges", d.merges);
  s.Read("tokenizer_json", d.tokenizer_json);
  s.Read("generated_tokens", d.generated_tokens);
  s.Read("seed", d.seed);
  s.CheckNoUnknownKeys();
  RequirePositive(s.Key("generated_tokens"), d.generated_tokens);
  if (d.source != DataSourceKind::kGenerated && d.path.empty()) {
    Fail(s.Key("path"), "is required when data.source is " + source);
  }
  if (d.source == DataSourceKind::kGenerated && !d.path.empty()) {
    Fail(s.Key("path"), "is not used by the generated corpus (set data.source to text or tokens)");
  }
  if (d.source == DataSourceKind::kGenerated && !d.val_path.empty()) {
    Fail(s.Key("val_path"), "needs data.source text or tokens (the generated corpus has no validation split)");
  }
  if (d.tokenizer.empty()) d.tokenizer = d.source == DataSourceKind::kText ? "byte" : "none";
  if (d.tokenizer != "byte" && d.tokenizer != "gpt2" && d.tokenizer != "none") {
    Fail(s.Key("tokenizer"), "must be byte, gpt2 or none, got '" + d.tokenizer + "'");
  }
  if (d.source == DataSourceKind::kGenerated && d.tokenizer != "none") {
    Fail(s.Key("tokenizer"), "is " + d.tokenizer + " but the generated corpus has no text (leave it unset)");
  }
  if (d.source == DataSourceKind::kText && d.tokenizer == "none") {
    Fail(s.Key("tokenizer"), "is none but data.source text needs one (byte or gpt2)");
  }
  const bool files = !d.vocab.empty() || !d.merges.empty() || !d.tokenizer_json.empty();
  if (d.tokenizer != "gpt2" && files) {
    Fail(s.Key("tokenizer"), "is " + d.tokenizer + " but data.vocab, data.merges or data.tokenizer_json is set (they need gpt2)");
  }
  if (d.tokenizer == "gpt2") {
    if (!d.tokenizer_json.empty() && (!d.vocab.empty() || !d.merges.empty())) {
      Fail(s.Key("tokenizer_json"), "and data.vocab/data.merges are both set; give one form");
    }
    if (d.tokenizer_json.empty() && (d.vocab.empty() || d.merges.empty())) {
      Fail(s.Key("tokenizer"), "is gpt2 but needs data.vocab and data.merges (encoder.json, vocab.bpe) or data.tokenizer_json");
    }
  }
}

void ParseOptimizer(Section s, OptimizerSection& o) {
  s.Read("type", o.type);
  if (o.type != "Adam" && o.type != "AdamW") {
    Fail(s.Key("type"), "must be Adam or AdamW, got '" + o.type + "'");
  }
  Section p = s.Child("params");
  p.Read("lr", o.lr);
  YAML::Node betas = p.Get("betas");
  if (betas && !betas.IsNull()) {
    if (!betas.IsSequence() || betas.size() != 2) Fail(p.Key("betas"), "expected a list of two numbers");
    try {
      o.beta1 = betas[0].as<float>();
      o.beta2 = betas[1].as<float>();
    } catch (const YAML::Exception&) {
      Fail(p.Key("betas"), "expected a list of two numbers");
    }
  }
  p.Read("eps", o.eps);
  p.Read("weight_decay", o.weight_decay);
  p.Read("use_hybrid_adam", o.use_hybrid_adam);
  p.CheckNoUnknownKeys();
  s.CheckNoUnknownKeys();
  RequirePositive(p.Key("lr"), o.lr);
  if (!(o.beta1 >= 0 && o.beta1 < 1)) Fail(p.Key("betas"), "beta1 must be in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) Fail(p.Key("betas"), "beta2 must be in [0, 1)");
  RequirePositive(p.Key("eps"), o.eps);
  RequireNonNegative(p.Key("weight_decay"), o.weight_decay);
}

void ParseFp16(Section s, Fp16Section& f) {
  s.Read("enabled", f.enabled);
  s.Read("loss_scale", f.loss_scale);
  s.Read("initial_scale_power", f.initial_scale_power);
  s.Read("loss_scale_window", f.loss_scale_window);
  s.Read("hysteresis", f.hysteresis);
  s.Read("min_loss_scale", f.min_loss_scale);
  s.CheckNoUnknownKeys();
  RequireNonNegative(s.Key("loss_scale"), f.loss_scale);
  RequireNonNegative(s.Key("initial_scale_power"), f.initial_scale_power);
  if (f.initial_scale_power > 63) Fail(s.Key("initial_scale_power"), "must be at most 63");
  RequirePositive(s.Key("loss_scale_window"), f.loss_scale_window);
  RequirePositive(s.Key("hysteresis"), f.hysteresis);
  RequirePositive(s.Key("min_loss_scale"), f.min_loss_scale);
}

void ParseMemTracer(Section s, MemTracerSection& m) {
  s.Read("use_async_mem_monitor", m.use_async_mem_monitor);
  s.Read("warmup_gpu_chunk_mem_ratio", m.warmup_gpu_chunk_mem_ratio);
  s.Read("overall_gpu_mem_ratio", m.overall_gpu_mem_ratio);
  s.Read("overall_cpu_mem_ratio", m.overall_cpu_mem_ratio);
  s.Read("margin_use_ratio", m.margin_use_ratio);
  s.Read("use_fake_dist", m.use_fake_dist);
  s.Read("with_static_partition", m.with_static_partition);
  s.CheckNoUnknownKeys();
  RequireRatio(s.Key("warmup_gpu_chunk_mem_ratio"), m.warmup_gpu_chunk_mem_ratio, false);
  RequireRatio(s.Key("overall_gpu_mem_ratio"), m.overall_gpu_mem_ratio, false);
  RequireRatio(s.Key("overall_cpu_mem_ratio"), m.overall_cpu_mem_ratio, false);
  RequireRatio(s.Key("margin_use_ratio"), m.margin_use_ratio, true);
}

// Lookahead beyond a few thousand moments (a whole step of a large model) buys nothing.
constexpr int64_t kMaxPrefetchDepth = 100000;
// Each chunk read ahead holds a host window of one shard per kind on the
// disk; past a few the windows cost more host memory than the overlap gains.
constexpr int64_t kMaxDiskReadAhead = 16;
// Past the drive's queue depth more threads only wait.
constexpr int64_t kMaxDiskIoThreads = 64;

int64_t ReadBytes(Section& s, const std::string& k, int64_t fallback) {
  YAML::Node n = s.Get(k);
  if (!n || n.IsNull()) return fallback;
  if (!n.IsScalar()) Fail(s.Key(k), "expected a byte count, got " + Describe(n));
  auto bytes = ParseBytes(n.Scalar());
  if (!bytes.ok()) Fail(s.Key(k), bytes.status().message());
  return *bytes;
}

void ParseRuntime(Section s, RuntimeSection& r) {
  s.Read("device", r.device);
  r.device_memory = ReadBytes(s, "device_memory", r.device_memory);
  r.host_memory = ReadBytes(s, "host_memory", r.host_memory);
  s.Read("eviction", r.eviction);
  s.Read("prefetch_depth", r.prefetch_depth);
  s.Read("nvme_path", r.nvme_path);
  r.nvme_memory = ReadBytes(s, "nvme_memory", r.nvme_memory);
  s.Read("nvme_read_ahead", r.nvme_read_ahead);
  s.Read("nvme_io_threads", r.nvme_io_threads);
  s.Read("nvme_spill", r.nvme_spill);
  s.Read("optimizer_overlap", r.optimizer_overlap);
  r.undo_memory = ReadBytes(s, "undo_memory", r.undo_memory);
  s.Read("comm_overlap", r.comm_overlap);
  s.CheckNoUnknownKeys();
  if (r.optimizer_overlap != "auto" && r.optimizer_overlap != "off" && r.optimizer_overlap != "pipeline" &&
      r.optimizer_overlap != "speculate") {
    Fail(s.Key("optimizer_overlap"), "must be auto, off, pipeline or speculate, got '" + r.optimizer_overlap + "'");
  }
  if (r.undo_memory > 0 && r.optimizer_overlap != "auto" && r.optimizer_overlap != "speculate") {
    Fail(s.Key("undo_memory"), "is set but runtime.optimizer_overlap is " + r.optimizer_overlap +
                                   " (undo copies are for speculate)");
  }
  if (r.nvme_memory > 0 && r.nvme_path.empty()) {
    Fail(s.Key("nvme_memory"), "is set but runtime.nvme_path (the disk tier's directory) is not");
  }
  // A config written out with its defaults (--print-config) carries both
  // settings; only a value other than the default asks for a disk tier.
  const RuntimeSection defaults;
  if (r.nvme_path.empty() && r.nvme_read_ahead != defaults.nvme_read_ahead) {
    Fail(s.Key("nvme_read_ahead"), "is set but runtime.nvme_path (the disk tier's directory) is not");
  }
  if (r.nvme_path.empty() && r.nvme_io_threads != defaults.nvme_io_threads) {
    Fail(s.Key("nvme_io_threads"), "is set but runtime.nvme_path (the disk tier's directory) is not");
  }
  if (r.nvme_spill != "auto" && r.nvme_spill != "all") {
    Fail(s.Key("nvme_spill"), "must be auto or all, got '" + r.nvme_spill + "'");
  }
  if (r.nvme_path.empty() && r.nvme_spill != defaults.nvme_spill) {
    Fail(s.Key("nvme_spill"), "is set but runtime.nvme_path (the disk tier's directory) is not");
  }
  RequireNonNegative(s.Key("nvme_read_ahead"), r.nvme_read_ahead);
  if (r.nvme_read_ahead > kMaxDiskReadAhead) {
    Fail(s.Key("nvme_read_ahead"), "must be at most " + std::to_string(kMaxDiskReadAhead) + ", got " +
                                       std::to_string(r.nvme_read_ahead));
  }
  RequirePositive(s.Key("nvme_io_threads"), r.nvme_io_threads);
  if (r.nvme_io_threads > kMaxDiskIoThreads) {
    Fail(s.Key("nvme_io_threads"), "must be at most " + std::to_string(kMaxDiskIoThreads) + ", got " +
                                       std::to_string(r.nvme_io_threads));
  }
  if (r.device != "cpu" && r.device != "cuda") {
    Fail(s.Key("device"), "must be cpu or cuda, got '" + r.device + "'");
  }
  if (r.eviction != "opt" && r.eviction != "lru") {
    Fail(s.Key("eviction"), "must be opt or lru, got '" + r.eviction + "'");
  }
  RequireNonNegative(s.Key("prefetch_depth"), r.prefetch_depth);
  if (r.prefetch_depth > kMaxPrefetchDepth) {
    Fail(s.Key("prefetch_depth"), "must be at most " + std::to_string(kMaxPrefetchDepth) + ", got " +
                                      std::to_string(r.prefetch_depth));
  }
}

void ParseCheckpoint(Section s, CheckpointSection& c) {
  s.Read("dir", c.dir);
  s.Read("every_steps", c.every_steps);
  s.Read("keep", c.keep);
  s.Read("resume", c.resume);
  s.CheckNoUnknownKeys();
  RequireNonNegative(s.Key("every_steps"), c.every_steps);
  RequireNonNegative(s.Key("keep"), c.keep);
}

void ParseDist(Section s, DistSection& d) {
  s.Read("timeout_seconds", d.timeout_seconds);
  s.CheckNoUnknownKeys();
  RequirePositive(s.Key("timeout_seconds"), d.timeout_seconds);
}

void ParseMetrics(Section s, MetricsSection& m) {
  s.Read("port", m.port);
  s.Read("bind_address", m.bind_address);
  s.Read("device_label", m.device_label);
  s.Read("job_labels", m.job_labels);
  s.CheckNoUnknownKeys();
  if (m.port < 0 || m.port > 65535) Fail(s.Key("port"), "must be in [0, 65535], got " + std::to_string(m.port));
  if (m.bind_address.empty()) Fail(s.Key("bind_address"), "must not be empty");
}

void ParseTrain(Section s, TrainSection& t, const GptConfig& g) {
  s.Read("batch_size", t.batch_size);
  s.Read("seq_len", t.seq_len);
  s.Read("steps", t.steps);
  s.Read("grad_accum_steps", t.grad_accum_steps);
  s.Read("seed", t.seed);
  s.Read("activation_checkpointing", t.activation_checkpointing);
  s.Read("log_every", t.log_every);
  s.Read("eval_every", t.eval_every);
  s.Read("eval_batches", t.eval_batches);
  s.Read("sample_every", t.sample_every);
  s.Read("sample_tokens", t.sample_tokens);
  s.Read("sample_prompt", t.sample_prompt);
  s.Read("grad_clip", t.grad_clip);
  s.Read("warmup_steps", t.warmup_steps);
  s.Read("min_lr", t.min_lr);
  s.Read("lr_decay", t.lr_decay);
  s.Read("threads", t.threads);
  s.Read("precision", t.precision);
  s.Read("grad_precision", t.grad_precision);
  s.CheckNoUnknownKeys();
  if (t.grad_precision != "fp32" && t.grad_precision != "16bit") {
    Fail(s.Key("grad_precision"), "must be fp32 or 16bit, got '" + t.grad_precision + "'");
  }
  if (t.precision != "auto" && t.precision != "fp32" && t.precision != "bf16" && t.precision != "fp16") {
    Fail(s.Key("precision"), "must be auto, fp32, bf16 or fp16, got '" + t.precision + "'");
  }
  RequirePositive(s.Key("batch_size"), t.batch_size);
  RequireNonNegative(s.Key("seq_len"), t.seq_len);
  if (t.seq_len == 0) t.seq_len = g.max_seq_len;
  if (t.seq_len > g.max_seq_len) {
    Fail(s.Key("seq_len"), std::to_string(t.seq_len) + " exceeds model.max_seq_len " +
                               std::to_string(g.max_seq_len));
  }
  RequireAtMost(s.Key("batch_size"), t.batch_size, kMaxMicroBatchTokens, "sequences pstar takes");
  if (t.batch_size * t.seq_len > kMaxMicroBatchTokens) {
    Fail(s.Key("batch_size"), "times seq_len is " + std::to_string(t.batch_size * t.seq_len) +
                                  " tokens per micro-batch, more than the " + std::to_string(kMaxMicroBatchTokens) +
                                  " pstar takes");
  }
  // A micro-batch's activations, roughly (16 values of C per token and
  // layer), in floating point: bounded before any plan adds them up.
  const double activation_bytes = 4.0 * double(t.batch_size * t.seq_len) * double(g.n_embd) * (16.0 * double(g.n_layer) + 8.0);
  if (activation_bytes > kMaxActivationBytes) {
    std::ostringstream ss;
    ss << "with this model needs about " << activation_bytes << " bytes of activations per micro-batch, more than the "
       << kMaxActivationBytes << " pstar takes";
    Fail(s.Key("batch_size"), ss.str());
  }
  RequirePositive(s.Key("steps"), t.steps);
  RequirePositive(s.Key("grad_accum_steps"), t.grad_accum_steps);
  RequirePositive(s.Key("log_every"), t.log_every);
  RequireNonNegative(s.Key("eval_every"), t.eval_every);
  RequirePositive(s.Key("eval_batches"), t.eval_batches);
  RequireAtMost(s.Key("eval_batches"), t.eval_batches, int64_t(1) << 20, "validation micro-batches pstar takes");
  RequireNonNegative(s.Key("sample_every"), t.sample_every);
  RequirePositive(s.Key("sample_tokens"), t.sample_tokens);
  RequireAtMost(s.Key("sample_tokens"), t.sample_tokens, 4096, "sampled tokens pstar takes");
  RequireNonNegative(s.Key("grad_clip"), t.grad_clip);
  RequireNonNegative(s.Key("warmup_steps"), t.warmup_steps);
  RequireNonNegative(s.Key("min_lr"), t.min_lr);
  RequireNonNegative(s.Key("threads"), t.threads);
  if (t.lr_decay != "cosine" && t.lr_decay != "constant") {
    Fail(s.Key("lr_decay"), "must be cosine or constant, got '" + t.lr_decay + "'");
  }
}

Config ParseRoot(const YAML::Node& root) {
  Config c;
  Section s(root, "");
  // Model first: the train section checks seq_len against it.
  if (!s.Has("model")) Fail("model", "section is required");
  ParseModel(s.Child("model"), c.model);
  ParseData(s.Child("data"), c.data);
  ParseOptimizer(s.Child("optimizer"), c.optimizer);
  ParseFp16(s.Child("fp16"), c.fp16);
  s.Read("default_chunk_size", c.default_chunk_size);
  RequireNonNegative("default_chunk_size", c.default_chunk_size);
  s.Read("release_after_init", c.release_after_init);
  s.Read("use_cpu_embedding", c.use_cpu_embedding);
  Section client = s.Child("client");
  ParseMemTracer(client.Child("mem_tracer"), c.mem_tracer);
  {
    Section opts = client.Child("opts");
    opts.Read("with_mem_saving_comm", c.client_opts.with_mem_saving_comm);
    opts.Read("with_mem_cache", c.client_opts.with_mem_cache);
    opts.Read("with_async_move", c.client_opts.with_async_move);
    opts.CheckNoUnknownKeys();
  }
  client.CheckNoUnknownKeys();
  ParseRuntime(s.Child("runtime"), c.runtime);
  ParseCheckpoint(s.Child("checkpoint"), c.checkpoint);
  ParseDist(s.Child("dist"), c.dist);
  ParseMetrics(s.Child("metrics"), c.metrics);
  ParseTrain(s.Child("train"), c.train, c.model.gpt);
  s.CheckNoUnknownKeys();
  // PatrickStar's fp16.enabled means fp16 linear layers with the loss scaler.
  if (c.fp16.enabled && c.train.precision != "auto" && c.train.precision != "fp16") {
    Fail("train.precision", "is " + c.train.precision + " but fp16.enabled is true");
  }
  if (c.runtime.optimizer_overlap == "auto") {
    c.runtime.optimizer_overlap = c.runtime.device == "cuda" ? "speculate" : "off";
  }
  if (c.runtime.undo_memory > 0 && c.runtime.optimizer_overlap != "speculate") {
    Fail("runtime.undo_memory", "is set but runtime.optimizer_overlap is " + c.runtime.optimizer_overlap +
                                    " (undo copies are for speculate)");
  }
  if (c.train.precision == "auto") {
    c.train.precision = c.fp16.enabled ? "fp16" : c.runtime.device == "cuda" ? "bf16" : "fp32";
  }
  if (c.train.grad_precision == "16bit" && c.train.precision == "fp32") {
    Fail("train.grad_precision", "is 16bit but train.precision is fp32 (16-bit gradients take bf16 or fp16)");
  }
  if (c.optimizer.lr < c.train.min_lr) Fail("train.min_lr", "is larger than optimizer.params.lr");
  if (c.train.sample_every > 0 && c.data.tokenizer == "none") {
    Fail("train.sample_every", "needs a tokenizer to print the sample (data.tokenizer byte or gpt2)");
  }
  if (c.train.sample_every > 0 && c.data.tokenizer == "byte" && c.train.sample_prompt.empty()) {
    Fail("train.sample_prompt", "must not be empty with byte-level text (there is no start token)");
  }
  if (c.train.eval_every > 0 && c.data.val_path.empty()) {
    Fail("train.eval_every", "is " + std::to_string(c.train.eval_every) + " but data.val_path is not set");
  }
  if (c.runtime.device == "cuda" && c.model.gpt.n_head > 0 &&
      c.model.gpt.n_embd / c.model.gpt.n_head > kernels::kMaxGpuAttentionHeadSize) {
    Fail("model.n_head", "gives a head size of " + std::to_string(c.model.gpt.n_embd / c.model.gpt.n_head) +
                             " (n_embd / n_head); runtime.device cuda takes at most " +
                             std::to_string(kernels::kMaxGpuAttentionHeadSize));
  }
  return c;
}

void SetPath(YAML::Node node, const std::vector<std::string>& parts, size_t i, const YAML::Node& value) {
  if (i + 1 == parts.size()) {
    node[parts[i]] = value;
    return;
  }
  if (!node[parts[i]] || !node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
  SetPath(node[parts[i]], parts, i + 1, value);
}

void ApplyOverride(YAML::Node& root, const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) Fail("--set " + assignment, "expected key.path=value");
  std::string key = assignment.substr(0, eq);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) Fail("--set " + assignment, "empty key component");
    parts.push_back(part);
  }
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    Fail("--set " + assignment, "value is not valid YAML: " + e.msg);
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) Fail("config", "top level must be a mapping");
  SetPath(root, parts, 0, value);
}

}  // namespace

Result<Config> ParseConfig(const std::string& yaml, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    return Status::InvalidArgument(source_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                                   std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(source_name + ": YAML error: " + e.msg);
  }
  if (root && !root.IsNull() && !root.IsMap()) {
    return Status::InvalidArgument(source_name + ": top level must be a mapping, got " + Describe(root));
  }
  try {
    for (const auto& o : overrides) ApplyOverride(root, o);
    return ParseRoot(root);
  } catch (const ConfigError& e) {
    return Status::InvalidArgument(source_name + ": " + e.message);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(source_name + ": " + e.msg);
  }
}

Result<Config> LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides) {
  auto text = ReadFile(path);
  if (!text.ok()) return Status::InvalidArgument("config " + text.status().message());
  if (text->empty()) return Status::InvalidArgument(path + ": config file is empty");
  return ParseConfig(*text, path, overrides);
}

std::string ConfigToYaml(const Config& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (!c.model.preset.empty()) e << YAML::Key << "preset" << YAML::Value << c.model.preset;
  e << YAML::Key << "n_layer" << YAML::Value << c.model.gpt.n_layer;
  e << YAML::Key << "n_head" << YAML::Value << c.model.gpt.n_head;
  e << YAML::Key << "n_embd" << YAML::Value << c.model.gpt.n_embd;
  e << YAML::Key << "vocab_size" << YAML::Value << c.model.gpt.vocab_size;
  e << YAML::Key << "max_seq_len" << YAML::Value << c.model.gpt.max_seq_len;
  if (!c.model.init_from.empty()) e << YAML::Key << "init_from" << YAML::Value << c.model.init_from;
  e << YAML::EndMap;
  e << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  const char* src = c.data.source == DataSourceKind::kGenerated ? "generated"
                    : c.data.source == DataSourceKind::kText   ? "text"
                                                               : "tokens";
  e << YAML::Key << "source" << YAML::Value << src;
  if (!c.data.path.empty()) e << YAML::Key << "path" << YAML::Value << c.data.path;
  if (!c.data.val_path.empty()) e << YAML::Key << "val_path" << YAML::Value << c.data.val_path;
  e << YAML::Key << "tokenizer" << YAML::Value << c.data.tokenizer;
  if (!c.data.vocab.empty()) e << YAML::Key << "vocab" << YAML::Value << c.data.vocab;
  if (!c.data.merges.empty()) e << YAML::Key << "merges" << YAML::Value << c.data.merges;
  if (!c.data.tokenizer_json.empty()) e << YAML::Key << "tokenizer_json" << YAML::Value << c.data.tokenizer_json;
  if (c.data.source == DataSourceKind::kGenerated) {
    e << YAML::Key << "generated_tokens" << YAML::Value << c.data.generated_tokens;
    e << YAML::Key << "seed" << YAML::Value << c.data.seed;
  }
  e << YAML::EndMap;
  e << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "type" << YAML::Value << c.optimizer.type;
  e << YAML::Key << "params" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "lr" << YAML::Value << Shortest(c.optimizer.lr);
  e << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq << Shortest(c.optimizer.beta1)
    << Shortest(c.optimizer.beta2) << YAML::EndSeq;
  e << YAML::Key << "eps" << YAML::Value << Shortest(c.optimizer.eps);
  e << YAML::Key << "weight_decay" << YAML::Value << Shortest(c.optimizer.weight_decay);
  e << YAML::Key << "use_hybrid_adam" << YAML::Value << c.optimizer.use_hybrid_adam;
  e << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "fp16" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "enabled" << YAML::Value << c.fp16.enabled;
  e << YAML::Key << "loss_scale" << YAML::Value << Shortest(c.fp16.loss_scale);
  e << YAML::Key << "initial_scale_power" << YAML::Value << c.fp16.initial_scale_power;
  e << YAML::Key << "loss_scale_window" << YAML::Value << c.fp16.loss_scale_window;
  e << YAML::Key << "hysteresis" << YAML::Value << c.fp16.hysteresis;
  e << YAML::Key << "min_loss_scale" << YAML::Value << Shortest(c.fp16.min_loss_scale);
  e << YAML::EndMap;
  e << YAML::Key << "default_chunk_size" << YAML::Value << c.default_chunk_size;
  e << YAML::Key << "release_after_init" << YAML::Value << c.release_after_init;
  e << YAML::Key << "use_cpu_embedding" << YAML::Value << c.use_cpu_embedding;
  e << YAML::Key << "client" << YAML::Value << YAML::BeginMap << YAML::Key << "mem_tracer"
    << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "use_async_mem_monitor" << YAML::Value << c.mem_tracer.use_async_mem_monitor;
  e << YAML::Key << "warmup_gpu_chunk_mem_ratio" << YAML::Value << Shortest(c.mem_tracer.warmup_gpu_chunk_mem_ratio);
  e << YAML::Key << "overall_gpu_mem_ratio" << YAML::Value << Shortest(c.mem_tracer.overall_gpu_mem_ratio);
  e << YAML::Key << "overall_cpu_mem_ratio" << YAML::Value << Shortest(c.mem_tracer.overall_cpu_mem_ratio);
  e << YAML::Key << "margin_use_ratio" << YAML::Value << Shortest(c.mem_tracer.margin_use_ratio);
  e << YAML::Key << "use_fake_dist" << YAML::Value << c.mem_tracer.use_fake_dist;
  e << YAML::Key << "with_static_partition" << YAML::Value << c.mem_tracer.with_static_partition;
  e << YAML::EndMap;
  e << YAML::Key << "opts" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "with_mem_saving_comm" << YAML::Value << c.client_opts.with_mem_saving_comm;
  e << YAML::Key << "with_mem_cache" << YAML::Value << c.client_opts.with_mem_cache;
  e << YAML::Key << "with_async_move" << YAML::Value << c.client_opts.with_async_move;
  e << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "runtime" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "device" << YAML::Value << c.runtime.device;
  e << YAML::Key << "device_memory" << YAML::Value << c.runtime.device_memory;
  e << YAML::Key << "host_memory" << YAML::Value << c.runtime.host_memory;
  e << YAML::Key << "eviction" << YAML::Value << c.runtime.eviction;
  e << YAML::Key << "prefetch_depth" << YAML::Value << c.runtime.prefetch_depth;
  e << YAML::Key << "nvme_path" << YAML::Value << c.runtime.nvme_path;
  e << YAML::Key << "nvme_memory" << YAML::Value << c.runtime.nvme_memory;
  e << YAML::Key << "nvme_read_ahead" << YAML::Value << c.runtime.nvme_read_ahead;
  e << YAML::Key << "nvme_io_threads" << YAML::Value << c.runtime.nvme_io_threads;
  e << YAML::Key << "nvme_spill" << YAML::Value << c.runtime.nvme_spill;
  e << YAML::Key << "optimizer_overlap" << YAML::Value << c.runtime.optimizer_overlap;
  e << YAML::Key << "undo_memory" << YAML::Value << c.runtime.undo_memory;
  e << YAML::Key << "comm_overlap" << YAML::Value << c.runtime.comm_overlap;
  e << YAML::EndMap;
  e << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "dir" << YAML::Value << c.checkpoint.dir;
  e << YAML::Key << "every_steps" << YAML::Value << c.checkpoint.every_steps;
  e << YAML::Key << "keep" << YAML::Value << c.checkpoint.keep;
  e << YAML::Key << "resume" << YAML::Value << c.checkpoint.resume;
  e << YAML::EndMap;
  e << YAML::Key << "dist" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "timeout_seconds" << YAML::Value << c.dist.timeout_seconds;
  e << YAML::EndMap;
  e << YAML::Key << "metrics" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "port" << YAML::Value << c.metrics.port;
  e << YAML::Key << "bind_address" << YAML::Value << c.metrics.bind_address;
  e << YAML::Key << "device_label" << YAML::Value << c.metrics.device_label;
  e << YAML::Key << "job_labels" << YAML::Value << c.metrics.job_labels;
  e << YAML::EndMap;
  e << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "batch_size" << YAML::Value << c.train.batch_size;
  e << YAML::Key << "seq_len" << YAML::Value << c.train.seq_len;
  e << YAML::Key << "steps" << YAML::Value << c.train.steps;
  e << YAML::Key << "grad_accum_steps" << YAML::Value << c.train.grad_accum_steps;
  e << YAML::Key << "seed" << YAML::Value << c.train.seed;
  e << YAML::Key << "activation_checkpointing" << YAML::Value << c.train.activation_checkpointing;
  e << YAML::Key << "log_every" << YAML::Value << c.train.log_every;
  e << YAML::Key << "eval_every" << YAML::Value << c.train.eval_every;
  e << YAML::Key << "eval_batches" << YAML::Value << c.train.eval_batches;
  e << YAML::Key << "sample_every" << YAML::Value << c.train.sample_every;
  e << YAML::Key << "sample_tokens" << YAML::Value << c.train.sample_tokens;
  e << YAML::Key << "sample_prompt" << YAML::Value << c.train.sample_prompt;
  e << YAML::Key << "grad_clip" << YAML::Value << Shortest(c.train.grad_clip);
  e << YAML::Key << "warmup_steps" << YAML::Value << c.train.warmup_steps;
  e << YAML::Key << "min_lr" << YAML::Value << Shortest(c.train.min_lr);
  e << YAML::Key << "lr_decay" << YAML::Value << c.train.lr_decay;
  e << YAML::Key << "threads" << YAML::Value << c.train.threads;
  e << YAML::Key << "precision" << YAML::Value << c.train.precision;
  e << YAML::Key << "grad_precision" << YAML::Value << c.train.grad_precision;
  e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace pstar

#include "worker/config/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "kernels/attention.h"
#include "worker/core/bytes.h"
#include "worker/ckpt/hf_config.h"
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

  // The value of key `k`, or none when it (or its whole
  // section) is absent. `key: ~`, `key:` or `--set key=` mean a value but
  // give none; falling back to the default would hide it.
  std::optional<YAML::Node> Value(const std::string& k) {
    YAML::Node n = Get(k);
    if (!n || !node_ || node_.IsNull()) return std::nullopt;
    if (n.IsNull()) Fail(Key(k), "has no value; give one (\"\" for an empty string) or leave the key out");
    return n;
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
  YAML::Node node_;
  std::string path_;
  std::set<std::string> known_;
};

template <typename T>
std::string TypeName() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else return "a string";
}

// A scalar node as T, or the key is refused naming what it expected.
template <typename T>
T ScalarAs(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) Fail(key, "expected a scalar, got " + Describe(n));
  T out{};
  try {
    out = n.as<T>();
  } catch (const YAML::Exception&) {
    Fail(key, "expected " + TypeName<T>() + ", got " + Describe(n));
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(out)) Fail(key, "must be a finite number, got " + Describe(n));
  }
  return out;
}

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

// "a, b or c".
std::string OneOf(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  return out;
}

// What the parser holds before the config's final values are known.
struct Pending {
  std::string precision = "auto";          // train.precision as written
  std::string optimizer_overlap = "auto";  // runtime.optimizer_overlap as written
  std::set<std::string> given;             // the keys the config wrote, by path
  bool read_init_from = true;              // ConfigOptions::read_init_from
  std::optional<HfModelConfig> imported;   // model.init_from's config.json, once read
};

// One key of the config. The table (Keys()) lists every key once, in the
// order --print-config writes them and the parser reads them: a key the
// parser takes is one it prints.
struct KeyDef {
  std::string path;  // dotted: "train.batch_size"
  // Reads the key's value (present and not null) into the config.
  std::function<void(const YAML::Node& n, const std::string& key, Config& c, Pending& p)> read;
  // Checks the value alone, once its section is read (empty: none).
  std::function<void(const std::string& key, const Config& c)> check;
  std::function<void(YAML::Emitter& e, const Config& c)> emit;
  // Whether --print-config writes it (empty: always).
  std::function<bool(const Config& c)> shown;
};

// The value checks a key's definition names.
auto Positive() {
  return [](const std::string& key, auto v) { RequirePositive(key, v); };
}
auto NonNegative() {
  return [](const std::string& key, auto v) { RequireNonNegative(key, v); };
}
auto Ratio(bool allow_zero) {
  return [allow_zero](const std::string& key, double v) { RequireRatio(key, v, allow_zero); };
}
auto AtMost(int64_t limit, std::string what) {
  return [limit, what](const std::string& key, int64_t v) { RequireAtMost(key, v, limit, what); };
}
// "must be at most N, got V" (a tuning knob, not a size).
auto KnobAtMost(int64_t limit) {
  return [limit](const std::string& key, int64_t v) {
    if (v > limit) Fail(key, "must be at most " + std::to_string(limit) + ", got " + std::to_string(v));
  };
}
auto OneOfNames(std::vector<std::string> names) {
  return [names](const std::string& key, const std::string& v) {
    for (const std::string& n : names) {
      if (v == n) return;
    }
    Fail(key, "must be " + OneOf(names) + ", got '" + v + "'");
  };
}

template <typename T>
void EmitValue(YAML::Emitter& e, const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    e << Shortest(v);
  } else {
    e << v;
  }
}

// A scalar key read as the type of the field `get` names, with the checks
// of its value in order.
template <typename Get, typename... Checks>
KeyDef Scalar(std::string path, Get get, Checks... checks) {
  using T = std::remove_reference_t<decltype(get(std::declval<Config&>()))>;
  KeyDef k;
  k.path = std::move(path);
  k.read = [get](const YAML::Node& n, const std::string& key, Config& c, Pending&) { get(c) = ScalarAs<T>(n, key); };
  if constexpr (sizeof...(Checks) > 0) {
    k.check = [get, checks...](const std::string& key, const Config& c) {
      const T& v = get(const_cast<Config&>(c));
      (checks(key, v), ...);
    };
  }
  k.emit = [get](YAML::Emitter& e, const Config& c) { EmitValue(e, get(const_cast<Config&>(c))); };
  return k;
}

// A string key written only when set.
template <typename Get, typename... Checks>
KeyDef StringIfSet(std::string path, Get get, Checks... checks) {
  KeyDef k = Scalar(std::move(path), get, checks...);
  k.shown = [get](const Config& c) { return !get(const_cast<Config&>(c)).empty(); };
  return k;
}

// A byte count: a number or a quantity ("24GiB", "512MB").
template <typename Get, typename... Checks>
KeyDef Bytes(std::string path, Get get, Checks... checks) {
  KeyDef k = Scalar(std::move(path), get, checks...);
  k.read = [get](const YAML::Node& n, const std::string& key, Config& c, Pending&) {
    if (!n.IsScalar()) Fail(key, "expected a byte count, got " + Describe(n));
    auto bytes = ParseBytes(n.Scalar());
    if (!bytes.ok()) Fail(key, bytes.status().message());
    get(c) = *bytes;
  };
  return k;
}

// An enum written by its names.
template <typename E>
struct EnumName {
  const char* name;
  E value;
};
template <typename E, typename Get>
KeyDef Enum(std::string path, Get get, std::vector<EnumName<E>> names) {
  KeyDef k;
  k.path = std::move(path);
  k.read = [get, names](const YAML::Node& n, const std::string& key, Config& c, Pending&) {
    const std::string text = ScalarAs<std::string>(n, key);
    std::vector<std::string> all;
    for (const EnumName<E>& v : names) {
      if (text == v.name) {
        get(c) = v.value;
        return;
      }
      all.push_back(v.name);
    }
    Fail(key, "must be " + OneOf(all) + ", got '" + text + "'");
  };
  k.emit = [get, names](YAML::Emitter& e, const Config& c) {
    const E value = get(const_cast<Config&>(c));
    for (const EnumName<E>& v : names) {
      if (v.value == value) e << v.name;
    }
  };
  return k;
}

// Lookahead beyond a few thousand moments (a whole step of a large model) buys nothing.
constexpr int64_t kMaxPrefetchDepth = 100000;
// Each chunk read ahead holds a host window of one shard per kind on the
// disk; past a few the windows cost more host memory than the overlap gains.
constexpr int64_t kMaxDiskReadAhead = 16;
// Past the drive's queue depth more threads only wait.
constexpr int64_t kMaxDiskIoThreads = 64;

const std::vector<EnumName<DataSourceKind>> kDataSources = {
    {"generated", DataSourceKind::kGenerated}, {"text", DataSourceKind::kText}, {"tokens", DataSourceKind::kTokens},
    {"jsonl", DataSourceKind::kJsonl}};

std::string DataSourceName(DataSourceKind kind) {
  for (const auto& v : kDataSources) {
    if (v.value == kind) return v.name;
  }
  return "?";
}

// model.preset: the preset's shape, which the shape keys after it override.
KeyDef PresetKey() {
  KeyDef k = StringIfSet("model.preset", [](Config& c) -> auto& { return c.model.preset; });
  k.read = [](const YAML::Node& n, const std::string& key, Config& c, Pending&) {
    c.model.preset = ScalarAs<std::string>(n, key);
    if (c.model.preset.empty()) return;
    auto preset = FindGptPreset(c.model.preset);
    if (!preset) {
      std::string names;
      for (const auto& p : GptPresets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
      Fail(key, "unknown preset '" + c.model.preset + "' (known: " + names + ")");
    }
    c.model.gpt = *preset;
  };
  return k;
}

// optimizer.params.betas: [beta1, beta2].
KeyDef BetasKey() {
  KeyDef k;
  k.path = "optimizer.params.betas";
  k.read = [](const YAML::Node& n, const std::string& key, Config& c, Pending&) {
    if (!n.IsSequence() || n.size() != 2) Fail(key, "expected a list of two numbers");
    try {
      c.optimizer.beta1 = n[0].as<float>();
      c.optimizer.beta2 = n[1].as<float>();
    } catch (const YAML::Exception&) {
      Fail(key, "expected a list of two numbers");
    }
  };
  k.check = [](const std::string& key, const Config& c) {
    if (!(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1)) Fail(key, "beta1 must be in [0, 1)");
    if (!(c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1)) Fail(key, "beta2 must be in [0, 1)");
  };
  k.emit = [](YAML::Emitter& e, const Config& c) {
    e << YAML::Flow << YAML::BeginSeq << Shortest(c.optimizer.beta1) << Shortest(c.optimizer.beta2) << YAML::EndSeq;
  };
  return k;
}

// train.precision: auto until the device and fp16.enabled are known.
KeyDef PrecisionKey() {
  KeyDef k;
  k.path = "train.precision";
  k.read = [](const YAML::Node& n, const std::string& key, Config&, Pending& p) {
    p.precision = ScalarAs<std::string>(n, key);
    OneOfNames({"auto", "fp32", "bf16", "fp16"})(key, p.precision);
  };
  k.emit = [](YAML::Emitter& e, const Config& c) { e << PrecisionName(c.train.precision); };
  return k;
}

// runtime.optimizer_overlap: auto until the device is known.
KeyDef OptimizerOverlapKey() {
  KeyDef k;
  k.path = "runtime.optimizer_overlap";
  k.read = [](const YAML::Node& n, const std::string& key, Config&, Pending& p) {
    p.optimizer_overlap = ScalarAs<std::string>(n, key);
    OneOfNames({"auto", "off", "pipeline", "speculate"})(key, p.optimizer_overlap);
  };
  k.emit = [](YAML::Emitter& e, const Config& c) { e << OptimizerOverlapName(c.runtime.optimizer_overlap); };
  return k;
}

bool GeneratedData(const Config& c) { return c.data.source == DataSourceKind::kGenerated; }
bool JsonlData(const Config& c) { return c.data.source == DataSourceKind::kJsonl; }

// model.architecture: the architecture's description (ArchitectureDefaults)
// under the shape read so far; with a preset, it must be the preset's.
KeyDef ArchitectureKey() {
  const std::vector<EnumName<Architecture>> names = {{"gpt2", Architecture::kGpt2},
                                                     {"llama", Architecture::kLlama},
                                                     {"qwen2", Architecture::kQwen2},
                                                     {"mistral", Architecture::kMistral}};
  KeyDef k = Enum("model.architecture", [](Config& c) -> auto& { return c.model.gpt.architecture; }, names);
  const auto read_enum = k.read;
  k.read = [read_enum](const YAML::Node& n, const std::string& key, Config& c, Pending& p) {
    const GptConfig before = c.model.gpt;
    read_enum(n, key, c, p);
    const Architecture a = c.model.gpt.architecture;
    if (!c.model.preset.empty()) {
      if (a != before.architecture) {
        Fail(key, std::string("is ") + ArchitectureName(a) + " but model.preset " + c.model.preset + " is " +
                      ArchitectureName(before.architecture));
      }
      return;
    }
    GptConfig g = ArchitectureDefaults(a);
    g.n_layer = before.n_layer;
    g.n_head = before.n_head;
    g.n_embd = before.n_embd;
    g.vocab_size = before.vocab_size;
    g.max_seq_len = before.max_seq_len;
    c.model.gpt = g;
  };
  return k;
}

bool Gpt2(const Config& c) { return c.model.gpt.architecture == Architecture::kGpt2; }
bool Rotary(const Config& c) { return c.model.gpt.positions == PositionKind::kRotary; }

// A head or width count whose 0 means GPT-2's value: written resolved where
// the architecture is not GPT-2 or the config set it.
template <typename Get, typename Resolved>
KeyDef DerivedCount(std::string path, Get get, Resolved resolved, int64_t limit, std::string what) {
  KeyDef k = Scalar(std::move(path), get, AtMost(limit, std::move(what)));
  // Positive when given (0 stands for "not given" inside).
  k.read = [get](const YAML::Node& n, const std::string& key, Config& c, Pending&) {
    const int64_t v = ScalarAs<int64_t>(n, key);
    RequirePositive(key, v);
    get(c) = v;
  };
  k.emit = [resolved](YAML::Emitter& e, const Config& c) { e << resolved(c.model.gpt); };
  k.shown = [get](const Config& c) { return !Gpt2(c) || get(const_cast<Config&>(c)) != 0; };
  return k;
}

// The table, a section (or a few small ones) at a time.
void AddModelKeys(std::vector<KeyDef>& k) {
  k.push_back(PresetKey());
  k.push_back(ArchitectureKey());
  k.push_back(Scalar("model.n_layer", [](Config& c) -> auto& { return c.model.gpt.n_layer; }, Positive(),
                     AtMost(kMaxLayers, "layers pstar takes")));
  k.push_back(Scalar("model.n_head", [](Config& c) -> auto& { return c.model.gpt.n_head; }, Positive(),
                     AtMost(kMaxEmbd, "heads pstar takes")));
  k.push_back(DerivedCount(
      "model.n_kv_head", [](Config& c) -> auto& { return c.model.gpt.n_kv_head; },
      [](const GptConfig& g) { return g.kv_heads(); }, kMaxEmbd, "heads pstar takes"));
  k.push_back(Scalar("model.n_embd", [](Config& c) -> auto& { return c.model.gpt.n_embd; }, Positive(),
                     AtMost(kMaxEmbd, "channels pstar takes")));
  k.push_back(DerivedCount(
      "model.head_dim", [](Config& c) -> auto& { return c.model.gpt.head_dim; },
      [](const GptConfig& g) { return g.head_size(); }, kMaxEmbd, "channels pstar takes"));
  k.push_back(DerivedCount(
      "model.intermediate_size", [](Config& c) -> auto& { return c.model.gpt.intermediate_size; },
      [](const GptConfig& g) { return g.mlp_size(); }, kMaxIntermediate, "MLP channels pstar takes"));
  k.push_back(Scalar("model.vocab_size", [](Config& c) -> auto& { return c.model.gpt.vocab_size; }, Positive(),
                     AtMost(kMaxVocab, "tokens pstar takes (int32 token ids)")));
  k.push_back(Scalar("model.max_seq_len", [](Config& c) -> auto& { return c.model.gpt.max_seq_len; }, Positive(),
                     AtMost(kMaxSeqLen, "positions pstar takes")));
  // The rest of the description: written where the architecture is not GPT-2.
  k.push_back(Enum("model.norm", [](Config& c) -> auto& { return c.model.gpt.norm; },
                   std::vector<EnumName<NormKind>>{{"layernorm", NormKind::kLayerNorm}, {"rmsnorm", NormKind::kRmsNorm}}));
  k.back().shown = [](const Config& c) { return !Gpt2(c); };
  k.push_back(Scalar("model.norm_eps", [](Config& c) -> auto& { return c.model.gpt.norm_eps; }, Positive()));
  k.back().shown = [](const Config& c) { return !Gpt2(c); };
  k.push_back(Enum("model.positions", [](Config& c) -> auto& { return c.model.gpt.positions; },
                   std::vector<EnumName<PositionKind>>{{"learned", PositionKind::kLearned},
                                                       {"rope", PositionKind::kRotary}}));
  k.back().shown = [](const Config& c) { return !Gpt2(c); };
  k.push_back(Scalar("model.rope_theta", [](Config& c) -> auto& { return c.model.gpt.rope_theta; }, Positive()));
  k.back().shown = Rotary;
  k.push_back(Enum("model.rope_scaling.type", [](Config& c) -> auto& { return c.model.gpt.rope_scaling.llama3; },
                   std::vector<EnumName<bool>>{{"none", false}, {"llama3", true}}));
  k.back().shown = Rotary;
  auto scaling_shown = [](const Config& c) { return Rotary(c) && c.model.gpt.rope_scaling.llama3; };
  k.push_back(Scalar("model.rope_scaling.factor", [](Config& c) -> auto& { return c.model.gpt.rope_scaling.factor; },
                     Positive()));
  k.back().shown = scaling_shown;
  k.push_back(Scalar("model.rope_scaling.low_freq_factor",
                     [](Config& c) -> auto& { return c.model.gpt.rope_scaling.low_freq_factor; }, Positive()));
  k.back().shown = scaling_shown;
  k.push_back(Scalar("model.rope_scaling.high_freq_factor",
                     [](Config& c) -> auto& { return c.model.gpt.rope_scaling.high_freq_factor; }, Positive()));
  k.back().shown = scaling_shown;
  k.push_back(Scalar("model.rope_scaling.original_max_position_embeddings",
                     [](Config& c) -> auto& { return c.model.gpt.rope_scaling.original_max_position_embeddings; },
                     Positive(), AtMost(kMaxSeqLen, "positions pstar takes")));
  k.back().shown = scaling_shown;
  k.push_back(Enum("model.mlp", [](Config& c) -> auto& { return c.model.gpt.mlp; },
                   std::vector<EnumName<MlpKind>>{{"gelu", MlpKind::kGelu}, {"swiglu", MlpKind::kSwiGlu}}));
  k.back().shown = [](const Config& c) { return !Gpt2(c); };
  k.push_back(Enum("model.linear_bias", [](Config& c) -> auto& { return c.model.gpt.linear_bias; },
                   std::vector<EnumName<LinearBias>>{
                       {"all", LinearBias::kAll}, {"qkv", LinearBias::kQkv}, {"none", LinearBias::kNone}}));
  k.back().shown = [](const Config& c) { return !Gpt2(c); };
  k.push_back(
      Scalar("model.tie_word_embeddings", [](Config& c) -> auto& { return c.model.gpt.tied_embeddings; }));
  k.back().shown = [](const Config& c) { return !Gpt2(c); };
  k.push_back(StringIfSet("model.init_from", [](Config& c) -> auto& { return c.model.init_from; }));
}

void AddDataKeys(std::vector<KeyDef>& k) {
  k.push_back(Enum("data.source", [](Config& c) -> auto& { return c.data.source; }, kDataSources));
  k.push_back(StringIfSet("data.path", [](Config& c) -> auto& { return c.data.path; }));
  k.push_back(StringIfSet("data.val_path", [](Config& c) -> auto& { return c.data.val_path; }));
  k.push_back(Scalar("data.tokenizer", [](Config& c) -> auto& { return c.data.tokenizer; }));
  k.push_back(StringIfSet("data.vocab", [](Config& c) -> auto& { return c.data.vocab; }));
  k.push_back(StringIfSet("data.merges", [](Config& c) -> auto& { return c.data.merges; }));
  k.push_back(StringIfSet("data.tokenizer_json", [](Config& c) -> auto& { return c.data.tokenizer_json; }));
  k.push_back(StringIfSet("data.tokenizer_ranks", [](Config& c) -> auto& { return c.data.tokenizer_ranks; }));
  k.push_back(Scalar("data.chat_format", [](Config& c) -> auto& { return c.data.chat_format; },
                     OneOfNames({"auto", "llama3", "llama3.1", "chatml", "qwen2.5", "qwen3", "none"})));
  k.back().shown = JsonlData;
  k.push_back(Scalar("data.chat_date", [](Config& c) -> auto& { return c.data.chat_date; }));
  k.back().shown = [](const Config& c) { return JsonlData(c) && c.data.chat_format == "llama3.1"; };
  k.push_back(Scalar("data.overlong", [](Config& c) -> auto& { return c.data.overlong; },
                     OneOfNames({"truncate", "error"})));
  k.back().shown = JsonlData;
  k.push_back(Scalar("data.generated_tokens", [](Config& c) -> auto& { return c.data.generated_tokens; },
                     Positive()));
  k.back().shown = GeneratedData;
  k.push_back(Scalar("data.seed", [](Config& c) -> auto& { return c.data.seed; }));
  k.back().shown = [](const Config& c) { return GeneratedData(c) || JsonlData(c); };
}

void AddOptimizerKeys(std::vector<KeyDef>& k) {
  k.push_back(Scalar("optimizer.type", [](Config& c) -> auto& { return c.optimizer.type; },
                     OneOfNames({"Adam", "AdamW"})));
  k.push_back(Scalar("optimizer.params.lr", [](Config& c) -> auto& { return c.optimizer.lr; }, Positive()));
  k.push_back(BetasKey());
  k.push_back(Scalar("optimizer.params.eps", [](Config& c) -> auto& { return c.optimizer.eps; }, Positive()));
  k.push_back(Scalar("optimizer.params.weight_decay", [](Config& c) -> auto& { return c.optimizer.weight_decay; },
                     NonNegative()));
  k.push_back(
      Scalar("optimizer.params.use_hybrid_adam", [](Config& c) -> auto& { return c.optimizer.use_hybrid_adam; }));

  k.push_back(Scalar("fp16.enabled", [](Config& c) -> auto& { return c.fp16.enabled; }));
  k.push_back(Scalar("fp16.loss_scale", [](Config& c) -> auto& { return c.fp16.loss_scale; }, NonNegative()));
  k.push_back(Scalar("fp16.initial_scale_power", [](Config& c) -> auto& { return c.fp16.initial_scale_power; },
                     NonNegative(), [](const std::string& key, int64_t v) {
                       if (v > 63) Fail(key, "must be at most 63");
                     }));
  k.push_back(Scalar("fp16.loss_scale_window", [](Config& c) -> auto& { return c.fp16.loss_scale_window; },
                     Positive()));
  k.push_back(Scalar("fp16.hysteresis", [](Config& c) -> auto& { return c.fp16.hysteresis; }, Positive()));
  k.push_back(Scalar("fp16.min_loss_scale", [](Config& c) -> auto& { return c.fp16.min_loss_scale; }, Positive()));
}

void AddPatrickStarKeys(std::vector<KeyDef>& k) {
  k.push_back(Scalar("default_chunk_size", [](Config& c) -> auto& { return c.default_chunk_size; }, NonNegative()));
  k.push_back(Scalar("release_after_init", [](Config& c) -> auto& { return c.release_after_init; }));
  k.push_back(Scalar("use_cpu_embedding", [](Config& c) -> auto& { return c.use_cpu_embedding; }));

  k.push_back(Scalar("client.mem_tracer.use_async_mem_monitor",
                     [](Config& c) -> auto& { return c.mem_tracer.use_async_mem_monitor; }));
  k.push_back(Scalar("client.mem_tracer.warmup_gpu_chunk_mem_ratio",
                     [](Config& c) -> auto& { return c.mem_tracer.warmup_gpu_chunk_mem_ratio; }, Ratio(false)));
  k.push_back(Scalar("client.mem_tracer.overall_gpu_mem_ratio",
                     [](Config& c) -> auto& { return c.mem_tracer.overall_gpu_mem_ratio; }, Ratio(false)));
  k.push_back(Scalar("client.mem_tracer.overall_cpu_mem_ratio",
                     [](Config& c) -> auto& { return c.mem_tracer.overall_cpu_mem_ratio; }, Ratio(false)));
  k.push_back(Scalar("client.mem_tracer.margin_use_ratio",
                     [](Config& c) -> auto& { return c.mem_tracer.margin_use_ratio; }, Ratio(true)));
  k.push_back(
      Scalar("client.mem_tracer.use_fake_dist", [](Config& c) -> auto& { return c.mem_tracer.use_fake_dist; }));
  k.push_back(Scalar("client.mem_tracer.with_static_partition",
                     [](Config& c) -> auto& { return c.mem_tracer.with_static_partition; }));
  k.push_back(Scalar("client.opts.with_mem_saving_comm",
                     [](Config& c) -> auto& { return c.client_opts.with_mem_saving_comm; }));
  k.push_back(
      Scalar("client.opts.with_mem_cache", [](Config& c) -> auto& { return c.client_opts.with_mem_cache; }));
  k.push_back(
      Scalar("client.opts.with_async_move", [](Config& c) -> auto& { return c.client_opts.with_async_move; }));
}

void AddRuntimeKeys(std::vector<KeyDef>& k) {
  k.push_back(Enum("runtime.device", [](Config& c) -> auto& { return c.runtime.device; },
                   std::vector<EnumName<ComputeDevice>>{{"cpu", ComputeDevice::kCpu},
                                                        {"cuda", ComputeDevice::kCuda}}));
  k.push_back(Bytes("runtime.device_memory", [](Config& c) -> auto& { return c.runtime.device_memory; }));
  k.push_back(Bytes("runtime.host_memory", [](Config& c) -> auto& { return c.runtime.host_memory; }));
  k.push_back(Enum("runtime.eviction", [](Config& c) -> auto& { return c.runtime.eviction; },
                   std::vector<EnumName<EvictionPolicy>>{{"opt", EvictionPolicy::kOpt},
                                                         {"lru", EvictionPolicy::kLru}}));
  k.push_back(Scalar("runtime.prefetch_depth", [](Config& c) -> auto& { return c.runtime.prefetch_depth; },
                     NonNegative(), KnobAtMost(kMaxPrefetchDepth)));
  k.push_back(Scalar("runtime.nvme_path", [](Config& c) -> auto& { return c.runtime.nvme_path; }));
  k.push_back(Bytes("runtime.nvme_memory", [](Config& c) -> auto& { return c.runtime.nvme_memory; }));
  k.push_back(Scalar("runtime.nvme_read_ahead", [](Config& c) -> auto& { return c.runtime.nvme_read_ahead; },
                     NonNegative(), KnobAtMost(kMaxDiskReadAhead)));
  k.push_back(Scalar("runtime.nvme_io_threads", [](Config& c) -> auto& { return c.runtime.nvme_io_threads; },
                     Positive(), KnobAtMost(kMaxDiskIoThreads)));
  k.push_back(Enum("runtime.nvme_spill", [](Config& c) -> auto& { return c.runtime.nvme_spill; },
                   std::vector<EnumName<DiskSpill>>{{"auto", DiskSpill::kAuto}, {"all", DiskSpill::kAll}}));
  k.push_back(OptimizerOverlapKey());
  k.push_back(Bytes("runtime.undo_memory", [](Config& c) -> auto& { return c.runtime.undo_memory; }));
  k.push_back(Scalar("runtime.comm_overlap", [](Config& c) -> auto& { return c.runtime.comm_overlap; }));
}

void AddCheckpointDistMetricsKeys(std::vector<KeyDef>& k) {
  k.push_back(Scalar("checkpoint.dir", [](Config& c) -> auto& { return c.checkpoint.dir; }));
  k.push_back(Scalar("checkpoint.every_steps", [](Config& c) -> auto& { return c.checkpoint.every_steps; },
                     NonNegative()));
  k.push_back(Scalar("checkpoint.keep", [](Config& c) -> auto& { return c.checkpoint.keep; }, NonNegative()));
  k.push_back(Scalar("checkpoint.resume", [](Config& c) -> auto& { return c.checkpoint.resume; }));
  k.push_back(StringIfSet("checkpoint.export_dir", [](Config& c) -> auto& { return c.checkpoint.export_dir; }));
  k.push_back(Scalar("checkpoint.export_dtype", [](Config& c) -> auto& { return c.checkpoint.export_dtype; },
                     OneOfNames({"auto", "fp32", "bf16", "fp16"})));
  k.back().shown = [](const Config& c) { return !c.checkpoint.export_dir.empty(); };

  k.push_back(Scalar("dist.timeout_seconds", [](Config& c) -> auto& { return c.dist.timeout_seconds; },
                     Positive()));

  k.push_back(Scalar("metrics.port", [](Config& c) -> auto& { return c.metrics.port; },
                     [](const std::string& key, int64_t v) {
                       if (v < 0 || v > 65535) Fail(key, "must be in [0, 65535], got " + std::to_string(v));
                     }));
  k.push_back(Scalar("metrics.bind_address", [](Config& c) -> auto& { return c.metrics.bind_address; },
                     [](const std::string& key, const std::string& v) {
                       if (v.empty()) Fail(key, "must not be empty");
                     }));
  k.push_back(Scalar("metrics.device_label", [](Config& c) -> auto& { return c.metrics.device_label; }));
  k.push_back(Scalar("metrics.job_labels", [](Config& c) -> auto& { return c.metrics.job_labels; }));
}

void AddTrainKeys(std::vector<KeyDef>& k) {
  k.push_back(Scalar("train.batch_size", [](Config& c) -> auto& { return c.train.batch_size; }, Positive(),
                     AtMost(kMaxMicroBatchTokens, "sequences pstar takes")));
  k.push_back(Scalar("train.seq_len", [](Config& c) -> auto& { return c.train.seq_len; }, NonNegative()));
  k.push_back(Scalar("train.steps", [](Config& c) -> auto& { return c.train.steps; }, Positive()));
  k.push_back(Scalar("train.grad_accum_steps", [](Config& c) -> auto& { return c.train.grad_accum_steps; },
                     Positive()));
  k.push_back(Scalar("train.seed", [](Config& c) -> auto& { return c.train.seed; }));
  k.push_back(Scalar("train.activation_checkpointing",
                     [](Config& c) -> auto& { return c.train.activation_checkpointing; }));
  k.push_back(Scalar("train.log_every", [](Config& c) -> auto& { return c.train.log_every; }, Positive()));
  k.push_back(Scalar("train.eval_every", [](Config& c) -> auto& { return c.train.eval_every; }, NonNegative()));
  k.push_back(Scalar("train.eval_batches", [](Config& c) -> auto& { return c.train.eval_batches; }, Positive(),
                     AtMost(int64_t(1) << 20, "validation micro-batches pstar takes")));
  k.push_back(Scalar("train.sample_every", [](Config& c) -> auto& { return c.train.sample_every; }, NonNegative()));
  k.push_back(Scalar("train.sample_tokens", [](Config& c) -> auto& { return c.train.sample_tokens; }, Positive(),
                     AtMost(4096, "sampled tokens pstar takes")));
  k.push_back(Scalar("train.sample_prompt", [](Config& c) -> auto& { return c.train.sample_prompt; }));
  k.push_back(Scalar("train.grad_clip", [](Config& c) -> auto& { return c.train.grad_clip; }, NonNegative()));
  k.push_back(Scalar("train.warmup_steps", [](Config& c) -> auto& { return c.train.warmup_steps; }, NonNegative()));
  k.push_back(Scalar("train.min_lr", [](Config& c) -> auto& { return c.train.min_lr; }, NonNegative()));
  k.push_back(Scalar("train.lr_decay", [](Config& c) -> auto& { return c.train.lr_decay; },
                     OneOfNames({"cosine", "constant"})));
  k.push_back(Scalar("train.threads", [](Config& c) -> auto& { return c.train.threads; }, NonNegative()));
  k.push_back(PrecisionKey());
  k.push_back(Enum("train.grad_precision", [](Config& c) -> auto& { return c.train.grad_precision; },
                   std::vector<EnumName<GradPrecision>>{{"fp32", GradPrecision::kFp32},
                                                        {"16bit", GradPrecision::k16Bit}}));
}

// Every key, in --print-config's order (which is also the order sections
// are read and checked in).
const std::vector<KeyDef>& Keys() {
  static const std::vector<KeyDef> kKeys = [] {
    std::vector<KeyDef> k;
    AddModelKeys(k);
    AddDataKeys(k);
    AddOptimizerKeys(k);
    AddPatrickStarKeys(k);
    AddRuntimeKeys(k);
    AddCheckpointDistMetricsKeys(k);
    AddTrainKeys(k);
    return k;
  }();
  return kKeys;
}

// A key's value as --print-config writes it; "unset" where it is not shown
// unless `always`.
std::string EmittedValue(const KeyDef& k, const Config& c, bool always = false) {
  if (!always && k.shown && !k.shown(c)) return "unset";
  YAML::Emitter e;
  k.emit(e, c);
  return e.c_str();
}

// model.init_from: the directory's config.json describes the model. A model
// key the config gives beside it must agree (each key given, and a preset's
// every key), so nothing trains a model other than the one imported.
void AdoptImportedModel(Config& c, const Pending& p) {
  const HfModelConfig& hf = *p.imported;
  Config theirs = c;
  theirs.model.gpt = hf.model;
  theirs.model.gpt.vocab_multiple = c.model.gpt.vocab_multiple;
  const bool preset = !c.model.preset.empty();
  for (const KeyDef& k : Keys()) {
    if (k.path.rfind("model.", 0) != 0 || k.path == "model.preset" || k.path == "model.init_from") continue;
    const bool given = p.given.count(k.path) > 0;
    if (!given && !preset) continue;
    // A key given is compared as written; a preset's as it prints.
    const std::string ours = EmittedValue(k, c, given), its = EmittedValue(k, theirs, given);
    if (ours == its) continue;
    if (given) {
      Fail(k.path, "is " + ours + " but " + hf.path + " has " + its + " (model.init_from describes the model: leave " +
                       k.path + " unset)");
    }
    Fail("model.preset", c.model.preset + " is not the model " + hf.path + " describes (its " + k.path.substr(6) +
                             " is " + ours + ", the directory's " + its + ")");
  }
  c.model.gpt = theirs.model.gpt;
}

// model.init_from, before the model keys' checks: the directory's model, or
// where it is not read, a model the config describes itself.
void ResolveImportedModel(const Section& s, Config& c, Pending& p) {
  if (p.read_init_from && !c.model.init_from.empty()) {
    Result<HfModelConfig> hf = ReadHfConfig(c.model.init_from);
    if (!hf.ok()) Fail(s.Key("init_from"), hf.status().message());
    p.imported = std::move(hf).value();
    AdoptImportedModel(c, p);
  } else if (!c.model.init_from.empty() && !p.given.count("model.preset") && !p.given.count("model.n_layer")) {
    Fail(s.Key("init_from"), "needs model.preset or the model's shape beside it here: this config is read without "
                             "the directory (the operator sizes the pods before a rank reads it)");
  }
}

// The rules between a section's keys, once each key's own checks passed.
void CheckModel(const Section& s, Config& c, const Pending& p) {
  GptConfig& g = c.model.gpt;
  const std::string arch = ArchitectureName(g.architecture);
  if (g.positions == PositionKind::kLearned) {
    for (const char* key : {"rope_theta", "rope_scaling.type", "rope_scaling.factor", "rope_scaling.low_freq_factor",
                            "rope_scaling.high_freq_factor", "rope_scaling.original_max_position_embeddings"}) {
      if (p.given.count(std::string("model.") + key)) Fail(s.Key(key), "is set but model.positions is learned (it is for rope)");
    }
  }
  // A llama3 scaling block names all four of its values (as config.json
  // does), unless the preset gave them.
  const std::optional<GptConfig> preset = FindGptPreset(c.model.preset);
  const bool preset_scaling = preset && preset->rope_scaling.llama3;
  std::string missing, stray;
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    const bool given = p.given.count(std::string("model.rope_scaling.") + key) > 0;
    if (g.rope_scaling.llama3 && !given && !preset_scaling && !p.imported) missing += (missing.empty() ? "" : ", ") + std::string(key);
    if (!g.rope_scaling.llama3 && given) stray = key;
  }
  if (!missing.empty()) Fail(s.Key("rope_scaling"), "type llama3 needs " + missing);
  if (!stray.empty()) Fail(s.Key("rope_scaling." + stray), "is set but model.rope_scaling.type is none");
  if (std::optional<DescriptionProblem> problem = CheckDescription(g)) Fail(s.Key(problem->field), problem->why);
  if (g.architecture != Architecture::kGpt2) {
    // Explicit from here on: what --print-config writes and checkpoints record.
    g.n_kv_head = g.kv_heads();
    g.head_dim = g.head_size();
  }
  // Each bound alone still allows absurd products: the parameter count, in
  // floating point so that it cannot overflow.
  const double params = g.NumParametersApprox();
  if (params > kMaxParameters) {
    std::ostringstream ss;
    ss << "has " << params << " parameters, more than the " << kMaxParameters << " pstar takes";
    Fail(s.path(), ss.str());
  }
}

void CheckData(const Section& s, Config& c, const Pending& p) {
  DataSection& d = c.data;
  const std::string source = DataSourceName(d.source);
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
  OneOfNames({"byte", "gpt2", "hf", "tiktoken", "none"})(s.Key("tokenizer"), d.tokenizer);
  if (d.source == DataSourceKind::kGenerated && d.tokenizer != "none") {
    Fail(s.Key("tokenizer"), "is " + d.tokenizer + " but the generated corpus has no text (leave it unset)");
  }
  if (d.source == DataSourceKind::kText && d.tokenizer == "none") {
    Fail(s.Key("tokenizer"), "is none but data.source text needs one (byte, gpt2, hf or tiktoken)");
  }
  if (d.source == DataSourceKind::kJsonl && d.tokenizer != "gpt2" && d.tokenizer != "hf" && d.tokenizer != "tiktoken") {
    Fail(s.Key("tokenizer"), "is " + d.tokenizer + " but data.source jsonl needs the model's tokenizer (hf, tiktoken or gpt2)");
  }
  if (d.source != DataSourceKind::kJsonl) {
    for (const char* key : {"chat_format", "chat_date", "overlong"}) {
      if (p.given.count(std::string("data.") + key)) Fail(s.Key(key), "is for data.source jsonl, not " + source);
    }
  } else if (p.given.count("data.chat_date") && d.chat_format != "llama3.1") {
    Fail(s.Key("chat_date"), "is the date of data.chat_format llama3.1's system block, but the format is " +
                                 d.chat_format);
  }
  if (d.chat_date.empty() || d.chat_date.find_first_of("\r\n") != std::string::npos) {
    Fail(s.Key("chat_date"), "must be one line of text, like the template's own \"26 Jul 2024\"");
  }
  const bool files = !d.vocab.empty() || !d.merges.empty() || !d.tokenizer_json.empty();
  if (d.tokenizer != "gpt2" && d.tokenizer != "hf" && d.tokenizer != "tiktoken" && files) {
    Fail(s.Key("tokenizer"), "is " + d.tokenizer +
                                 " but data.vocab, data.merges or data.tokenizer_json is set (they need gpt2 or hf)");
  }
  if (d.tokenizer == "tiktoken") {
    if (files) Fail(s.Key("tokenizer"), "is tiktoken, which reads data.tokenizer_ranks, but data.vocab, data.merges or data.tokenizer_json is set");
    if (d.tokenizer_ranks.empty()) Fail(s.Key("tokenizer"), "is tiktoken but needs data.tokenizer_ranks (Llama 3's rank file, original/tokenizer.model)");
  } else if (!d.tokenizer_ranks.empty()) {
    Fail(s.Key("tokenizer_ranks"), "is set but data.tokenizer is " + d.tokenizer + " (a rank file needs tiktoken)");
  }
  if (d.tokenizer == "hf") {
    if (!d.vocab.empty() || !d.merges.empty()) {
      Fail(s.Key("tokenizer"), "is hf, which reads data.tokenizer_json, but data.vocab/data.merges are set (GPT-2's files need gpt2)");
    }
    if (d.tokenizer_json.empty()) Fail(s.Key("tokenizer"), "is hf but needs data.tokenizer_json (the model's tokenizer.json)");
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

void CheckRuntime(const Section& s, Config& c, const Pending& p) {
  const RuntimeSection& r = c.runtime;
  if (r.undo_memory > 0 && p.optimizer_overlap != "auto" && p.optimizer_overlap != "speculate") {
    Fail(s.Key("undo_memory"), "is set but runtime.optimizer_overlap is " + p.optimizer_overlap +
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
  if (r.nvme_path.empty() && r.nvme_spill != defaults.nvme_spill) {
    Fail(s.Key("nvme_spill"), "is set but runtime.nvme_path (the disk tier's directory) is not");
  }
}

void CheckTrain(const Section& s, Config& c, const Pending& p) {
  TrainSection& t = c.train;
  const GptConfig& g = c.model.gpt;
  if (t.seq_len == 0) t.seq_len = g.max_seq_len;
  if (t.seq_len > g.max_seq_len) {
    Fail(s.Key("seq_len"), std::to_string(t.seq_len) + " exceeds model.max_seq_len " + std::to_string(g.max_seq_len));
  }
  // pstar's attention sees the whole sequence: a window only shorter
  // sequences fit in changes nothing.
  if (p.imported && p.imported->sliding_window > 0 && t.seq_len > p.imported->sliding_window) {
    Fail(s.Key("seq_len"), std::to_string(t.seq_len) + " exceeds the sliding_window " +
                               std::to_string(p.imported->sliding_window) + " that " + p.imported->path +
                               " puts in force; pstar's attention is causal over the whole sequence (set "
                               "train.seq_len to at most the window)");
  }
  if (t.batch_size * t.seq_len > kMaxMicroBatchTokens) {
    Fail(s.Key("batch_size"), "times seq_len is " + std::to_string(t.batch_size * t.seq_len) +
                                  " tokens per micro-batch, more than the " + std::to_string(kMaxMicroBatchTokens) +
                                  " pstar takes");
  }
  // A micro-batch's activations, roughly (16 values of C per token and
  // layer), in floating point: bounded before any plan adds them up.
  const double activation_bytes =
      4.0 * double(t.batch_size * t.seq_len) * double(g.n_embd) * (16.0 * double(g.n_layer) + 8.0);
  if (activation_bytes > kMaxActivationBytes) {
    std::ostringstream ss;
    ss << "with this model needs about " << activation_bytes << " bytes of activations per micro-batch, more than the "
       << kMaxActivationBytes << " pstar takes";
    Fail(s.Key("batch_size"), ss.str());
  }
}

void CheckCheckpoint(const Section& s, const Config& c, const Pending& p) {
  const CheckpointSection& k = c.checkpoint;
  if (!k.export_dir.empty() && k.dir.empty()) {
    Fail(s.Key("export_dir"), "needs checkpoint.dir: the export is of the final checkpoint");
  }
  if (k.export_dir.empty() && p.given.count("checkpoint.export_dtype")) {
    Fail(s.Key("export_dtype"), "is set but checkpoint.export_dir is not");
  }
}

// The section rules by section path.
void CheckSection(const std::string& path, const Section& s, Config& c, const Pending& p) {
  if (path == "checkpoint") CheckCheckpoint(s, c, p);
  if (path == "model") CheckModel(s, c, p);
  if (path == "data") CheckData(s, c, p);
  if (path == "runtime") CheckRuntime(s, c, p);
  if (path == "train") CheckTrain(s, c, p);
}

// Reads section `s` (dotted path `path`, "" at the top) from the table: its
// keys and, where their first key comes, its subsections; then refuses keys
// the table lacks, checks each key's value, and the section's own rules.
void ParseSection(Section& s, const std::string& path, Config& c, Pending& p) {
  const std::string prefix = path.empty() ? "" : path + ".";
  std::vector<std::pair<const KeyDef*, std::string>> leaves;  // with their full key
  std::set<std::string> children;
  for (const KeyDef& k : Keys()) {
    if (k.path.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = k.path.substr(prefix.size());
    const size_t dot = rest.find('.');
    if (dot == std::string::npos) {
      if (std::optional<YAML::Node> n = s.Value(rest)) {
        k.read(*n, s.Key(rest), c, p);
        p.given.insert(k.path);
      }
      leaves.emplace_back(&k, s.Key(rest));
      continue;
    }
    const std::string child = rest.substr(0, dot);
    if (!children.insert(child).second) continue;
    Section sub = s.Child(child);
    ParseSection(sub, prefix + child, c, p);
  }
  s.CheckNoUnknownKeys();
  // The directory's model takes the place of the keys' before their checks:
  // the sizes pstar takes hold for it too.
  if (path == "model") ResolveImportedModel(s, c, p);
  const bool imported = path == "model" && p.imported;
  try {
    for (const auto& [k, key] : leaves) {
      if (k->check) k->check(key, c);
    }
  } catch (const ConfigError& e) {
    if (!imported) throw;
    throw ConfigError{e.message + " (as " + p.imported->path + " gives it)"};
  }
  CheckSection(path, s, c, p);
}

// The rules across sections, and the choices left to pstar ("auto").
void ResolveAndCheck(Config& c, const Pending& p) {
  // PatrickStar's fp16.enabled means fp16 linear layers with the loss scaler.
  if (c.fp16.enabled && p.precision != "auto" && p.precision != "fp16") {
    Fail("train.precision", "is " + p.precision + " but fp16.enabled is true");
  }
  const bool cuda = c.runtime.device == ComputeDevice::kCuda;
  if (p.optimizer_overlap == "auto") {
    c.runtime.optimizer_overlap = cuda ? OptimizerOverlap::kSpeculate : OptimizerOverlap::kOff;
  } else {
    c.runtime.optimizer_overlap = p.optimizer_overlap == "pipeline"  ? OptimizerOverlap::kPipeline
                                  : p.optimizer_overlap == "speculate" ? OptimizerOverlap::kSpeculate
                                                                       : OptimizerOverlap::kOff;
  }
  if (c.runtime.undo_memory > 0 && c.runtime.optimizer_overlap != OptimizerOverlap::kSpeculate) {
    Fail("runtime.undo_memory", "is set but runtime.optimizer_overlap is " +
                                    std::string(OptimizerOverlapName(c.runtime.optimizer_overlap)) +
                                    " (undo copies are for speculate)");
  }
  if (p.precision == "auto") {
    c.train.precision = c.fp16.enabled ? Precision::kFp16 : cuda ? Precision::kBf16 : Precision::kFp32;
  } else {
    c.train.precision = *ParsePrecision(p.precision);
  }
  if (c.train.grad_precision == GradPrecision::k16Bit && c.train.precision == Precision::kFp32) {
    Fail("train.grad_precision", "is 16bit but train.precision is fp32 (16-bit gradients take bf16 or fp16)");
  }
  if (c.optimizer.lr < c.train.min_lr) Fail("train.min_lr", "is larger than optimizer.params.lr");
  if (c.train.sample_every > 0 && c.data.tokenizer == "none") {
    Fail("train.sample_every", "needs a tokenizer to print the sample (data.tokenizer byte, gpt2, hf or tiktoken)");
  }
  if (c.train.sample_every > 0 && c.data.tokenizer == "byte" && c.train.sample_prompt.empty()) {
    Fail("train.sample_prompt", "must not be empty with byte-level text (there is no start token)");
  }
  if (c.train.eval_every > 0 && c.data.val_path.empty()) {
    Fail("train.eval_every", "is " + std::to_string(c.train.eval_every) + " but data.val_path is not set");
  }
  if (cuda && c.model.gpt.head_size() > kernels::kMaxGpuAttentionHeadSize) {
    Fail(Gpt2(c) ? "model.n_head" : "model.head_dim",
         "gives a head size of " + std::to_string(c.model.gpt.head_size()) +
             (Gpt2(c) ? " (n_embd / n_head)" : "") + "; runtime.device cuda takes at most " +
                             std::to_string(kernels::kMaxGpuAttentionHeadSize));
  }
}

Config ParseRoot(const YAML::Node& root, const ConfigOptions& options) {
  Config c;
  Pending p;
  p.read_init_from = options.read_init_from;
  Section s(root, "");
  // Model first: the train section checks seq_len against it.
  if (!s.Has("model")) Fail("model", "section is required");
  ParseSection(s, "", c, p);
  ResolveAndCheck(c, p);
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

// The dotted path's components.
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  return parts;
}

}  // namespace

Result<Config> ParseConfig(const std::string& yaml, const std::string& source_name,
                           const std::vector<std::string>& overrides, const ConfigOptions& options) {
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
    return ParseRoot(root, options);
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
  std::vector<std::string> open;  // the sections being written, outermost first
  for (const KeyDef& k : Keys()) {
    if (k.shown && !k.shown(c)) continue;
    std::vector<std::string> parts = Components(k.path);
    const std::string leaf = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    for (; open.size() > common; open.pop_back()) e << YAML::EndMap;
    for (; open.size() < parts.size(); open.push_back(parts[open.size()])) {
      e << YAML::Key << parts[open.size()] << YAML::Value << YAML::BeginMap;
    }
    e << YAML::Key << leaf << YAML::Value;
    k.emit(e, c);
  }
  for (; !open.empty(); open.pop_back()) e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

const char* OptimizerOverlapName(OptimizerOverlap overlap) {
  switch (overlap) {
    case OptimizerOverlap::kOff: return "off";
    case OptimizerOverlap::kPipeline: return "pipeline";
    case OptimizerOverlap::kSpeculate: return "speculate";
  }
  return "?";
}

std::vector<std::string> ConfigKeyPaths() {
  std::vector<std::string> paths;
  for (const KeyDef& k : Keys()) paths.push_back(k.path);
  return paths;
}

}  // namespace pstar

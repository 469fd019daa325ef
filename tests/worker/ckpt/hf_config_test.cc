// config.json of each architecture pstar imports, as their published files
// write it, read into the description; and each key pstar cannot compute
// refused in one line naming the file and the key.
#include "worker/ckpt/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace pstar {
namespace {

// Llama 3.2 1B's config.json (its keys as Meta's file has them).
nlohmann::json Llama32() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

// Qwen2.5 7B's.
nlohmann::json Qwen25() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 152064})");
}

// Mistral 7B v0.1's (a sliding window of 4096) and v0.3's (none).
nlohmann::json Mistral(bool v01) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32768})");
  if (v01) {
    j["sliding_window"] = 4096;
    j["rope_theta"] = 10000.0;
    j["vocab_size"] = 32000;
  }
  return j;
}

Result<HfModelConfig> Parse(const nlohmann::json& j) { return ParseHfConfig(j.dump(), "DIR/config.json"); }

void ExpectRefused(const nlohmann::json& j, const std::string& needle) {
  auto r = Parse(j);
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().rfind("DIR/config.json: ", 0), 0u) << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

TEST(HfConfig, ReadsThePublishedLlamaQwenAndMistralFilesAsTheirPresets) {
  struct Case {
    nlohmann::json json;
    const char* preset;
  };
  for (const Case& c : {Case{Llama32(), "llama-3.2-1b"}, Case{Qwen25(), "qwen2.5-7b"}, Case{Mistral(false), "mistral-7b-v0.3"}}) {
    SCOPED_TRACE(c.preset);
    auto r = Parse(c.json);
    ASSERT_TRUE(r.ok()) << r.status().message();
    GptConfig preset = *FindGptPreset(c.preset);
    // The presets stop at 32k positions where the file says 128k.
    preset.max_seq_len = r->model.max_seq_len;
    EXPECT_TRUE(SameDescription(r->model, preset));
    EXPECT_EQ(r->sliding_window, 0);
  }
  auto llama = Parse(Llama32());
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->model.max_seq_len, 131072);
  EXPECT_TRUE(llama->model.rope_scaling.llama3);
  EXPECT_EQ(llama->model.rope_scaling.factor, 32.0);
  EXPECT_EQ(llama->model.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(Parse(Qwen25())->model.linear_bias, LinearBias::kQkv);
}

TEST(HfConfig, TakesEachArchitecturesDefaultsForAbsentKeys) {
  nlohmann::json j = Llama32();
  for (const char* key : {"num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "rope_scaling",
                          "tie_word_embeddings", "max_position_embeddings", "architectures"}) {
    j.erase(key);
  }
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->model.architecture, Architecture::kLlama);
  EXPECT_EQ(r->model.kv_heads(), 32);
  EXPECT_EQ(r->model.head_size(), 64);
  EXPECT_EQ(r->model.rope_theta, 10000.0);
  EXPECT_EQ(r->model.norm_eps, 1e-6);
  EXPECT_FALSE(r->model.rope_scaling.llama3);
  EXPECT_FALSE(r->model.tied_embeddings);
  EXPECT_EQ(r->model.max_seq_len, 2048);
  // rope_scaling written the older way (type) and as "default".
  j["rope_scaling"] = {{"type", "default"}};
  EXPECT_FALSE(Parse(j)->model.rope_scaling.llama3);
  nlohmann::json q = Qwen25();
  q.erase("max_position_embeddings");
  EXPECT_EQ(Parse(q)->model.max_seq_len, 32768);
}

TEST(HfConfig, NamesTheWindowInForce) {
  EXPECT_EQ(Parse(Mistral(true))->sliding_window, 4096);
  nlohmann::json q = Qwen25();
  q["use_sliding_window"] = true;
  EXPECT_EQ(Parse(q)->sliding_window, 0) << "max_window_layers 28 of 28 layers: no layer takes it";
  q["max_window_layers"] = 21;
  EXPECT_EQ(Parse(q)->sliding_window, 131072);
}

TEST(HfConfig, ReadsGpt2sConfig) {
  const nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"n_layer", 12},
                            {"n_head", 12},  {"n_embd", 768},          {"vocab_size", 50257},
                            {"n_positions", 1024}, {"n_ctx", 1024},   {"activation_function", "gelu_new"},
                            {"layer_norm_epsilon", 1e-5}, {"n_inner", nullptr}};
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(SameDescription(r->model, *FindGptPreset("gpt2-124m")));
  nlohmann::json bad = j;
  bad["n_inner"] = 1000;
  ExpectRefused(bad, "n_inner is 1000");
  bad = j;
  bad["activation_function"] = "relu";
  ExpectRefused(bad, "activation_function is relu");
  bad = j;
  bad["scale_attn_by_inverse_layer_idx"] = true;
  ExpectRefused(bad, "scale_attn_by_inverse_layer_idx is true");
  bad = j;
  bad["tie_word_embeddings"] = false;
  ExpectRefused(bad, "tie_word_embeddings is false");
}

TEST(HfConfig, RefusesWhatPstarCannotComputeInOneLine) {
  auto with = [](nlohmann::json j, const std::string& key, const nlohmann::json& v) {
    if (v.is_null() && key != "rope_scaling") {
      j.erase(key);
    } else {
      j[key] = v;
    }
    return j;
  };
  ExpectRefused(with(Llama32(), "architectures", {"Qwen3ForCausalLM"}),
                "architecture Qwen3ForCausalLM is not one pstar imports");
  ExpectRefused(with(with(Llama32(), "architectures", nullptr), "model_type", "gemma2"), "architecture gemma2");
  ExpectRefused(with(Llama32(), "model_type", "qwen2"), "architectures says LlamaForCausalLM but model_type is qwen2");
  ExpectRefused(with(Llama32(), "rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}),
                "rope_scaling type yarn is not one pstar computes");
  nlohmann::json no_factor = Llama32();
  no_factor["rope_scaling"].erase("low_freq_factor");
  ExpectRefused(no_factor, "rope_scaling.low_freq_factor is missing");
  ExpectRefused(with(Llama32(), "hidden_act", "gelu"), "hidden_act is gelu");
  ExpectRefused(with(Llama32(), "attention_bias", true), "attention_bias is true");
  ExpectRefused(with(Mistral(false), "mlp_bias", true), "mlp_bias is true");
  ExpectRefused(with(Llama32(), "num_hidden_layers", nullptr), "num_hidden_layers is missing");
  ExpectRefused(with(Llama32(), "hidden_size", -4), "hidden_size must be a positive integer, got -4");
  ExpectRefused(with(Llama32(), "vocab_size", "big"), "vocab_size must be a positive integer");
  ExpectRefused(with(Llama32(), "num_key_value_heads", 3), "num_key_value_heads 3 does not divide n_head 32");
  ExpectRefused(with(Llama32(), "head_dim", 63), "head_dim is 63, odd");
  ExpectRefused(with(Llama32(), "tie_word_embeddings", "yes"), "tie_word_embeddings must be true or false");
  ExpectRefused(with(Qwen25(), "use_sliding_window", 1), "use_sliding_window must be true or false");
  ExpectRefused(with(with(Llama32(), "head_dim", nullptr), "num_attention_heads", 30),
                "num_attention_heads 30 does not divide hidden_size 2048");
  ExpectRefused(with(Llama32(), "architectures", {"LlamaForCausalLM", "Extra"}), "architectures must list one");
  auto r = ParseHfConfig("[1, 2]", "DIR/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "DIR/config.json: not a JSON object");
  r = ParseHfConfig("{\"model_type\": \"llama\",", "DIR/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "DIR/config.json: not a JSON object");
}

}  // namespace
}  // namespace pstar

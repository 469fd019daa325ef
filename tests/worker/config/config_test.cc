#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <yaml-cpp/yaml.h>

#include "tests/test_util.h"
#include "worker/config/config.h"
#include "worker/plan/memory_plan.h"

namespace pstar {
namespace {

std::string ErrorOf(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  auto c = ParseConfig(yaml, "job.yaml", overrides);
  EXPECT_FALSE(c.ok()) << "accepted:\n" << yaml;
  if (c.ok()) return "";
  EXPECT_EQ(c.status().message().find('\n'), std::string::npos) << "error must be one line";
  return c.status().message();
}

TEST(Config, DefaultJobParses) {
  auto c = ParseConfig(DefaultConfigYaml(), "default");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model.preset, "tiny");
  EXPECT_EQ(c->data.source, DataSourceKind::kGenerated);
  EXPECT_EQ(c->train.seq_len, 128);
}

TEST(Config, PatrickStarKeysAndPresetOverrides) {
  auto c = ParseConfig(R"(
model: {preset: gpt2-124m, n_layer: 2}
optimizer:
  type: Adam
  params: {lr: 0.001, betas: [0.8, 0.99], eps: 1.0e-6, weight_decay: 0, use_hybrid_adam: true}
fp16: {enabled: false, loss_scale: 0, initial_scale_power: 3, loss_scale_window: 1000, hysteresis: 2, min_loss_scale: 1}
default_chunk_size: 67108864
release_after_init: true
use_cpu_embedding: false
client:
  mem_tracer: {use_async_mem_monitor: true, warmup_gpu_chunk_mem_ratio: 0.1, overall_gpu_mem_ratio: 0.8,
               overall_cpu_mem_ratio: 0.8, margin_use_ratio: 0.8, use_fake_dist: false, with_static_partition: false}
)",
                       "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model.gpt.n_layer, 2);
  EXPECT_EQ(c->model.gpt.n_embd, 768);
  EXPECT_EQ(c->train.seq_len, 1024);  // defaults to max_seq_len
  EXPECT_FLOAT_EQ(c->optimizer.beta1, 0.8f);
  EXPECT_EQ(c->default_chunk_size, 67108864);
  EXPECT_EQ(c->fp16.initial_scale_power, 3);
}

TEST(Config, OverridesApplyBeforeValidation) {
  auto c = ParseConfig(DefaultConfigYaml(), "default", {"train.steps=7", "model.n_layer=1", "data.seed=5"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->train.steps, 7);
  EXPECT_EQ(c->model.gpt.n_layer, 1);
  EXPECT_NE(ErrorOf(DefaultConfigYaml(), {"train.steps"}).find("expected key.path=value"), std::string::npos);
}

TEST(Config, RejectsBadInputNamingTheKey) {
  const std::string m = "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 40, max_seq_len: 12}\n";
  EXPECT_NE(ErrorOf(m + "trian: {steps: 3}\n").find("job.yaml: trian: unknown key"), std::string::npos);
  EXPECT_NE(ErrorOf(m + "train: {stepz: 3}\n").find("train.stepz: unknown key"), std::string::npos);
  EXPECT_NE(ErrorOf("model: {n_layer: -2, n_head: 2, n_embd: 16, vocab_size: 40, max_seq_len: 12}")
                .find("model.n_layer: must be positive, got -2"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {n_layer: 2, n_head: 5, n_embd: 16, vocab_size: 40, max_seq_len: 12}")
                .find("model.n_head: 5 does not divide n_embd 16"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "train: {batch_size: many}\n").find("train.batch_size: expected an integer, got 'many'"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "train: {seq_len: 13}\n").find("train.seq_len: 13 exceeds model.max_seq_len 12"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {n_layer: 2\n").find("job.yaml:"), std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: gpt9}").find("unknown preset 'gpt9'"), std::string::npos);
  EXPECT_NE(ErrorOf(m + "data: {source: text}\n").find("data.path: is required"), std::string::npos);
  EXPECT_NE(ErrorOf(m + "fp16: {enabled: true}\ntrain: {precision: bf16}\n")
                .find("train.precision: is bf16 but fp16.enabled is true"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "train: {precision: fp8}\n").find("train.precision: must be auto, fp32, bf16 or fp16"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "optimizer: {type: SGD}\n").find("optimizer.type"), std::string::npos);
  EXPECT_NE(ErrorOf(m + "optimizer: {params: {betas: [0.9]}}\n").find("optimizer.params.betas"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "client: {mem_tracer: {overall_gpu_mem_ratio: 1.5}}\n")
                .find("client.mem_tracer.overall_gpu_mem_ratio: must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "default_chunk_size: -1\n").find("default_chunk_size: must not be negative"),
            std::string::npos);
  EXPECT_NE(ErrorOf("- just\n- a list\n").find("top level must be a mapping"), std::string::npos);
  EXPECT_NE(ErrorOf("train: {steps: 3}\n").find("model: section is required"), std::string::npos);
}

// Absurd sizes are refused at parse time naming the limit, before anything
// is planned or allocated; the largest accepted sizes plan in bounded time
// and memory (the tests' timeout is the hang guard; no speed is asserted).
TEST(Config, AbsurdSizesAreRefusedNamingTheLimit) {
  const std::string m = "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 40, max_seq_len: 12}\n";
  EXPECT_NE(ErrorOf(m, {"model.n_layer=1000000000000"})
                .find("model.n_layer: is 1000000000000, more than the 10000 layers pstar takes"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m, {"model.n_layer=1000000"}).find("more than the 10000 layers"), std::string::npos);
  EXPECT_NE(ErrorOf(m, {"model.n_embd=2147483648", "model.n_head=1"})
                .find("model.n_embd: is 2147483648, more than the 1048576 channels"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m, {"model.max_seq_len=9000000000"}).find("model.max_seq_len: is 9000000000"), std::string::npos);
  EXPECT_NE(ErrorOf(m, {"model.vocab_size=3000000000"}).find("model.vocab_size: is 3000000000"), std::string::npos);
  // Each size within its bound, the product not.
  EXPECT_NE(ErrorOf(m, {"model.n_embd=1048576", "model.n_head=1", "model.n_layer=100"})
                .find("model: has 1.3"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m, {"train.batch_size=100000000"}).find("train.batch_size: is 100000000"), std::string::npos);
  EXPECT_NE(ErrorOf(m, {"model.max_seq_len=1048576", "train.batch_size=1000", "train.seq_len=1048576"})
                .find("tokens per micro-batch, more than the 16777216"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m, {"model.n_layer=10000", "model.n_embd=8192", "model.n_head=64", "model.max_seq_len=65536",
                        "train.batch_size=256", "train.seq_len=65536"})
                .find("bytes of activations per micro-batch"),
            std::string::npos);
  // The largest model within every bound plans.
  auto big = ParseConfig(m, "job.yaml", {"model.n_layer=10000", "model.n_embd=8192", "model.n_head=64"});
  ASSERT_TRUE(big.ok()) << big.status().message();
  auto plan = PlanMemory(*big);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_GT(plan->model_bytes, int64_t(1e14));
}

TEST(Config, PrecisionResolvesFromDeviceAndFp16) {
  const std::string m = "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 40, max_seq_len: 12}\n";
  auto precision = [&](const std::string& extra, std::vector<std::string> overrides = {}) {
    auto c = ParseConfig(m + extra, "job.yaml", overrides);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? std::string(PrecisionName(c->train.precision)) : std::string("error");
  };
  EXPECT_EQ(precision(""), "fp32");                                   // auto on cpu
  EXPECT_EQ(precision("", {"runtime.device=cuda"}), "bf16");          // auto on a GPU
  EXPECT_EQ(precision("fp16: {enabled: true}\n"), "fp16");            // PatrickStar's key
  EXPECT_EQ(precision("train: {precision: fp16}\n", {"runtime.device=cuda"}), "fp16");
  EXPECT_EQ(precision("train: {precision: fp32}\n", {"runtime.device=cuda"}), "fp32");
  EXPECT_EQ(precision("train: {precision: bf16}\n"), "bf16");        // emulated on the CPU
}

TEST(Config, RuntimeAndMetricsSections) {
  const std::string m = "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 40, max_seq_len: 12}\n";
  auto c = ParseConfig(m + "runtime: {device_memory: 1.5GiB, host_memory: 4000000, eviction: lru, prefetch_depth: 0}\n"
                           "metrics: {port: 9400, bind_address: 127.0.0.1}\n",
                       "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->runtime.device_memory, int64_t(3) << 29);
  EXPECT_EQ(c->runtime.host_memory, 4000000);
  EXPECT_EQ(c->runtime.eviction, EvictionPolicy::kLru);
  EXPECT_EQ(c->runtime.prefetch_depth, 0);
  EXPECT_EQ(c->metrics.port, 9400);
  EXPECT_EQ(c->metrics.bind_address, "127.0.0.1");
  EXPECT_NE(ErrorOf(m + "runtime: {device_memory: 3 parsecs}\n").find("runtime.device_memory: '3 parsecs': unknown unit"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "runtime: {device_memory: [1]}\n").find("runtime.device_memory: expected a byte count"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "runtime: {eviction: fifo}\n").find("runtime.eviction: must be opt or lru"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "runtime: {prefetch_depth: -1}\n").find("runtime.prefetch_depth: must not be negative"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "runtime: {prefetch_depth: 4294967298}\n").find("runtime.prefetch_depth: must be at most"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + "runtime: {devise_memory: 1}\n").find("runtime.devise_memory: unknown key"),
            std::string::npos);
  // The disk tier's settings.
  auto disk = ParseConfig(m + "runtime: {nvme_path: /scratch, nvme_memory: 2GiB, nvme_read_ahead: 4, nvme_io_threads: 8}\n",
                          "job.yaml");
  ASSERT_TRUE(disk.ok()) << disk.status().message();
  EXPECT_EQ(disk->runtime.nvme_path, "/scratch");
  EXPECT_EQ(disk->runtime.nvme_memory, int64_t(2) << 30);
  EXPECT_EQ(disk->runtime.nvme_read_ahead, 4);
  EXPECT_EQ(disk->runtime.nvme_io_threads, 8);
  ASSERT_TRUE(ParseConfig(m + "runtime: {nvme_read_ahead: 2, nvme_io_threads: 2, nvme_spill: auto}\n", "job.yaml").ok())
      << "the defaults, as --print-config writes them";
  EXPECT_EQ(disk->runtime.nvme_spill, DiskSpill::kAuto);
  EXPECT_NE(ErrorOf(m + "runtime: {nvme_path: /scratch, nvme_spill: some}\n").find("runtime.nvme_spill: must be auto or all, got 'some'"),
            std::string::npos);
  for (const char* key : {"nvme_memory: 1GiB", "nvme_read_ahead: 1", "nvme_io_threads: 1", "nvme_spill: all"}) {
    EXPECT_NE(ErrorOf(m + "runtime: {" + key + "}\n").find("is set but runtime.nvme_path (the disk tier's directory) is not"),
              std::string::npos)
        << key;
  }
  const std::string path = "runtime: {nvme_path: /scratch, ";
  EXPECT_NE(ErrorOf(m + path + "nvme_read_ahead: -1}\n").find("runtime.nvme_read_ahead: must not be negative"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + path + "nvme_read_ahead: 17}\n").find("runtime.nvme_read_ahead: must be at most 16, got 17"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + path + "nvme_io_threads: 0}\n").find("runtime.nvme_io_threads: must be positive"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + path + "nvme_io_threads: 65}\n").find("runtime.nvme_io_threads: must be at most 64, got 65"),
            std::string::npos);
  EXPECT_NE(ErrorOf(m + path + "nvme_io_threads: two}\n").find("runtime.nvme_io_threads"), std::string::npos);
  EXPECT_NE(ErrorOf(m + "metrics: {port: 70000}\n").find("metrics.port: must be in [0, 65535]"),
            std::string::npos);
}

TEST(Config, EveryExampleParses) {
  int examples = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::SourceDir() + "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    ++examples;
    // An example that imports names its model too (as a job's CR must), so
    // it parses without the directory at hand.
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto c = ParseConfig(text, entry.path().string(), {}, ConfigOptions{.read_init_from = false});
    EXPECT_TRUE(c.ok()) << entry.path() << ": " << c.status().message();
  }
  EXPECT_GE(examples, 2);
}

TEST(Config, PrintedConfigParsesBackToTheSame) {
  auto c = ParseConfig(DefaultConfigYaml(), "default");
  ASSERT_TRUE(c.ok());
  std::string yaml = ConfigToYaml(*c);
  auto again = ParseConfig(yaml, "printed");
  ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << yaml;
  EXPECT_EQ(ConfigToYaml(*again), yaml);
}

// A PatrickStar config's client.opts is accepted as it is (each names what
// pstar always does); a misspelt one is still refused.
TEST(Config, PatrickStarClientOptsAreAccepted) {
  const std::string m = "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 40, max_seq_len: 12}\n";
  auto c = ParseConfig(m + "client:\n  mem_tracer: {use_async_mem_monitor: true}\n"
                           "  opts: {with_mem_saving_comm: true, with_mem_cache: true, with_async_move: true}\n",
                       "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->client_opts.with_mem_cache);
  EXPECT_NE(ConfigToYaml(*c).find("with_async_move: true"), std::string::npos);
  EXPECT_NE(ErrorOf(m + "client: {opts: {with_mem_cach: true}}\n").find("client.opts.with_mem_cach: unknown key"),
            std::string::npos);
}

// Numbers print in their shortest form that reads back as the same value.
TEST(Config, PrintedNumbersAreShortest) {
  auto c = ParseConfig(DefaultConfigYaml(), "default",
                       {"optimizer.params.lr=0.003", "optimizer.params.eps=1e-8", "train.grad_clip=0.7",
                        "client.mem_tracer.overall_cpu_mem_ratio=0.3"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::string yaml = ConfigToYaml(*c);
  for (const char* line : {"lr: 0.003\n", "eps: 1e-08\n", "grad_clip: 0.7\n", "overall_cpu_mem_ratio: 0.3\n",
                           "betas: [0.9, 0.95]\n"}) {
    EXPECT_NE(yaml.find(line), std::string::npos) << line << " in\n" << yaml;
  }
  auto again = ParseConfig(yaml, "printed");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->optimizer.lr, c->optimizer.lr);
  EXPECT_EQ(again->train.grad_clip, c->train.grad_clip);
}

// Every dotted key of a printed config (a list is one key's value).
void CollectKeys(const YAML::Node& node, const std::string& prefix, std::set<std::string>* out) {
  for (const auto& kv : node) {
    const std::string key = prefix + kv.first.as<std::string>();
    if (kv.second.IsMap()) {
      CollectKeys(kv.second, key + ".", out);
    } else {
      out->insert(key);
    }
  }
}

TEST(Config, DataTokenizerHfReadsTheModelsTokenizerJson) {
  const std::string base = "model: {preset: llama-tiny}\ndata: {source: text, path: a.txt}\n";
  auto c = ParseConfig(base, "job.yaml", {"data.tokenizer=hf", "data.tokenizer_json=Llama-3.1-8B/tokenizer.json"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->data.tokenizer, "hf");
  EXPECT_EQ(c->data.tokenizer_json, "Llama-3.1-8B/tokenizer.json");
  EXPECT_NE(ErrorOf(base, {"data.tokenizer=hf"}).find("data.tokenizer: is hf but needs data.tokenizer_json"),
            std::string::npos);
  EXPECT_NE(ErrorOf(base, {"data.tokenizer=hf", "data.tokenizer_json=t.json", "data.vocab=e.json"})
                .find("GPT-2's files need gpt2"),
            std::string::npos);
  EXPECT_NE(ErrorOf(base, {"data.tokenizer=byte", "data.tokenizer_json=t.json"}).find("they need gpt2 or hf"),
            std::string::npos);
  EXPECT_NE(ErrorOf(base, {"data.tokenizer=sentencepiece"}).find("data.tokenizer"), std::string::npos);
}

TEST(Config, DataTokenizerTiktokenReadsARankFile) {
  const std::string base = "model: {preset: llama-tiny}\ndata: {source: text, path: a.txt}\n";
  auto c = ParseConfig(base, "job.yaml", {"data.tokenizer=tiktoken", "data.tokenizer_ranks=original/tokenizer.model"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->data.tokenizer, "tiktoken");
  EXPECT_EQ(c->data.tokenizer_ranks, "original/tokenizer.model");
  EXPECT_NE(ErrorOf(base, {"data.tokenizer=tiktoken"}).find("data.tokenizer: is tiktoken but needs data.tokenizer_ranks"),
            std::string::npos);
  EXPECT_NE(ErrorOf(base, {"data.tokenizer=tiktoken", "data.tokenizer_ranks=r", "data.tokenizer_json=t.json"})
                .find("is tiktoken, which reads data.tokenizer_ranks, but"),
            std::string::npos);
  EXPECT_NE(ErrorOf(base, {"data.tokenizer=hf", "data.tokenizer_json=t.json", "data.tokenizer_ranks=r"})
                .find("data.tokenizer_ranks: is set but data.tokenizer is hf (a rank file needs tiktoken)"),
            std::string::npos);
  auto jsonl = ParseConfig("model: {preset: llama-tiny}\ndata: {source: jsonl, path: chat.jsonl}\n", "job.yaml",
                           {"data.tokenizer=tiktoken", "data.tokenizer_ranks=r"});
  EXPECT_TRUE(jsonl.ok()) << jsonl.status().message();
}

TEST(Config, DataSourceJsonlTakesTheModelsTokenizerAChatFormatAndAnOverlongRule) {
  const std::string base = "model: {preset: llama-tiny}\ndata: {source: jsonl, path: chat.jsonl}\n";
  const std::vector<std::string> hf = {"data.tokenizer=hf", "data.tokenizer_json=t.json"};
  auto c = ParseConfig(base, "job.yaml", hf);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->data.source, DataSourceKind::kJsonl);
  EXPECT_EQ(c->data.chat_format, "auto");
  EXPECT_EQ(c->data.overlong, "truncate");
  EXPECT_NE(ErrorOf(base, {}).find("data.tokenizer: is none but data.source jsonl needs the model's tokenizer"),
            std::string::npos);
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), hf.begin(), hf.end());
    return ErrorOf(base, more);
  };
  EXPECT_NE(with({"data.chat_format=alpaca"}).find("data.chat_format"), std::string::npos);
  EXPECT_NE(with({"data.overlong=drop"}).find("data.overlong"), std::string::npos);
  EXPECT_TRUE(ParseConfig(base, "job.yaml", {"data.tokenizer=hf", "data.tokenizer_json=t.json", "runtime.device=cuda"}).ok());
  auto dated = ParseConfig(base, "job.yaml", {"data.tokenizer=hf", "data.tokenizer_json=t.json",
                                             "data.chat_format=llama3.1", "data.chat_date=01 Jan 2025"});
  ASSERT_TRUE(dated.ok()) << dated.status().message();
  EXPECT_EQ(dated->data.chat_date, "01 Jan 2025");
  EXPECT_EQ(ParseConfig(base, "job.yaml", hf)->data.chat_date, "26 Jul 2024");
  EXPECT_NE(with({"data.chat_format=llama3", "data.chat_date=01 Jan 2025"})
                .find("data.chat_date: is the date of data.chat_format llama3.1's system block, but the format is llama3"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: llama-tiny}\ndata: {source: jsonl, path: chat.jsonl, tokenizer: hf, "
                    "tokenizer_json: t.json, chat_format: llama3.1, chat_date: \"\"}\n",
                    {})
                .find("data.chat_date: must be one line"),
            std::string::npos);
  // GPT-2's learned positions take packed examples too.
  EXPECT_TRUE(ParseConfig("model: {preset: tiny}\ndata: {source: jsonl, path: chat.jsonl, tokenizer: gpt2, "
                          "tokenizer_json: t.json}\n", "job.yaml", {})
                  .ok());
  EXPECT_NE(ErrorOf("model: {preset: llama-tiny}\ndata: {source: text, path: a.txt, chat_format: llama3}\n", {})
                .find("data.chat_format: is for data.source jsonl, not text"),
            std::string::npos);
}

// One table drives the parser and --print-config: every key the parser takes
// is printed by some config (those that apply only with others, with them),
// in the table's order, and what is printed parses back to the same text.
TEST(Config, EveryKeyTheParserTakesIsPrinted) {
  const std::string m = "model: {preset: tiny, init_from: /models/gpt2}\n";
  const std::vector<std::string> jobs = {
      m,
      // The Llama family's keys: a preset with Llama 3's scaling.
      "model: {preset: llama-3.2-1b}\ntrain: {seq_len: 64}\n",
      m + "data: {source: text, path: a.txt, val_path: b.txt, tokenizer: gpt2, vocab: e.json, merges: v.bpe}\n",
      m + "data: {source: tokens, path: shards, tokenizer: gpt2, tokenizer_json: t.json}\n",
      m + "data: {source: text, path: a.txt, tokenizer: hf, tokenizer_json: t.json}\n",
      m + "data: {source: text, path: a.txt, tokenizer: tiktoken, tokenizer_ranks: tokenizer.model}\n",
      m + "checkpoint: {dir: ckpt, export_dir: hf, export_dtype: bf16}\n",
      "model: {preset: llama-tiny}\ndata: {source: jsonl, path: chat.jsonl, val_path: val.jsonl, tokenizer: hf, "
      "tokenizer_json: t.json, chat_format: qwen3, overlong: error}\n",
      "model: {preset: llama-tiny}\ndata: {source: jsonl, path: chat.jsonl, tokenizer: hf, tokenizer_json: t.json, "
      "chat_format: llama3.1, chat_date: 03 Dec 2026}\n",
  };
  std::set<std::string> printed;
  for (const std::string& job : jobs) {
    // model.init_from names a directory these configs never read.
    auto c = ParseConfig(job, "job.yaml", {}, ConfigOptions{.read_init_from = false});
    ASSERT_TRUE(c.ok()) << c.status().message();
    const std::string yaml = ConfigToYaml(*c);
    CollectKeys(YAML::Load(yaml), "", &printed);
    auto again = ParseConfig(yaml, "printed", {}, ConfigOptions{.read_init_from = false});
    ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << yaml;
    EXPECT_EQ(ConfigToYaml(*again), yaml);
  }
  const std::vector<std::string> keys = ConfigKeyPaths();
  EXPECT_EQ(printed, std::set<std::string>(keys.begin(), keys.end()));
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size()) << "a key listed twice";
  // The parser knows no key beyond the table: each one of them misspelt is
  // refused, naming the section's keys.
  for (const std::string& key : keys) {
    const std::string wrong = key + "x=1";
    const std::string error = ErrorOf("model: {preset: tiny}\n", {wrong});
    EXPECT_NE(error.find(key + "x: unknown key (allowed here: "), std::string::npos) << error;
  }
}

// The decoder's description: presets with their published shapes, the
// architecture's defaults, explicit values written back, and one line for
// each description that does not hold together.
TEST(Config, LlamaFamilyPresetsAndDescription) {
  auto c = ParseConfig("model: {preset: llama-3.1-8b}\ntrain: {seq_len: 128}\n", "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const GptConfig& g = c->model.gpt;
  EXPECT_EQ(g.architecture, Architecture::kLlama);
  EXPECT_EQ(g.n_layer, 32);
  EXPECT_EQ(g.kv_heads(), 8);
  EXPECT_EQ(g.mlp_size(), 14336);
  EXPECT_EQ(g.vocab_size, 128256);
  EXPECT_FALSE(g.tied_embeddings);
  EXPECT_TRUE(g.rope_scaling.llama3);
  EXPECT_EQ(g.rope_scaling.factor, 8.0);
  EXPECT_EQ(g.NumParameters(), 8030261248);  // Llama 3.1 8B's published count
  auto qwen = ParseConfig("model: {preset: qwen2.5-0.5b}\ntrain: {seq_len: 128}\n", "job.yaml");
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  EXPECT_EQ(qwen->model.gpt.linear_bias, LinearBias::kQkv);
  EXPECT_EQ(qwen->model.gpt.NumParameters(), 494032768);  // Qwen2.5 0.5B's, tied
  auto mistral = ParseConfig("model: {preset: mistral-7b-v0.3}\ntrain: {seq_len: 128}\n", "job.yaml");
  ASSERT_TRUE(mistral.ok());
  EXPECT_EQ(mistral->model.gpt.NumParameters(), 7248023552);  // Mistral 7B v0.3's
  // An architecture alone takes its family's defaults.
  auto plain = ParseConfig(
      "model: {architecture: qwen2, n_layer: 2, n_head: 4, n_embd: 32, intermediate_size: 48, vocab_size: 50, "
      "max_seq_len: 16}\n",
      "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->model.gpt.norm, NormKind::kRmsNorm);
  EXPECT_EQ(plain->model.gpt.positions, PositionKind::kRotary);
  EXPECT_EQ(plain->model.gpt.kv_heads(), 4);
  EXPECT_EQ(plain->model.gpt.head_size(), 8);
  EXPECT_EQ(plain->model.gpt.norm_eps, 1e-6);
  // GPT-2 prints none of the Llama family's keys.
  auto gpt2 = ParseConfig("model: {preset: tiny}\n", "job.yaml");
  ASSERT_TRUE(gpt2.ok());
  const std::string yaml = ConfigToYaml(*gpt2);
  EXPECT_NE(yaml.find("architecture: gpt2"), std::string::npos) << yaml;
  for (const char* key : {"n_kv_head", "head_dim", "rope_theta", "norm:", "tie_word_embeddings"}) {
    EXPECT_EQ(yaml.find(key), std::string::npos) << key;
  }
}

TEST(Config, BadDecoderDescriptionsGetOneLine) {
  const std::string llama =
      "model: {architecture: llama, n_layer: 2, n_head: 8, n_kv_head: 2, n_embd: 64, intermediate_size: 96, "
      "vocab_size: 50, max_seq_len: 16}\n";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"model.n_kv_head=3"}, "model.n_kv_head: 3 does not divide n_head 8"},
      {{"model.n_kv_head=16"}, "model.n_kv_head: 16 does not divide n_head 8"},
      {{"model.head_dim=7"}, "model.head_dim: is 7, odd; RoPE rotates pairs of columns"},
      {{"model.positions=learned"}, "model.positions: learned is not llama's positions (llama has rope)"},
      {{"model.norm=layernorm"}, "model.norm: layernorm is not llama's norm (llama has rmsnorm)"},
      {{"model.mlp=gelu"}, "model.mlp: gelu is not llama's MLP (llama has swiglu)"},
      {{"model.linear_bias=qkv"}, "model.linear_bias: qkv is not llama's linear biases (llama has none)"},
      {{"model.rope_scaling.type=llama3", "model.rope_scaling.factor=8"},
       "model.rope_scaling: type llama3 needs low_freq_factor, high_freq_factor, original_max_position_embeddings"},
      {{"model.rope_scaling.factor=8"}, "model.rope_scaling.factor: is set but model.rope_scaling.type is none"},
      {{"model.rope_scaling.type=llama3", "model.rope_scaling.factor=8", "model.rope_scaling.low_freq_factor=4",
        "model.rope_scaling.high_freq_factor=1", "model.rope_scaling.original_max_position_embeddings=64"},
       "model.rope_scaling.high_freq_factor: must be more than low_freq_factor"},
      {{"model.rope_scaling.type=bogus"}, "model.rope_scaling.type: must be none or llama3, got 'bogus'"},
      {{"model.rope_theta=0"}, "model.rope_theta: must be positive"},
      {{"model.norm_eps=0"}, "model.norm_eps: must be positive"},
      {{"model.intermediate_size=0"}, "model.intermediate_size: must be positive"},
      {{"model.intermediate_size=100000000"}, "model.intermediate_size: is 100000000, more than the 8388608"},
      {{"model.head_dim=10000000"}, "model.head_dim: is 10000000, more than the 1048576"},
      {{"model.architecture=gpt3"}, "model.architecture: must be gpt2, llama, qwen2 or mistral, got 'gpt3'"},
      {{"model.init_from=/models/llama"}, "model.init_from: /models/llama/config.json: no such file"},
      {{"model.n_layer=10000", "model.n_embd=1048576", "model.head_dim=128"}, "parameters, more than the"},
  };
  for (const auto& [overrides, expected] : cases) {
    const std::string error = ErrorOf(llama, overrides);
    EXPECT_NE(error.find(expected), std::string::npos) << "got: " << error;
  }
  EXPECT_NE(ErrorOf("model: {architecture: llama, n_layer: 2, n_head: 4, n_embd: 32, vocab_size: 50, max_seq_len: 16}\n")
                .find("model.intermediate_size: is required for llama"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: llama-tiny, architecture: qwen2}\n")
                .find("model.architecture: is qwen2 but model.preset llama-tiny is llama"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: tiny, rope_theta: 10000}\n")
                .find("model.rope_theta: is set but model.positions is learned"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: tiny, n_kv_head: 2}\n").find("model.n_kv_head: must equal n_head"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: tiny, tie_word_embeddings: false}\n")
                .find("model.tie_word_embeddings: must be true: gpt2 ties its embeddings"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {preset: tiny, norm_eps: 0.001}\n").find("model.norm_eps: must be 1e-05 in gpt2"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {architecture: llama, n_layer: 2, n_head: 3, n_embd: 32, intermediate_size: 8, "
                    "vocab_size: 50, max_seq_len: 16}\n")
                .find("model.n_head: 3 does not divide n_embd 32 (or give model.head_dim)"),
            std::string::npos);
}

}  // namespace
}  // namespace pstar

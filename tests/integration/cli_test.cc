// The pstar binary as a user runs it: a short training run (and its profile),
// and bad input that must end with one error line and a non-zero exit, never a crash.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "kernels/cpu/isa.h"
#include "tests/test_util.h"
#include "worker/core/file_util.h"
#include "worker/data/token_shard.h"

namespace pstar {
namespace {

using test::RunProcess;

const char* kTiny =
    "model: {n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 256, max_seq_len: 16}\n"
    "train: {batch_size: 2, seq_len: 8, steps: 3, log_every: 1}\n";

int CountLines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

void ExpectOneLineError(const test::ProcessResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("pstar: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
}

TEST(Cli, TrainsAndPrintsProgressAndSummary) {
  test::TempDir dir("cli");
  test::WriteText(dir.path() + "/job.yaml", kTiny);
  auto r = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step 1/3 | loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" tok/s | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" ms/step | elapsed "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" | ETA "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("summary: steps=3 tokens=48 "), std::string::npos) << r.out;
}

// The CPU kernels' instruction-set variants (kernels/cpu/isa.h): each one this
// build has and this CPU runs trains to the same losses to rounding, the same
// variant twice gives the same bits, `pstar info` names the variant chosen, and
// a PSTAR_CPU_ISA that cannot be honoured is refused in one line.
TEST(Cli, EveryCpuKernelVariantTrainsToTheSameLosses) {
  namespace kc = kernels::cpu;
  test::TempDir dir("cli");
  test::WriteText(dir.path() + "/job.yaml", kTiny);
  auto run = [&](const std::vector<std::string>& argv, const std::string& isa) {
    test::ChildProcess child(argv, {"PSTAR_CPU_ISA=" + isa});
    return child.Wait();
  };
  auto losses = [](const std::string& out) {
    std::vector<double> v;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line[0] != '{') continue;
      v.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    }
    return v;
  };
  const std::vector<std::string> train = {test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml",
                                          "--log-format", "json"};
  std::vector<double> first;
  int variants = 0;
  for (kc::CpuIsa isa : kc::BuiltCpuIsas()) {
    const std::string name = kc::CpuIsaName(isa);
    if (!kc::CpuIsaSupported(isa)) {
      ExpectOneLineError(run({test::PstarBinary(), "info"}, name), "this CPU cannot run that variant");
      continue;
    }
    ++variants;
    const auto info = run({test::PstarBinary(), "info"}, name);
    ASSERT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find("cpu kernels: " + name + " "), std::string::npos) << info.out;
    const auto a = run(train, name);
    const auto b = run(train, name);
    ASSERT_EQ(a.exit_code, 0) << name << ": " << a.err;
    ASSERT_EQ(b.exit_code, 0) << name << ": " << b.err;
    const std::vector<double> la = losses(a.out);
    ASSERT_EQ(la.size(), 3u) << a.out;
    EXPECT_EQ(la, losses(b.out)) << name << ": the same variant, other bits";
    if (first.empty()) first = la;
    for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], first[i], 1e-4 * first[i]) << name << " step " << i + 1;
  }
  EXPECT_GE(variants, 1);
  ExpectOneLineError(run({test::PstarBinary(), "info"}, "x86-64-v9"), "not a CPU kernel variant of this build");
  // Unset or empty: the CPU's best (not this process's choice, which a
  // PSTAR_CPU_ISA around the test may pin).
  kc::CpuIsa best_isa = kc::BuiltCpuIsas().front();
  for (kc::CpuIsa isa : kc::BuiltCpuIsas()) {
    if (kc::CpuIsaSupported(isa)) best_isa = isa;
  }
  const auto best = run({test::PstarBinary(), "info"}, "");
  EXPECT_NE(best.out.find(std::string("cpu kernels: ") + kc::CpuIsaName(best_isa) + " "), std::string::npos)
      << best.out;
}

// `pstar info` names the OpenBLAS kernels the process runs (their rounding is
// the GEMMs'), and OPENBLAS_CORETYPE pins them: Prescott's SSE3 kernels run on
// every x86-64 CPU.
TEST(Cli, InfoNamesTheOpenBlasKernels) {
  const auto own = RunProcess({test::PstarBinary(), "info"});
  ASSERT_EQ(own.exit_code, 0) << own.err;
  EXPECT_NE(own.out.find("BLAS: OpenBLAS, " + kernels::cpu::BlasCoreName() + " kernels"), std::string::npos)
      << own.out;
#if defined(__x86_64__)
  test::ChildProcess pinned({test::PstarBinary(), "info"}, {"OPENBLAS_CORETYPE=Prescott"});
  const auto p = pinned.Wait();
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("BLAS: OpenBLAS, Prescott kernels"), std::string::npos) << p.out;
#endif
}

// --log-format json: each progress line is one JSON object a tool can read.
TEST(Cli, JsonProgressLines) {
  test::TempDir dir("cli");
  test::WriteText(dir.path() + "/job.yaml", kTiny);
  auto r = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--log-format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  int objects = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    ++objects;
    EXPECT_EQ(j["step"], objects);  // log_every 1: every step
    EXPECT_EQ(j["steps"], 3);
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "ms_per_step", "elapsed_s", "eta_s",
                            "h2d_bytes", "d2h_bytes", "loss_scale", "skipped"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << line;
    }
    EXPECT_GT(j["loss"].get<double>(), 0.0);
  }
  EXPECT_EQ(objects, 3) << r.out;
  EXPECT_EQ(r.out.find("step 1/3 |"), std::string::npos) << r.out;
  ExpectOneLineError(RunProcess({test::PstarBinary(), "train", "--log-format", "xml"}),
                     "--log-format: expected text or json, got 'xml'");
}

TEST(Cli, TrainsOnTextAndTokenShards) {
  test::TempDir dir("cli");
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  test::WriteText(dir.path() + "/corpus.txt", text);
  test::WriteText(dir.path() + "/job.yaml", kTiny);
  auto on_text = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                             "data={source: text, path: " + dir.path() + "/corpus.txt}"});
  ASSERT_EQ(on_text.exit_code, 0) << on_text.err;
  auto tok = RunProcess({test::PstarBinary(), "tokenize", "--input", dir.path() + "/corpus.txt", "--output",
                         dir.path() + "/corpus.bin"});
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  auto on_shard = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                              "data={source: tokens, path: " + dir.path() + "/corpus.bin}"});
  ASSERT_EQ(on_shard.exit_code, 0) << on_shard.err;
  // Same tokens, same seed: the same run.
  // The summary's losses only: the lines after it carry timings.
  auto losses = [](const std::string& out) {
    size_t at = out.find("final_loss=");
    return at == std::string::npos ? std::string("none") : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_NE(losses(on_text.out), "none") << on_text.out;
  EXPECT_EQ(losses(on_text.out), losses(on_shard.out));
}

TEST(Cli, BadInputGetsOneLineAndExitTwo) {
  test::TempDir dir("cli");
  const std::string bin = test::PstarBinary();
  auto with = [&](const std::string& yaml) {
    test::WriteText(dir.path() + "/bad.yaml", yaml);
    return RunProcess({bin, "train", "--config", dir.path() + "/bad.yaml"});
  };
  ExpectOneLineError(RunProcess({bin, "train", "--config", dir.path() + "/missing.yaml"}), "missing.yaml: no such file");
  ExpectOneLineError(with("model: {n_layer: 2\n  oops: ["), "YAML syntax error");
  ExpectOneLineError(with(""), "config file is empty");
  ExpectOneLineError(with(std::string(kTiny) + "colour: blue\n"), "colour: unknown key");
  ExpectOneLineError(with("model: {n_layer: 1, n_head: 2, n_embd: -16, vocab_size: 256, max_seq_len: 16}\n"),
                     "model.n_embd: must be positive, got -16");
  ExpectOneLineError(with("model: {n_layer: 1, n_head: 3, n_embd: 16, vocab_size: 256, max_seq_len: 16}\n"),
                     "model.n_head: 3 does not divide n_embd 16");
  ExpectOneLineError(with(std::string(kTiny) + "data: {source: tokens, path: " + dir.path() + "/none.bin}\n"),
                     "none.bin: no such file");

  ASSERT_TRUE(WriteTokenShard(dir.path() + "/big.bin", std::vector<int32_t>(100, 300), 512).ok());
  ExpectOneLineError(with(std::string(kTiny) + "data: {source: tokens, path: " + dir.path() + "/big.bin}\n"),
                     "vocabulary mismatch");
  ASSERT_TRUE(WriteTokenShard(dir.path() + "/cut.bin", std::vector<int32_t>(100, 3), 256).ok());
  std::filesystem::resize_file(dir.path() + "/cut.bin", 32 + 150);
  ExpectOneLineError(with(std::string(kTiny) + "data: {source: tokens, path: " + dir.path() + "/cut.bin}\n"),
                     "truncated token shard");
  ASSERT_TRUE(WriteTokenShard(dir.path() + "/short.bin", std::vector<int32_t>(10, 3), 256).ok());
  ExpectOneLineError(with(std::string(kTiny) + "data: {source: tokens, path: " + dir.path() + "/short.bin}\n"),
                     "fewer than one step needs");

  ExpectOneLineError(RunProcess({bin, "train", "--bogus"}), "unknown option '--bogus'");
  ExpectOneLineError(RunProcess({bin, "frobnicate"}), "unknown command 'frobnicate'");
  ExpectOneLineError(RunProcess({bin, "train", "--set", "train.steps=-3"}), "train.steps: must be positive");
}

// runtime.device cuda where no GPU is visible (CUDA_VISIBLE_DEVICES empty hides
// any, so this runs the same on GPU hosts) or in a build without CUDA.
TEST(Cli, CudaWithoutAVisibleGpuGetsOneLine) {
  test::TempDir dir("cli");
  test::WriteText(dir.path() + "/job.yaml", kTiny);
  test::ChildProcess p({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                        "runtime.device=cuda"},
                       {"CUDA_VISIBLE_DEVICES="});
  ExpectOneLineError(p.Wait(), "runtime.device: cuda needs a");
  ExpectOneLineError(RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                                 "runtime.device=tpu"}),
                     "runtime.device");
}

TEST(Cli, TokenizeWritesNothingOnFailure) {
  test::TempDir dir("cli");
  auto r = RunProcess({test::PstarBinary(), "tokenize", "--input", dir.path() + "/absent.txt", "--output",
                       dir.path() + "/out.bin"});
  ExpectOneLineError(r, "absent.txt");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Special files and unsafe outputs: a FIFO (which would block an open), a
// device (which never ends), a device node as output (never replaced), the
// input as output, a missing output directory and an absurd model: each one
// error line and exit 2, promptly (the test's timeout guards against a hang).
TEST(Cli, SpecialFilesAndUnsafeOutputsAreRefused) {
  test::TempDir dir("cli");
  const std::string bin = test::PstarBinary();
  const std::string fifo = dir.path() + "/fifo", text = dir.path() + "/in.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  test::WriteText(text, "some text to keep\n");
  const std::string not_regular = "not a regular file";
  ExpectOneLineError(RunProcess({bin, "tokenize", "--input", fifo, "--output", dir.path() + "/o.bin"}), not_regular);
  ExpectOneLineError(RunProcess({bin, "tokenize", "--input", "/dev/zero", "--output", dir.path() + "/o.bin"}),
                     not_regular);
  ExpectOneLineError(RunProcess({bin, "tokenize", "--input", text, "--output", "/dev/null"}),
                     "/dev/null: exists and is not a regular file");
  EXPECT_FALSE(std::filesystem::is_regular_file("/dev/null"));
  ExpectOneLineError(RunProcess({bin, "tokenize", "--input", text, "--output", text}), "is the input file");
  EXPECT_EQ(*ReadFile(text), "some text to keep\n");
  ExpectOneLineError(RunProcess({bin, "tokenize", "--input", text, "--output", dir.path() + "/no/such/out.bin"}),
                     "does not exist");
  for (const char* data : {"data.source=text", "data.source=tokens"}) {
    ExpectOneLineError(RunProcess({bin, "train", "--set", data, "--set", "data.path=" + fifo}), not_regular);
  }
  ExpectOneLineError(RunProcess({bin, "train", "--set", "data.source=text", "--set", "data.path=/dev/zero"}),
                     not_regular);
  ExpectOneLineError(RunProcess({bin, "plan", "--set", "model.n_layer=1000000000000"}),
                     "model.n_layer: is 1000000000000, more than the 10000 layers pstar takes");
  ExpectOneLineError(RunProcess({bin, "train", "--set", "model.n_embd=2147483648", "--set", "model.n_head=1"}),
                     "model.n_embd: is 2147483648, more than the 1048576 channels");
}

// A Llama-family model trains through the CLI on text, and `pstar sample`
// reads its checkpoint: bytes with the byte tokenizer, token ids with
// --prompt-ids (the same ids for the same seed); bad descriptions and ids get
// one line and exit 2.
TEST(Cli, LlamaTrainsAndSamplesBytesAndIds) {
  test::TempDir dir("cli-llama");
  const std::string bin = test::PstarBinary();
  const std::string text = dir.path() + "/in.txt", ckpt = dir.path() + "/ckpt";
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "the chunk moves to the device. ";
  test::WriteText(text, corpus);
  auto r = RunProcess({bin, "train", "--set", "model.preset=llama-tiny", "--set", "data.source=text", "--set",
                       "data.path=" + text, "--set", "train.steps=3", "--set", "train.seq_len=32", "--set",
                       "train.batch_size=2", "--set", "checkpoint.dir=" + ckpt, "--set", "checkpoint.every_steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("summary:"), std::string::npos) << r.out;
  auto bytes = RunProcess({bin, "sample", "--checkpoint", ckpt, "--prompt", "the ", "--tokens", "8", "--seed", "3"});
  ASSERT_EQ(bytes.exit_code, 0) << bytes.err;
  EXPECT_EQ(bytes.out.rfind("the ", 0), 0u) << bytes.out;
  const std::vector<std::string> ids_args = {bin, "sample", "--checkpoint", ckpt, "--prompt-ids", "116 104 101",
                                             "--tokens", "5", "--seed", "9"};
  auto ids = RunProcess(ids_args);
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::istringstream in(ids.out);
  std::vector<long> got;
  for (long v; in >> v;) got.push_back(v);
  ASSERT_EQ(got.size(), 8u) << ids.out;
  EXPECT_EQ((std::vector<long>{got[0], got[1], got[2]}), (std::vector<long>{116, 104, 101}));
  for (long v : got) EXPECT_TRUE(v >= 0 && v < 512) << v;
  EXPECT_EQ(RunProcess(ids_args).out, ids.out) << "the same seed gives the same ids";
  ExpectOneLineError(RunProcess({bin, "sample", "--checkpoint", ckpt, "--prompt-ids", "1 600"}),
                     "--prompt-ids must be an integer in 0..511, got '600'");
  ExpectOneLineError(RunProcess({bin, "sample", "--checkpoint", ckpt, "--prompt-ids", "1", "--prompt", "a"}),
                     "give either --prompt or --prompt-ids");
  ExpectOneLineError(RunProcess({bin, "plan", "--set", "model.preset=llama-tiny", "--set", "model.n_kv_head=3"}),
                     "model.n_kv_head: 3 does not divide n_head 4");
  ExpectOneLineError(RunProcess({bin, "train", "--set", "model.preset=llama-tiny", "--set", "model.positions=learned"}),
                     "model.positions: learned is not llama's positions (llama has rope)");
  ExpectOneLineError(RunProcess({bin, "plan", "--set", "model.preset=llama-tiny", "--set", "model.head_dim=33"}),
                     "model.head_dim: is 33, odd");
  // Its checkpoint exports as a Hugging Face directory (BF16, two shards),
  // which a run then takes its whole model from.
  auto exported = RunProcess({bin, "export", "--checkpoint", ckpt, "--output", dir.path() + "/hf", "--max-shard-size",
                              "1MB"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_NE(exported.out.find("exported step 3 ("), std::string::npos) << exported.out;
  EXPECT_NE(exported.out.find("BF16) to " + dir.path() + "/hf: 2 weight file(s) with model.safetensors.index.json"),
            std::string::npos)
      << exported.out;
  auto from = RunProcess({bin, "train", "--print-config", "--set", "model.init_from=" + dir.path() + "/hf"});
  ASSERT_EQ(from.exit_code, 0) << from.err;
  EXPECT_NE(from.out.find("architecture: llama"), std::string::npos) << from.out;
  EXPECT_NE(from.out.find("n_kv_head: 2"), std::string::npos) << from.out;
  ExpectOneLineError(RunProcess({bin, "export", "--checkpoint", ckpt, "--output", dir.path() + "/o", "--dtype", "int8"}),
                     "export: --dtype must be fp32, bf16 or fp16, got 'int8'");
  ExpectOneLineError(
      RunProcess({bin, "export", "--checkpoint", ckpt, "--output", dir.path() + "/o", "--max-shard-size", "0"}),
      "export: --max-shard-size must be a positive byte count");
  ExpectOneLineError(RunProcess({bin, "train", "--set", "model.init_from=" + dir.path() + "/hf", "--set",
                                 "model.n_layer=7"}),
                     "model.n_layer: is 7 but " + dir.path() + "/hf/config.json has 4");
  // Fine-tuning from that directory exports the result when training ends.
  auto tuned = RunProcess({bin, "train", "--set", "model.init_from=" + dir.path() + "/hf", "--set", "data.source=text",
                           "--set", "data.path=" + text, "--set", "train.steps=2", "--set", "train.seq_len=32", "--set",
                           "train.batch_size=2", "--set", "checkpoint.dir=" + dir.path() + "/tuned-ckpt", "--set",
                           "checkpoint.export_dir=" + dir.path() + "/tuned", "--set", "checkpoint.export_dtype=fp16"});
  ASSERT_EQ(tuned.exit_code, 0) << tuned.err;
  EXPECT_NE(tuned.out.find("export: step 2 ("), std::string::npos) << tuned.out;
  EXPECT_NE(tuned.out.find("F16) written to " + dir.path() + "/tuned in 1 weight file(s)"), std::string::npos)
      << tuned.out;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/tuned/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/tuned/config.json"));
  ExpectOneLineError(RunProcess({bin, "train", "--set", "checkpoint.export_dir=" + dir.path() + "/x"}),
                     "checkpoint.export_dir: needs checkpoint.dir: the export is of the final checkpoint");
  ExpectOneLineError(RunProcess({bin, "train", "--set", "checkpoint.dir=" + dir.path() + "/y", "--set",
                                 "checkpoint.export_dir=" + dir.path() + "/x", "--set", "checkpoint.export_dtype=int4"}),
                     "checkpoint.export_dtype: must be");
  // A CUDA run of this architecture is refused before it starts.
  ExpectOneLineError(
      RunProcess({bin, "train", "--set", "model.preset=llama-tiny", "--set", "runtime.device=cuda"}),
      "runtime.device");
}

// pstar train --chunk-events FILE: the CSV is written when the run ends; a
// missing or empty value is refused in one line.
TEST(Cli, ChunkEventsAreWrittenAndABadValueIsRefused) {
  test::TempDir dir("chunk-events");
  const std::string bin = test::PstarBinary(), csv = dir.path() + "/events.csv";
  const test::ProcessResult r = RunProcess({bin, "train", "--set", "train.steps=2", "--chunk-events", csv});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto text = ReadFile(csv);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(text->rfind("seq,step,event,chunk,time_s\n", 0), 0u);
  EXPECT_NE(text->find(",forward_use,"), std::string::npos);
  EXPECT_NE(text->find(",update_end,"), std::string::npos);
  ExpectOneLineError(RunProcess({bin, "train", "--chunk-events"}), "--chunk-events needs a file to write");
  ExpectOneLineError(RunProcess({bin, "train", "--chunk-events="}), "--chunk-events needs a file to write");
}

// pstar plan --scale: the step-time table for 1 GPU up to the cluster's;
// bad cluster flags get one line and exit 2.
TEST(Cli, PlanScalePrintsTheTableAndRefusesBadClusterFlags) {
  const std::string bin = test::PstarBinary();
  const std::vector<std::string> job = {bin, "plan", "--scale", "--set", "model.preset=gpt2-124m", "--set",
                                        "runtime.device=cuda", "--set", "train.batch_size=2", "--gpu-memory",
                                        "16GiB", "--host-memory", "16GiB"};
  std::vector<std::string> two_nodes = job;
  two_nodes.insert(two_nodes.end(), {"--gpus", "16"});
  const test::ProcessResult r = RunProcess(two_nodes);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rate: compute_tflops 320.8 TFLOP/s (measured: bench/RESULTS.md"), std::string::npos) << r.out;
  for (const char* row : {"\n     1     1 ", "\n     8     1 ", "\n    16     2 "}) {
    EXPECT_NE(r.out.find(row), std::string::npos) << row << r.out;
  }
  auto bad = [&](std::vector<std::string> flags, const std::string& needle) {
    std::vector<std::string> argv = job;
    argv.insert(argv.end(), flags.begin(), flags.end());
    ExpectOneLineError(RunProcess(argv), needle);
  };
  bad({"--inter-bw", "0"}, "--inter-bw: expected a positive number, got '0'");
  bad({"--intra-bw", "-5"}, "--intra-bw: expected a positive number");
  bad({"--gpus", "12"}, "--gpus: 12 GPUs are not whole nodes of 8 (--gpus-per-node)");
  bad({"--nodes", "200000"}, "at most 1048576 GPUs");
  bad({"--gpus", "2000000"}, "--gpus: expected a whole number from 1 to 1048576");
  bad({"--gpus-per-node", "2.5"}, "--gpus-per-node: expected a whole number");
  bad({"--tflops"}, "--tflops needs a value");
  // Flags that would be ignored are refused.
  bad({"--gpus", "16", "--nodes", "2"}, "--gpus and --nodes: give one of them");
  bad({"--world-size", "2"}, "--world-size: --scale plans every world size up to --gpus");
  bad({"--payload"}, "--payload: not with --scale");
  ExpectOneLineError(RunProcess({bin, "plan", "--nodes", "4"}), "--nodes is a flag of --scale");
  ExpectOneLineError(RunProcess({bin, "plan", "--inter-bw", "100"}), "--inter-bw is a flag of --scale");

  // --json: the same rows, times in seconds, and where each rate came from.
  std::vector<std::string> json_argv = two_nodes;
  json_argv.push_back("--json");
  const test::ProcessResult js = RunProcess(json_argv);
  ASSERT_EQ(js.exit_code, 0) << js.err;
  const auto j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j["rows"].size(), 5u) << js.out;  // 1, 2, 4, 8 and 16 GPUs
  const auto& last = j["rows"].back();
  EXPECT_EQ(last["gpus"].get<int64_t>(), 16);
  EXPECT_EQ(last["nodes"].get<int64_t>(), 2);
  EXPECT_TRUE(last["fits"].get<bool>());
  EXPECT_GT(last["step_overlap_s"].get<double>(), 0.0);
  EXPECT_GE(last["step_sync_s"].get<double>(), last["step_overlap_s"].get<double>());
  EXPECT_EQ(j["cluster"]["nodes"].get<int64_t>(), 2);
  EXPECT_EQ(j["rates"][0]["name"], "compute_tflops");
  EXPECT_NE(j["rates"][0]["source"].get<std::string>().find("bench/RESULTS.md"), std::string::npos);
  char ovl[32];
  std::snprintf(ovl, sizeof ovl, " %.1f ", 1e3 * last["step_overlap_s"].get<double>());
  const size_t row16 = r.out.find("\n    16     2 ");
  ASSERT_NE(row16, std::string::npos);
  EXPECT_NE(r.out.substr(row16, r.out.find('\n', row16 + 1) - row16).find(ovl), std::string::npos) << ovl << r.out;

  // An absurd flag gives absurd but readable cells, each row on a line.
  std::vector<std::string> slow = two_nodes;
  slow.insert(slow.end(), {"--pcie-bw", "1e-300"});
  const test::ProcessResult s = RunProcess(slow);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("e+"), std::string::npos) << s.out;
  for (const char* row : {"\n     1     1 ", "\n    16     2 "}) {
    const size_t at = s.out.find(row);
    ASSERT_NE(at, std::string::npos) << row << s.out;
    EXPECT_LT(s.out.find('\n', at + 1) - at, 160u) << s.out;
  }
}

// pstar plan --payload: the collectives' bytes per step of one rank of N,
// counted by running the job's chunk traffic. With every chunk resident each
// param chunk is gathered once a step (after its update) and each gradient
// chunk reduce-scattered once: (N-1)/N of the chunks' bytes each.
TEST(Cli, PlanPayloadCountsTheStepsCollectives) {
  test::TempDir dir("cli");
  test::WriteText(dir.path() + "/job.yaml", kTiny);
  const std::string bin = test::PstarBinary();
  const std::vector<std::string> job = {bin, "plan", "--config", dir.path() + "/job.yaml", "--set",
                                        "default_chunk_size=4096", "--set", "model.n_layer=3"};
  auto with = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = job;
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunProcess(argv);
  };
  const test::ProcessResult plan = with({"--world-size", "2", "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const auto p = nlohmann::json::parse(plan.out);
  const int64_t chunk_bytes = p["chunk_bytes"], chunks = p["chunks_per_kind"];
  ASSERT_GT(chunks, 2);
  const test::ProcessResult r = with({"--world-size", "2", "--payload", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto payload = nlohmann::json::parse(r.out)["payload"];
  EXPECT_EQ(payload["all_gather_bytes_per_step"].get<int64_t>(), chunks * chunk_bytes / 2) << r.out;
  EXPECT_EQ(payload["reduce_scatter_bytes_per_step"].get<int64_t>(), chunks * chunk_bytes / 2) << r.out;
  EXPECT_TRUE(payload["steady"].get<bool>()) << r.out;
  // In text, the same numbers; at the smallest budget more is gathered.
  const test::ProcessResult text = with({"--world-size", "2", "--payload"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("payload: all_gather_bytes_per_step=" + std::to_string(chunks * chunk_bytes / 2) +
                          " reduce_scatter_bytes_per_step="),
            std::string::npos)
      << text.out;
  const test::ProcessResult tight =
      with({"--world-size", "2", "--payload", "--json", "--set",
            "runtime.device_memory=" + std::to_string(p["min_device_bytes"].get<int64_t>())});
  ASSERT_EQ(tight.exit_code, 0) << tight.err;
  EXPECT_GT(nlohmann::json::parse(tight.out)["payload"]["all_gather_bytes_per_step"].get<int64_t>(),
            chunks * chunk_bytes / 2);
  ExpectOneLineError(with({"--payload"}), "--payload needs --world-size of at least 2");
  const test::ProcessResult gpu = with({"--world-size", "2", "--payload", "--set", "runtime.device=cuda"});
  EXPECT_NE(gpu.exit_code, 0);
  EXPECT_EQ(CountLines(gpu.err), 1) << gpu.err;
  EXPECT_NE(gpu.err.find("simulated for CPU jobs"), std::string::npos) << gpu.err;
}

// Config that would be silently half-read is refused: duplicate keys, a key
// with no value (in the file or through --set), and a checkpoint.dir that
// cannot be written, found before the first step rather than at the first save.
TEST(Cli, SilentConfigMistakesAreRefusedUpFront) {
  test::TempDir dir("cli");
  const std::string bin = test::PstarBinary();
  test::WriteText(dir.path() + "/dup.yaml", std::string(kTiny) + "checkpoint: {keep: 2, keep: 5}\n");
  ExpectOneLineError(RunProcess({bin, "train", "--config", dir.path() + "/dup.yaml"}),
                     "checkpoint.keep: appears twice");
  test::WriteText(dir.path() + "/null.yaml", std::string(kTiny) + "checkpoint: {keep: ~}\n");
  ExpectOneLineError(RunProcess({bin, "train", "--config", dir.path() + "/null.yaml"}), "checkpoint.keep: has no value");
  ExpectOneLineError(RunProcess({bin, "train", "--set", "train.steps="}), "train.steps: has no value");
  test::WriteText(dir.path() + "/a-file", "not a directory");
  auto r = RunProcess({bin, "train", "--set", "checkpoint.dir=" + dir.path() + "/a-file/ckpt"});
  ExpectOneLineError(r, "checkpoint.dir: " + dir.path() + "/a-file/ckpt: cannot create the directory");
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << r.out;
}

// Every command has its own help (exit 0, on stdout), `pstar help COMMAND`
// prints the same, and --version the build's version.
TEST(Cli, HelpPerCommandAndVersion) {
  const std::string bin = test::PstarBinary();
  for (const char* command : {"train", "plan", "tokenize", "export", "info", "launch"}) {
    SCOPED_TRACE(command);
    auto r = RunProcess({bin, command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind(std::string("usage: pstar ") + command, 0), 0u) << r.out;
    EXPECT_TRUE(r.err.empty()) << r.err;
    auto h = RunProcess({bin, "help", command});
    EXPECT_EQ(h.exit_code, 0);
    EXPECT_EQ(h.out, r.out);
  }
  EXPECT_NE(RunProcess({bin, "train", "-h"}).out.find("--print-config"), std::string::npos);
  auto general = RunProcess({bin, "help"});
  EXPECT_EQ(general.exit_code, 0);
  EXPECT_NE(general.out.find("commands:"), std::string::npos);
  auto version = RunProcess({bin, "--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("pstar 0.", 0), 0u) << version.out;
  ExpectOneLineError(RunProcess({bin, "help", "bogus"}), "help: unknown command 'bogus'");
}

TEST(Cli, PrintConfigShowsEffectiveValues) {
  auto r = RunProcess({test::PstarBinary(), "train", "--print-config", "--set", "train.steps=5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("steps: 5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n_layer: 4"), std::string::npos);
}

// --profile ends the output with the profile block: a "profile:" line over the
// measured steps, then one line per op (by pass, GEMMs by layer role and
// pass), the idle time, each copy direction (and, with more ranks,
// collective). Without the flag there is no block.
TEST(Cli, ProfilePrintsTimePerOpAndCopyDirectionAtTheEnd) {
  test::TempDir dir("cli");
  test::WriteText(dir.path() + "/job.yaml", kTiny);
  auto r = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--profile"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("\nprofile: 2 steps (1 warm-up step left out) | step time ");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::vector<std::string> lines;
  std::istringstream block(r.out.substr(at + 1));
  for (std::string line; std::getline(block, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), 2u) << r.out;
  std::set<std::string> names;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::istringstream fields(lines[i]);
    std::string kind, name, count, calls;
    fields >> kind >> name >> count >> calls;
    EXPECT_EQ(lines[i].rfind("  ", 0), 0u) << lines[i];
    EXPECT_EQ(calls, "calls") << lines[i];
    EXPECT_TRUE(kind == "op" || kind == "move") << lines[i];
    names.insert(kind + " " + name);
    if (kind == "op") {
      EXPECT_GT(std::stoll(count), 0) << lines[i];
    }
  }
  for (const char* want :
       {"op encoder.fwd", "op encoder.bwd", "op layernorm.fwd", "op layernorm.bwd", "op gemm.qkv.fwd",
        "op gemm.qkv.dinp", "op gemm.qkv.dweight", "op gemm.attn_proj.fwd", "op gemm.fc.dinp",
        "op gemm.fc_proj.dweight", "op gemm.classifier.fwd", "op gemm.classifier.dinp",
        "op gemm.classifier.dweight", "op bias_grad", "op attention.fwd", "op attention.bwd", "op gelu.fwd",
        "op gelu.bwd", "op residual", "op cross_entropy", "op loss_sum", "op upload", "op zero", "op grad_norm",
        "op adam", "op idle", "move h2d", "move d2h"}) {
    EXPECT_EQ(names.count(want), 1u) << want << " in\n" << r.out;
  }
  EXPECT_EQ(names.size(), lines.size() - 1) << "one line per entry";

  auto plain = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("profile:"), std::string::npos) << plain.out;
  // The same run either way.
  EXPECT_EQ(plain.out.substr(plain.out.find("final_loss=")).substr(0, 40),
            r.out.substr(r.out.find("final_loss=")).substr(0, 40));
}

}  // namespace
}  // namespace pstar

// Sharded checkpoints: round trips, re-sharding between world sizes, damaged
// checkpoints and interrupted saves. Several ranks are played in one process,
// either in turn through the per-rank steps (checkpoint_dir.h) or as threads
// through SaveCheckpoint / LoadLatestCheckpoint. Pieces in device memory are
// played by FakeDevice.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/checkpoint_dir.h"
#include "worker/ckpt/crc64.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/file_util.h"
#include "worker/model/gpt.h"

namespace pstar {
namespace {

namespace fs = std::filesystem;

// A rank of a world that exists only in the test: collectives leave the data
// as it is, which is what each rank would see if all ranks agreed.
class FakeRankCommunicator final : public Communicator {
 public:
  FakeRankCommunicator(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Status AllGather(const float*, float*, int64_t) override { return Status::Internal("not in this test"); }
  Status ReduceScatter(const float*, float*, int64_t) override { return Status::Internal("not in this test"); }
  Status AllReduceSum(double*, int64_t) override { return Status::Ok(); }
  Status Broadcast(void*, int64_t, int) override { return Status::Ok(); }
  Status Barrier() override { return Status::Ok(); }

 private:
  int rank_, world_size_;
};

const GptConfig kModel{2, 2, 16, 40, 8};
const StateKind kKinds[] = {StateKind::kParam, StateKind::kExpAvg, StateKind::kExpAvgSq};

// The value of every element of every state in checkpoint `version`.
float Truth(StateKind kind, TensorId id, int64_t i, uint64_t version) {
  uint64_t x = (uint64_t(kind) << 56) ^ (uint64_t(id) << 40) ^ uint64_t(i) ^ (version * 0x9e3779b97f4a7c15ull);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(1 << 20);
}

// What one rank of a ZeRO world holds: shard `rank` of every chunk of `layout`.
struct RankState {
  std::vector<std::vector<float>> buffers;
  std::vector<OwnedRange> ranges;
  std::vector<TensorId> ids;  // per range
};

RankState ShardOf(const ParamLayout& layout, int world, int rank) {
  RankState s;
  const int64_t shard = layout.chunk_elems() / world;
  const int64_t lo = rank * shard, hi = lo + shard;
  for (StateKind kind : kKinds) {
    for (int32_t c = 0; c < layout.num_chunks(); ++c) {
      for (TensorId id : layout.chunk_tensors(c)) {
        const int64_t off = layout.placement(id).offset, n = layout.spec(id).numel();
        const int64_t b = std::max(lo, off), e = std::min(hi, off + n);
        if (b >= e) continue;
        s.buffers.emplace_back(size_t(e - b), 0.0f);
        s.ranges.push_back({kind, layout.spec(id).name, b - off, e - off, s.buffers.back().data()});
        s.ids.push_back(id);
      }
    }
  }
  for (size_t i = 0; i < s.ranges.size(); ++i) s.ranges[i].data = s.buffers[i].data();
  return s;
}

void FillTruth(RankState& s, uint64_t version) {
  for (size_t i = 0; i < s.ranges.size(); ++i) {
    const OwnedRange& r = s.ranges[i];
    for (int64_t k = r.begin; k < r.end; ++k) r.data[k - r.begin] = Truth(r.kind, s.ids[i], k, version);
  }
}

void Zero(RankState& s) {
  for (auto& b : s.buffers) std::fill(b.begin(), b.end(), 0.0f);
}

// Number of elements that differ from checkpoint `version`, bit for bit.
int64_t Mismatches(const RankState& s, uint64_t version) {
  int64_t bad = 0;
  for (size_t i = 0; i < s.ranges.size(); ++i) {
    const OwnedRange& r = s.ranges[i];
    for (int64_t k = r.begin; k < r.end; ++k) {
      const float want = Truth(r.kind, s.ids[i], k, version);
      bad += std::memcmp(&r.data[k - r.begin], &want, sizeof(float)) != 0;
    }
  }
  return bad;
}

ParamLayout Layout(int64_t chunk_elems) { return *ParamLayout::Build(GptTensorSpecs(kModel), chunk_elems); }

TrainingState StateAt(int64_t step) {
  TrainingState s;
  s.step = step;
  s.data_position = step * 4096 + 17;
  s.optimizer_steps = step - 1;
  s.loss_scale = 0.1 * double(step) + 1.0 / 3.0;  // not exact in decimal
  s.layout_fingerprint = LayoutFingerprint(GptTensorSpecs(kModel));
  s.model = kModel;
  return s;
}

void ExpectSameState(const TrainingState& a, const TrainingState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.data_position, b.data_position);
  EXPECT_EQ(a.optimizer_steps, b.optimizer_steps);
  EXPECT_EQ(0, std::memcmp(&a.loss_scale, &b.loss_scale, sizeof(double))) << a.loss_scale << " vs " << b.loss_scale;
  EXPECT_EQ(a.layout_fingerprint, b.layout_fingerprint);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_embd, b.model.n_embd);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
}

// Writes checkpoint `step` (data version `step`) as `world` ranks would, in turn.
void SaveAsWorld(const std::string& root, int world, int64_t chunk_elems, int64_t step, int64_t keep = 0) {
  const ParamLayout layout = Layout(chunk_elems);
  ASSERT_TRUE(PrepareStagingDir(root, step).ok());
  for (int r = 0; r < world; ++r) {
    RankState s = ShardOf(layout, world, r);
    FillTruth(s, uint64_t(step));
    Status st = WriteRankFile(StagingDir(root, step), r, world, step, s.ranges);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  Status st = PublishCheckpoint(root, world, StateAt(step), keep);
  ASSERT_TRUE(st.ok()) << st.message();
}

std::vector<int64_t> StepDirs(const std::string& root) { return ListCompleteSteps(root); }

std::string Text(const std::string& path) { return *ReadFile(path); }

bool Contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v) {
    if (s.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::string JoinLines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

TEST(Crc64, MatchesTheXzCheckValueAndStreams) {
  EXPECT_EQ(Crc64::Of("123456789"), 0x995dc9bbdf1939faull);
  EXPECT_EQ(Crc64::Of(""), 0u);
  EXPECT_EQ(FormatCrc64(0x995dc9bbdf1939faull), "crc64:995dc9bbdf1939fa");
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = char(i * 7 + 3);
  Crc64 pieces;
  for (size_t at = 0, n = 1; at < data.size(); at += n, n = n * 2 + 1) {
    pieces.Update(data.data() + at, std::min(n, data.size() - at));
  }
  EXPECT_EQ(pieces.value(), Crc64::Of(data));
  data[500] ^= 1;
  EXPECT_NE(pieces.value(), Crc64::Of(data));
}

TEST(Safetensors, HeaderOnlyReadAndWriterDigest) {
  test::TempDir dir("st_header");
  const std::string path = dir.path() + "/t.safetensors";
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  SafetensorsWriter w;
  w.AddView("a", Dtype::kF32, {3}, a.data());
  w.Add("b", Dtype::kF32, {2}, b.data());
  FileDigest digest;
  ASSERT_TRUE(w.Write(path, &digest).ok());
  const std::string raw = Text(path);
  EXPECT_EQ(digest.bytes, int64_t(raw.size()));
  EXPECT_EQ(digest.crc64, Crc64::Of(raw));
  auto h = SafetensorsHeader::Read(path);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->file_bytes, int64_t(raw.size()));
  float v;
  std::memcpy(&v, raw.data() + h->data_offset + h->tensors.at("b").begin + 4, 4);
  EXPECT_EQ(v, 5.0f);
  fs::resize_file(path, raw.size() - 1);
  auto cut = SafetensorsHeader::Read(path);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
}

TEST(Checkpoint, RoundTripKeepsTheNewestAndPointsLatestAtIt) {
  test::TempDir dir("ckpt");
  const std::string root = dir.path() + "/ckpt";
  auto comm = MakeSingleRankCommunicator();
  const ParamLayout layout = Layout(0);
  RankState s = ShardOf(layout, 1, 0);
  for (int64_t step : {10, 20, 30}) {
    FillTruth(s, uint64_t(step));
    Status st = SaveCheckpoint(root, 2, s.ranges, StateAt(step), *comm);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  EXPECT_EQ(StepDirs(root), (std::vector<int64_t>{30, 20}));
  EXPECT_EQ(Text(root + "/latest"), "step-00000030\n");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(root)) entries += e.path().filename().string()[0] != '.';
  EXPECT_EQ(entries, 3);  // two step directories and latest
  for (const char* f : {"manifest.json", "rank-00000.safetensors", "rank-00000.json"}) {
    EXPECT_TRUE(fs::exists(root + "/step-00000030/" + f)) << f;
  }

  Zero(s);
  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(root, StateAt(30).layout_fingerprint, s.ranges, *comm, &warnings);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_TRUE(warnings.empty()) << JoinLines(warnings);
  ExpectSameState(*loaded, StateAt(30));
  EXPECT_EQ(Mismatches(s, 30), 0);

  // Saving the same step again replaces it.
  FillTruth(s, 31);
  ASSERT_TRUE(SaveCheckpoint(root, 2, s.ranges, StateAt(30), *comm).ok());
  Zero(s);
  ASSERT_TRUE(LoadLatestCheckpoint(root, "", s.ranges, *comm, nullptr).ok());
  EXPECT_EQ(Mismatches(s, 31), 0);
  EXPECT_EQ(StepDirs(root), (std::vector<int64_t>{30, 20}));
}

TEST(Checkpoint, RecordsTheTokenizerAndReadsOlderCheckpointsAsBytes) {
  test::TempDir dir("ckpt_tok");
  const std::string root = dir.path() + "/ckpt";
  auto comm = MakeSingleRankCommunicator();
  const ParamLayout layout = Layout(0);
  RankState s = ShardOf(layout, 1, 0);
  FillTruth(s, 5);
  TrainingState state = StateAt(5);
  state.tokenizer = "gpt2";
  // gpt2 without its file is refused; with it, the file is checksummed.
  EXPECT_FALSE(SaveCheckpoint(root, 0, s.ranges, state, *comm).ok());
  const std::string json = "{\"model\": {\"type\": \"BPE\"}}";
  Status st = SaveCheckpoint(root, 0, s.ranges, state, *comm, nullptr, json);
  ASSERT_TRUE(st.ok()) << st.message();
  const std::string step_dir = root + "/step-00000005";
  auto m = ReadManifest(step_dir);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->state.tokenizer, "gpt2");
  auto text = ReadCheckpointTokenizer(step_dir);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, json);
  test::WriteText(step_dir + "/tokenizer.json", "{\"model\": {\"type\": \"XPE\"}}");
  auto tampered = ReadCheckpointTokenizer(step_dir);
  ASSERT_FALSE(tampered.ok());
  EXPECT_EQ(tampered.status().code(), StatusCode::kDataLoss);

  state = StateAt(6);
  state.tokenizer = "byte";
  ASSERT_TRUE(SaveCheckpoint(root, 0, s.ranges, state, *comm).ok());
  EXPECT_EQ(ReadManifest(root + "/step-00000006")->state.tokenizer, "byte");
  EXPECT_EQ(ReadCheckpointTokenizer(root + "/step-00000006").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(root + "/step-00000006/tokenizer.json"));

  // A manifest written before tokenizers were recorded has no "tokenizer":
  // its tokens were bytes, and it still loads.
  const std::string path = root + "/step-00000006/manifest.json";
  nlohmann::json j = nlohmann::json::parse(Text(path));
  j.erase("manifest_checksum");
  j.erase("tokenizer");
  j["manifest_checksum"] = FormatCrc64(Crc64::Of(j.dump()));
  test::WriteText(path, j.dump(2));
  auto old = ReadManifest(root + "/step-00000006");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->state.tokenizer, "byte");
  Zero(s);
  ASSERT_TRUE(LoadLatestCheckpoint(root, "", s.ranges, *comm, nullptr).ok());
  EXPECT_EQ(Mismatches(s, 5), 0);
  // An unknown tokenizer is a damaged manifest.
  j.erase("manifest_checksum");
  j["tokenizer"] = {{"type", "sentencepiece"}};
  j["manifest_checksum"] = FormatCrc64(Crc64::Of(j.dump()));
  test::WriteText(path, j.dump(2));
  auto unknown = ReadManifest(root + "/step-00000006");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown tokenizer 'sentencepiece'"), std::string::npos);
}

TEST(Checkpoint, ReshardsBetweenWorldSizesAndChunkSizes) {
  test::TempDir dir("ckpt");
  for (int saved : {2, 4}) {
    const std::string root = dir.path() + "/w" + std::to_string(saved);
    SaveAsWorld(root, saved, 1200, 5);
    auto manifest = ReadManifest(root + "/step-00000005");
    ASSERT_TRUE(manifest.ok()) << manifest.status().message();
    EXPECT_EQ(manifest->world_size, saved);
    for (int world : {1, 3}) {
      SCOPED_TRACE("saved by " + std::to_string(saved) + " ranks, loaded by " + std::to_string(world));
      const ParamLayout layout = Layout(world == 3 ? 1536 : 0);
      int64_t elements = 0;
      for (int r = 0; r < world; ++r) {
        FakeRankCommunicator comm(r, world);
        RankState s = ShardOf(layout, world, r);
        std::vector<std::string> warnings;
        auto loaded = LoadLatestCheckpoint(root, StateAt(5).layout_fingerprint, s.ranges, comm, &warnings);
        ASSERT_TRUE(loaded.ok()) << loaded.status().message();
        EXPECT_TRUE(warnings.empty()) << JoinLines(warnings);
        ExpectSameState(*loaded, StateAt(5));
        EXPECT_EQ(Mismatches(s, 5), 0) << "rank " << r;
        for (const auto& range : s.ranges) elements += range.end - range.begin;
      }
      EXPECT_EQ(elements, 3 * layout.num_elements());  // every element of the three kinds
    }
  }
}

TEST(Checkpoint, RanksAsThreadsSaveWithTwoAndLoadWithThree) {
  test::TempDir dir("ckpt");
  const std::string root = dir.path() + "/ckpt";
  auto run = [&](int world, int64_t chunk_elems, auto&& body) {
    auto comms = test::MakeThreadGroupCommunicators(world);
    std::vector<std::thread> threads;
    std::vector<std::string> errors(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        RankState s = ShardOf(Layout(chunk_elems), world, r);
        errors[size_t(r)] = body(s, *comms[size_t(r)]);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  };
  for (int64_t step : {1, 2}) {
    run(2, 1200, [&](RankState& s, Communicator& comm) -> std::string {
      FillTruth(s, uint64_t(step));
      Status st = SaveCheckpoint(root, 1, s.ranges, StateAt(step), comm);
      return st.ok() ? "" : st.message();
    });
  }
  EXPECT_EQ(StepDirs(root), (std::vector<int64_t>{2}));
  run(3, 1536, [&](RankState& s, Communicator& comm) -> std::string {
    auto loaded = LoadLatestCheckpoint(root, StateAt(2).layout_fingerprint, s.ranges, comm, nullptr);
    if (!loaded.ok()) return loaded.status().message();
    if (loaded->step != 2) return "loaded step " + std::to_string(loaded->step);
    const int64_t bad = Mismatches(s, 2);
    return bad == 0 ? "" : std::to_string(bad) + " elements differ";
  });
}

// Two checkpoints from two ranks, steps 1 and 2; loads with one rank.
class DamagedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/ckpt";
    SaveAsWorld(root_, 2, 1200, 1);
    SaveAsWorld(root_, 2, 1200, 2);
  }
  std::string File(int64_t step, const std::string& name) const {
    return root_ + "/" + StepDirName(step) + "/" + name;
  }
  Result<TrainingState> Load(std::vector<std::string>* warnings, RankState* out = nullptr) {
    RankState s = ShardOf(Layout(0), 1, 0);
    auto comm = MakeSingleRankCommunicator();
    auto r = LoadLatestCheckpoint(root_, StateAt(1).layout_fingerprint, s.ranges, *comm, warnings);
    if (out != nullptr) *out = std::move(s);
    return r;
  }
  // Flips one byte in the middle of the data of the rank file's first tensor.
  void FlipByte(const std::string& path) {
    auto h = SafetensorsHeader::Read(path);
    ASSERT_TRUE(h.ok());
    const auto& t = h->tensors.begin()->second;
    const int64_t at = h->data_offset + (t.begin + t.end) / 2;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(at);
    f.write(&c, 1);
  }
  // Loads; expects step 1 and a warning naming `needle`.
  void ExpectFallBack(const std::string& needle) {
    std::vector<std::string> warnings;
    RankState s;
    auto r = Load(&warnings, &s);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->step, 1);
    EXPECT_EQ(Mismatches(s, 1), 0);
    EXPECT_TRUE(Contains(warnings, needle)) << "no warning naming " << needle << ":\n" << JoinLines(warnings);
  }

  test::TempDir dir_{"ckpt_damaged"};
  std::string root_;
};

TEST_F(DamagedCheckpoint, TruncatedRankFileFallsBack) {
  const std::string f = File(2, "rank-00001.safetensors");
  fs::resize_file(f, fs::file_size(f) - 100);
  ExpectFallBack("step-00000002/rank-00001.safetensors");
}

TEST_F(DamagedCheckpoint, FlippedByteFallsBackOnTheChecksum) {
  FlipByte(File(2, "rank-00000.safetensors"));
  ExpectFallBack("step-00000002/rank-00000.safetensors: checksum mismatch");
}

TEST_F(DamagedCheckpoint, MissingRankFileFallsBack) {
  fs::remove(File(2, "rank-00001.safetensors"));
  ExpectFallBack("step-00000002/rank-00001.safetensors: missing");
}

TEST_F(DamagedCheckpoint, EditedOrBrokenManifestFallsBack) {
  std::string m = Text(File(2, "manifest.json"));
  const size_t at = m.find("\"data_position\": ");
  ASSERT_NE(at, std::string::npos);
  m.insert(at + 17, "1");
  test::WriteText(File(2, "manifest.json"), m);
  ExpectFallBack("step-00000002/manifest.json: checksum mismatch");
  test::WriteText(File(2, "manifest.json"), "{\"truncated\": ");
  ExpectFallBack("step-00000002/manifest.json: bad manifest");
}

// A manifest crafted with a valid checksum but numbers no run writes: each
// is refused by name (and the load falls back) before anything is indexed or
// allocated with it.
TEST_F(DamagedCheckpoint, CraftedManifestNumbersAreRefusedByName) {
  const std::string path = File(2, "manifest.json");
  const std::string original = Text(path);
  struct Case {
    const char* pointer;
    nlohmann::json value;
    const char* needle;
  };
  for (const Case& c : {Case{"/state/data_position", -5, "state.data_position is negative"},
                        Case{"/state/step", -1, "state.step is negative"},
                        Case{"/state/optimizer_steps", -7, "state.optimizer_steps is negative"},
                        Case{"/state/loss_scale", -1.0, "state.loss_scale is not a positive number"},
                        Case{"/state/model/n_embd", int64_t(1) << 31, "state.model.n_embd is 2147483648"},
                        Case{"/state/model/n_layer", 1000000000, "state.model.n_layer is 1000000000"},
                        Case{"/state/model/vocab_size", 0, "state.model.vocab_size is 0"},
                        Case{"/state/model/n_head", 3, "state.model.n_head does not divide n_embd"}}) {
    SCOPED_TRACE(c.pointer);
    nlohmann::json j = nlohmann::json::parse(original);
    j.erase("manifest_checksum");
    j[nlohmann::json::json_pointer(c.pointer)] = c.value;
    j["manifest_checksum"] = FormatCrc64(Crc64::Of(j.dump()));
    test::WriteText(path, j.dump(2));
    ExpectFallBack(std::string("step-00000002/manifest.json: bad manifest: ") + c.needle);
  }
}

TEST(Safetensors, AShapeLargerThanTheFileIsRefusedWithoutOverflow) {
  test::TempDir dir("st_crafted");
  for (const char* shape : {"[4294967296, 4294967296]", "[9223372036854775807, 2]", "[3037000500, 3037000500]"}) {
    const std::string json = std::string("{\"t\": {\"dtype\": \"F32\", \"shape\": ") + shape +
                             ", \"data_offsets\": [0, 16]}}";
    std::string file(8, '\0');
    const uint64_t len = json.size();
    std::memcpy(file.data(), &len, 8);
    file += json + std::string(16, '\0');
    const std::string path = dir.path() + "/crafted.safetensors";
    test::WriteText(path, file);
    auto h = SafetensorsHeader::Read(path);
    ASSERT_FALSE(h.ok()) << shape;
    EXPECT_NE(h.status().message().find("tensor t has a shape larger than the file"), std::string::npos)
        << h.status().message();
    auto f = SafetensorsFile::Read(path);
    ASSERT_FALSE(f.ok()) << shape;
  }
}

TEST_F(DamagedCheckpoint, LatestNamingAMissingDirectoryFallsBack) {
  fs::remove_all(root_ + "/step-00000002");
  ExpectFallBack("step-00000002: missing");
}

TEST_F(DamagedCheckpoint, EveryCheckpointDamagedIsDataLoss) {
  FlipByte(File(2, "rank-00000.safetensors"));
  FlipByte(File(1, "rank-00001.safetensors"));
  std::vector<std::string> warnings;
  auto r = Load(&warnings);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("step-00000002/rank-00000.safetensors"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("step-00000001/rank-00001.safetensors"), std::string::npos) << r.status().message();
  EXPECT_EQ(warnings.size(), 2u) << JoinLines(warnings);
}

TEST_F(DamagedCheckpoint, WrongFingerprintIsFailedPrecondition) {
  RankState s = ShardOf(Layout(0), 1, 0);
  auto comm = MakeSingleRankCommunicator();
  const GptConfig other{2, 2, 16, 41, 8};
  auto r = LoadLatestCheckpoint(root_, LayoutFingerprint(GptTensorSpecs(other)), s.ranges, *comm, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("checkpoint was written for a different model"), std::string::npos);
}

TEST_F(DamagedCheckpoint, MissingPieceNamesTheTensorAndRange) {
  fs::remove_all(root_ + "/step-00000001");
  RankState s = ShardOf(Layout(0), 1, 0);
  std::vector<float> extra(10);
  s.ranges.push_back({StateKind::kGrad, "transformer.wte.weight", 5, 15, extra.data()});
  auto comm = MakeSingleRankCommunicator();
  auto r = LoadLatestCheckpoint(root_, "", s.ranges, *comm, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("no saved piece holds grad/transformer.wte.weight elements [5, 15)"),
            std::string::npos)
      << r.status().message();
  // Beyond the end of a saved tensor.
  s.ranges.pop_back();
  s.ranges.push_back({StateKind::kParam, "transformer.ln_f.bias", 10, 20, extra.data()});
  r = LoadLatestCheckpoint(root_, "", s.ranges, *comm, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("param/transformer.ln_f.bias elements [16, 20)"), std::string::npos)
      << r.status().message();
}

TEST(Checkpoint, NoCheckpointIsNotFound) {
  test::TempDir dir("ckpt");
  auto comm = MakeSingleRankCommunicator();
  auto missing = LoadLatestCheckpoint(dir.path() + "/none", "", {}, *comm, nullptr);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto empty = LoadLatestCheckpoint(dir.path(), "", {}, *comm, nullptr);
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
}

TEST(Checkpoint, InterruptedSavesAreIgnoredAndCleanedUp) {
  test::TempDir dir("ckpt");
  const std::string root = dir.path() + "/ckpt";
  SaveAsWorld(root, 1, 0, 3);
  // A crash while ranks were writing step 5, and one just before step 4 was published.
  fs::create_directories(root + "/step-00000005.tmp");
  test::WriteText(root + "/step-00000005.tmp/rank-00000.safetensors", "partial");
  ASSERT_TRUE(PrepareStagingDir(root, 4).ok());
  fs::create_directories(root + "/step-00000005.tmp");
  {
    RankState s = ShardOf(Layout(0), 1, 0);
    FillTruth(s, 4);
    ASSERT_TRUE(WriteRankFile(StagingDir(root, 4), 0, 1, 4, s.ranges).ok());
  }
  EXPECT_EQ(StepDirs(root), (std::vector<int64_t>{3}));
  auto comm = MakeSingleRankCommunicator();
  RankState s = ShardOf(Layout(0), 1, 0);
  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(root, "", s.ranges, *comm, &warnings);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->step, 3);
  EXPECT_EQ(Mismatches(s, 3), 0);
  EXPECT_TRUE(warnings.empty()) << JoinLines(warnings);

  FillTruth(s, 6);
  ASSERT_TRUE(SaveCheckpoint(root, 0, s.ranges, StateAt(6), *comm).ok());
  EXPECT_FALSE(fs::exists(root + "/step-00000005.tmp"));
  EXPECT_FALSE(fs::exists(root + "/step-00000004.tmp"));
  EXPECT_EQ(StepDirs(root), (std::vector<int64_t>{6, 3}));
}

TEST(Checkpoint, ResumingFromAnOlderStepDropsTheAbandonedNewerOnes) {
  test::TempDir dir("ckpt");
  const std::string root = dir.path() + "/ckpt";
  for (int64_t step : {10, 20, 30}) SaveAsWorld(root, 1, 0, step);
  // As if step 30 had been damaged and the run went on from step 20.
  SaveAsWorld(root, 1, 0, 25, /*keep=*/2);
  EXPECT_EQ(StepDirs(root), (std::vector<int64_t>{25, 20}));
  EXPECT_EQ(Text(root + "/latest"), "step-00000025\n");
}

TEST(Checkpoint, BadArgumentsAreRejectedOnEveryRank) {
  test::TempDir dir("ckpt");
  auto comm = MakeSingleRankCommunicator();
  std::vector<float> v(4);
  TrainingState state = StateAt(1);
  std::vector<OwnedRange> twice = {{StateKind::kParam, "a", 0, 4, v.data()}, {StateKind::kParam, "a", 0, 2, v.data()}};
  EXPECT_EQ(SaveCheckpoint(dir.path(), 1, twice, state, *comm).code(), StatusCode::kInvalidArgument);
  std::vector<OwnedRange> backwards = {{StateKind::kParam, "a", 4, 2, v.data()}};
  EXPECT_EQ(SaveCheckpoint(dir.path(), 1, backwards, state, *comm).code(), StatusCode::kInvalidArgument);
  state.loss_scale = std::numeric_limits<double>::infinity();
  EXPECT_EQ(SaveCheckpoint(dir.path(), 1, {}, state, *comm).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListCompleteSteps(dir.path()).empty());
}

// Device memory for the tests: addresses in a PROT_NONE reservation, so that
// touching one directly crashes, backed by host bytes only the copier reads
// and writes. Counts the copies and the largest one; can be told to fail.
class FakeDevice final : public DeviceCopier {
 public:
  static constexpr int64_t kMaxCopyBytes = int64_t(4) << 20;

  explicit FakeDevice(size_t capacity) : capacity_(capacity), backing_(capacity) {
    void* p = ::mmap(nullptr, capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) base_ = static_cast<char*>(p);
  }
  ~FakeDevice() override {
    if (base_ != nullptr) ::munmap(base_, capacity_);
  }
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  bool ok() const { return base_ != nullptr; }
  // `n` floats of device memory, or null when the capacity is exhausted.
  float* Alloc(int64_t n) {
    const size_t bytes = size_t(n) * sizeof(float);
    if (base_ == nullptr || used_ + bytes > capacity_) return nullptr;
    float* p = reinterpret_cast<float*>(base_ + used_);
    used_ += (bytes + 63) / 64 * 64;
    return p;
  }
  // The host bytes behind device address `p`, for tests to set and check.
  float* Backing(const float* p) {
    return reinterpret_cast<float*>(backing_.data() + (reinterpret_cast<const char*>(p) - base_));
  }
  void Clear() { std::fill(backing_.begin(), backing_.end(), '\0'); }

  Status ToHost(void* host_dst, const OwnedRange& src, int64_t offset, size_t bytes) override {
    const char* device_src = reinterpret_cast<const char*>(src.data) + offset;
    ++to_host_calls;
    to_host_bytes += int64_t(bytes);
    max_copy_bytes = std::max(max_copy_bytes, int64_t(bytes));
    if (fail_to_host_from > 0 && to_host_calls >= fail_to_host_from) {
      return Status::Internal("fake device: copy to host failed");
    }
    PSTAR_RETURN_IF_ERROR(Check(host_dst, device_src, bytes));
    std::memcpy(host_dst, backing_.data() + (device_src - base_), bytes);
    return Status::Ok();
  }
  Status ToDevice(const OwnedRange& dst, int64_t offset, const void* host_src, size_t bytes) override {
    char* device_dst = reinterpret_cast<char*>(dst.data) + offset;
    ++to_device_calls;
    to_device_bytes += int64_t(bytes);
    max_copy_bytes = std::max(max_copy_bytes, int64_t(bytes));
    if (fail_to_device_from > 0 && to_device_calls >= fail_to_device_from) {
      return Status::Internal("fake device: copy to device failed");
    }
    PSTAR_RETURN_IF_ERROR(Check(host_src, device_dst, bytes));
    std::memcpy(backing_.data() + (device_dst - base_), host_src, bytes);
    return Status::Ok();
  }

  int64_t to_host_calls = 0, to_host_bytes = 0;
  int64_t to_device_calls = 0, to_device_bytes = 0;
  int64_t max_copy_bytes = 0;
  // The call (counted from 1 since construction) from which copies fail; 0: never.
  int64_t fail_to_host_from = 0, fail_to_device_from = 0;

 private:
  bool OnDevice(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    return base_ != nullptr && c >= base_ && c + bytes <= base_ + used_;
  }
  // Fails (and so fails the test) on a copy the caller got the wrong way round.
  Status Check(const void* host, const void* device, size_t bytes) const {
    EXPECT_TRUE(OnDevice(device, bytes)) << "not device memory";
    EXPECT_FALSE(OnDevice(host, 1)) << "host side of a copy is device memory";
    EXPECT_LE(int64_t(bytes), kMaxCopyBytes) << "one copy of more than the bounded buffer";
    if (!OnDevice(device, bytes) || OnDevice(host, 1)) return Status::Internal("fake device: bad addresses");
    return Status::Ok();
  }

  size_t capacity_;
  char* base_ = nullptr;
  size_t used_ = 0;
  std::vector<char> backing_;
};

constexpr TensorId kBigId = 1000;       // for Truth: not a layout tensor
constexpr int64_t kBig = 1'500'000;     // floats: more than one 4 MiB block

// Adds a piece of tensor "big" (not in the model; pieces need not be).
void AddBigPiece(RankState& s, StateKind kind, int64_t begin, int64_t end) {
  s.buffers.emplace_back(size_t(end - begin), 0.0f);
  s.ranges.push_back({kind, "big", begin, end, nullptr});
  s.ids.push_back(kBigId);
  for (size_t i = 0; i < s.ranges.size(); ++i) s.ranges[i].data = s.buffers[i].data();
}

// The ranges of `s`, with those `pick` selects moved to `device` (their
// current values copied there). The host buffers of `s` stay as mirrors.
std::vector<OwnedRange> WithDeviceRanges(const RankState& s, FakeDevice& device,
                                         const std::function<bool(const OwnedRange&)>& pick) {
  std::vector<OwnedRange> out = s.ranges;
  for (OwnedRange& r : out) {
    if (!pick(r) || r.end == r.begin) continue;
    float* d = device.Alloc(r.end - r.begin);
    EXPECT_NE(d, nullptr) << "fake device too small";
    if (d == nullptr) continue;
    std::memcpy(device.Backing(d), r.data, size_t(r.end - r.begin) * sizeof(float));
    r.data = d;
    r.on_device = true;
  }
  return out;
}

// Copies the device ranges of `mixed` back into the host mirrors of `s`.
void MirrorDeviceRanges(RankState& s, const std::vector<OwnedRange>& mixed, FakeDevice& device) {
  for (size_t i = 0; i < mixed.size(); ++i) {
    if (!mixed[i].on_device) continue;
    std::memcpy(s.buffers[i].data(), device.Backing(mixed[i].data), s.buffers[i].size() * sizeof(float));
  }
}

int64_t DeviceBytes(const std::vector<OwnedRange>& ranges) {
  int64_t bytes = 0;
  for (const OwnedRange& r : ranges) bytes += r.on_device ? (r.end - r.begin) * int64_t(sizeof(float)) : 0;
  return bytes;
}

int64_t DeviceRangeCount(const std::vector<OwnedRange>& ranges) {
  return std::count_if(ranges.begin(), ranges.end(), [](const OwnedRange& r) { return r.on_device; });
}

bool IsMoment(const OwnedRange& r) { return r.kind == StateKind::kExpAvg || r.kind == StateKind::kExpAvgSq; }

// One rank's state with the Adam moments on a fake device, plus two pieces of
// kBig floats: exp_avg_sq on the device, param on the host.
struct MixedRank {
  RankState host;  // mirrors of every range
  FakeDevice device{size_t(32) << 20};
  std::vector<OwnedRange> ranges;

  explicit MixedRank(uint64_t version) : host(ShardOf(Layout(0), 1, 0)) {
    AddBigPiece(host, StateKind::kExpAvgSq, 7, 7 + kBig);
    AddBigPiece(host, StateKind::kParam, 0, kBig);
    FillTruth(host, version);
    ranges = WithDeviceRanges(host, device, IsMoment);
  }
};

TEST(CheckpointOnDevice, RoundTripsThroughABoundedBufferAndWritesTheSameFile) {
  test::TempDir dir("ckpt_device");
  auto comm = MakeSingleRankCommunicator();
  MixedRank m(4);
  ASSERT_TRUE(m.device.ok());
  const int64_t device_bytes = DeviceBytes(m.ranges);
  const int64_t device_ranges = DeviceRangeCount(m.ranges);
  ASSERT_GT(device_ranges, 2);
  ASSERT_LT(device_ranges, int64_t(m.ranges.size()));  // host ranges too

  const std::string on_device = dir.path() + "/device", on_host = dir.path() + "/host";
  Status st = SaveCheckpoint(on_device, 0, m.ranges, StateAt(4), *comm, &m.device);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(m.device.to_host_bytes, device_bytes);
  EXPECT_GE(m.device.to_host_calls, device_ranges + 1);  // the big piece takes two
  EXPECT_LE(m.device.max_copy_bytes, FakeDevice::kMaxCopyBytes);
  EXPECT_EQ(m.device.to_device_calls, 0);

  // The same data as host ranges gives the same bytes.
  st = SaveCheckpoint(on_host, 0, m.host.ranges, StateAt(4), *comm);
  ASSERT_TRUE(st.ok()) << st.message();
  const std::string file = "/step-00000004/rank-00000.safetensors";
  EXPECT_TRUE(Text(on_device + file) == Text(on_host + file)) << "rank files differ";
  EXPECT_EQ(Text(on_device + "/step-00000004/manifest.json"), Text(on_host + "/step-00000004/manifest.json"));

  Zero(m.host);
  m.device.Clear();
  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(on_device, StateAt(4).layout_fingerprint, m.ranges, *comm, &warnings, &m.device);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_TRUE(warnings.empty()) << JoinLines(warnings);
  ExpectSameState(*loaded, StateAt(4));
  EXPECT_EQ(m.device.to_device_bytes, device_bytes);
  EXPECT_GE(m.device.to_device_calls, device_ranges + 1);
  EXPECT_LE(m.device.max_copy_bytes, FakeDevice::kMaxCopyBytes);
  MirrorDeviceRanges(m.host, m.ranges, m.device);
  EXPECT_EQ(Mismatches(m.host, 4), 0);

  // A checkpoint saved from the host loads onto the device too.
  Zero(m.host);
  m.device.Clear();
  loaded = LoadLatestCheckpoint(on_host, "", m.ranges, *comm, nullptr, &m.device);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  MirrorDeviceRanges(m.host, m.ranges, m.device);
  EXPECT_EQ(Mismatches(m.host, 4), 0);
}

TEST(CheckpointOnDevice, DeviceRangesGatherPiecesFromSeveralRankFiles) {
  test::TempDir dir("ckpt_device");
  const std::string root = dir.path() + "/ckpt";
  SaveAsWorld(root, 2, 1200, 5);
  RankState s = ShardOf(Layout(0), 1, 0);
  FakeDevice device(size_t(4) << 20);
  ASSERT_TRUE(device.ok());
  const std::vector<OwnedRange> ranges = WithDeviceRanges(s, device, IsMoment);
  auto comm = MakeSingleRankCommunicator();
  auto loaded = LoadLatestCheckpoint(root, "", ranges, *comm, nullptr, &device);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(device.to_device_bytes, DeviceBytes(ranges));
  EXPECT_GT(device.to_device_calls, DeviceRangeCount(ranges));  // some ranges span both files
  MirrorDeviceRanges(s, ranges, device);
  EXPECT_EQ(Mismatches(s, 5), 0);
}

TEST(CheckpointOnDevice, DeviceRangeWithoutACopierIsRejected) {
  test::TempDir dir("ckpt_device");
  const std::string root = dir.path() + "/ckpt";
  auto comm = MakeSingleRankCommunicator();
  FakeDevice device(size_t(1) << 20);
  ASSERT_TRUE(device.ok());
  std::vector<float> host(10, 1.0f);
  float* d = device.Alloc(10);
  const std::vector<OwnedRange> ranges = {{StateKind::kParam, "a", 0, 10, host.data()},
                                          {StateKind::kExpAvg, "a", 0, 10, d, true}};
  const std::string message = "owned range exp_avg/a [0, 10) is in device memory, but no device copier was given";

  Status st = SaveCheckpoint(root, 0, ranges, StateAt(1), *comm);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(message), std::string::npos) << st.message();
  EXPECT_TRUE(ListCompleteSteps(root).empty());
  ASSERT_TRUE(PrepareStagingDir(root, 1).ok());
  st = WriteRankFile(StagingDir(root, 1), 0, 1, 1, ranges);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(message), std::string::npos) << st.message();

  st = SaveCheckpoint(root, 0, ranges, StateAt(1), *comm, &device);
  ASSERT_TRUE(st.ok()) << st.message();
  auto loaded = LoadLatestCheckpoint(root, "", ranges, *comm, nullptr);
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find(message), std::string::npos) << loaded.status().message();
  loaded = LoadCheckpointDir(root + "/step-00000001", "", ranges);
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find(message), std::string::npos) << loaded.status().message();
  EXPECT_EQ(device.to_device_calls, 0);
}

TEST(CheckpointOnDevice, CopierFailingToHostFailsTheSaveAndPublishesNothing) {
  test::TempDir dir("ckpt_device");
  const std::string root = dir.path() + "/ckpt";
  auto comm = MakeSingleRankCommunicator();
  MixedRank m(1);
  ASSERT_TRUE(m.device.ok());
  Status st = SaveCheckpoint(root, 0, m.ranges, StateAt(1), *comm, &m.device);
  ASSERT_TRUE(st.ok()) << st.message();

  // The second copy of the next save fails, after part of the file is written.
  m.device.fail_to_host_from = m.device.to_host_calls + 2;
  st = SaveCheckpoint(root, 0, m.ranges, StateAt(2), *comm, &m.device);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("fake device: copy to host failed"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank-00000.safetensors"), std::string::npos) << st.message();
  EXPECT_EQ(StepDirs(root), (std::vector<int64_t>{1}));
  EXPECT_EQ(Text(root + "/latest"), "step-00000001\n");
  int left = 0;  // in the staging directory: no rank file, temp file or sidecar
  for (const auto& e : fs::directory_iterator(StagingDir(root, 2))) {
    ADD_FAILURE() << "left behind: " << e.path();
    ++left;
  }
  EXPECT_EQ(left, 0);

  m.device.fail_to_host_from = 0;
  Zero(m.host);
  m.device.Clear();
  auto loaded = LoadLatestCheckpoint(root, "", m.ranges, *comm, nullptr, &m.device);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->step, 1);
  MirrorDeviceRanges(m.host, m.ranges, m.device);
  EXPECT_EQ(Mismatches(m.host, 1), 0);
}

TEST(CheckpointOnDevice, CopierFailingToDeviceFailsTheLoadWithoutTryingOlderOnes) {
  test::TempDir dir("ckpt_device");
  const std::string root = dir.path() + "/ckpt";
  auto comm = MakeSingleRankCommunicator();
  MixedRank m(1);
  ASSERT_TRUE(m.device.ok());
  for (int64_t step : {1, 2}) {
    Status st = SaveCheckpoint(root, 0, m.ranges, StateAt(step), *comm, &m.device);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  m.device.fail_to_device_from = 1;
  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(root, "", m.ranges, *comm, &warnings, &m.device);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInternal);
  EXPECT_NE(loaded.status().message().find("step-00000002/rank-00000.safetensors: copying into device memory failed: "
                                           "fake device: copy to device failed"),
            std::string::npos)
      << loaded.status().message();
  EXPECT_TRUE(warnings.empty()) << JoinLines(warnings);
  EXPECT_EQ(m.device.to_device_calls, 1);  // step 1 was not tried
}

TEST(CheckpointOnDevice, CopierFailingOnOneRankFailsTheLoadOnEveryRank) {
  test::TempDir dir("ckpt_device");
  const std::string root = dir.path() + "/ckpt";
  SaveAsWorld(root, 2, 1200, 1);
  SaveAsWorld(root, 2, 1200, 2);
  auto comms = test::MakeThreadGroupCommunicators(2);
  std::vector<Status> results(2);
  std::vector<std::vector<std::string>> warnings(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RankState s = ShardOf(Layout(1200), 2, r);
      FakeDevice device(size_t(1) << 20);
      if (r == 1) device.fail_to_device_from = 1;
      const std::vector<OwnedRange> ranges = WithDeviceRanges(s, device, IsMoment);
      results[size_t(r)] = LoadLatestCheckpoint(root, "", ranges, *comms[size_t(r)], &warnings[size_t(r)], &device).status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[1].code(), StatusCode::kInternal);
  EXPECT_NE(results[1].message().find("fake device: copy to device failed"), std::string::npos) << results[1].message();
  EXPECT_EQ(results[0].code(), StatusCode::kInternal);
  EXPECT_NE(results[0].message().find("step-00000002: loading failed on another rank"), std::string::npos)
      << results[0].message();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(warnings[size_t(r)].empty()) << "rank " << r << ":\n" << JoinLines(warnings[size_t(r)]);
}

}  // namespace
}  // namespace pstar

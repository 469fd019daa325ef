// Training progress for status.progress: the exposition parser, the bounded
// HTTP read against endpoints that answer well, with garbage, not at all or
// too much, the poller keeping the last good reading, and the status field.
#include "operator/reconciler/progress_poller.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "operator/reconciler/job_actions.h"
#include "tests/test_util.h"

namespace pstar::op {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string Exposition(int64_t step, double loss) {
  return "# HELP patrickstar_step Training step reached.\n"
         "# TYPE patrickstar_step gauge\n"
         "patrickstar_step{job=\"j\",namespace=\"ml\",rank=\"0\"} " + std::to_string(step) + "\n"
         "patrickstar_target_steps{job=\"j\",namespace=\"ml\",rank=\"0\"} 1000\n"
         "patrickstar_loss{job=\"j\",namespace=\"ml\",rank=\"0\"} " + std::to_string(loss) + "\n"
         "patrickstar_tokens_per_second{job=\"odd}label\",namespace=\"ml\",rank=\"0\"} 12345.6\n"
         "patrickstar_last_checkpoint_step{job=\"j\",namespace=\"ml\",rank=\"0\"} 50\n"
         "patrickstar_steps_total{job=\"j\",namespace=\"ml\",rank=\"0\"} 7\n";
}

TEST(ParseProgressTest, ReadsTheSeriesAndIgnoresTheRest) {
  auto p = ParseProgress(Exposition(120, 3.25));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->step, 120);
  EXPECT_EQ(p->target_steps, 1000);
  EXPECT_EQ(p->last_checkpoint_step, 50);
  EXPECT_DOUBLE_EQ(*p->loss, 3.25);
  EXPECT_DOUBLE_EQ(*p->tokens_per_second, 12345.6);
  for (const char* bad : {"", "garbage\n\x01\x02", "patrickstar_step NaN\n", "patrickstar_step{rank=\"0\" 5\n",
                          "patrickstar_step -3\n", "patrickstar_step 1e300\n", "<html>patrickstar_step</html>",
                          "patrickstar_loss 2.5\n"}) {
    EXPECT_FALSE(ParseProgress(bad).has_value()) << bad;
  }
  // A step without the rest is still progress.
  auto bare = ParseProgress("patrickstar_step 9\n");
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->target_steps, 0);
  EXPECT_FALSE(bare->loss.has_value());
}

TEST(ProgressStatusTest, EstimatesCompletionFromTheStepRate) {
  JobProgress p;
  p.step = 100;
  p.target_steps = 1100;
  p.loss = 2.123456;
  p.tokens_per_second = 5000.4;
  p.last_checkpoint_step = 100;
  p.steps_per_second = 10;
  p.at = *ParseTime("2026-01-01T00:00:00Z");
  const Json j = ProgressStatus(p);
  EXPECT_EQ(j["step"], 100);
  EXPECT_EQ(j["targetSteps"], 1100);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.1235);
  EXPECT_DOUBLE_EQ(j["tokensPerSecond"].get<double>(), 5000);
  EXPECT_EQ(j["lastCheckpointStep"], 100);
  EXPECT_EQ(j["estimatedCompletionTime"], "2026-01-01T00:01:40Z");  // 1000 steps at 10/s
  EXPECT_EQ(j["updateTime"], "2026-01-01T00:00:00Z");
  p.steps_per_second = 0;  // no rate yet: no estimate
  EXPECT_FALSE(ProgressStatus(p).contains("estimatedCompletionTime"));

  // Every field it writes is in the CRD's status schema, with its type.
  const YAML::Node crd = YAML::LoadFile(test::SourceDir() + "/crds/patrickstarjob.yaml");
  const YAML::Node schema =
      crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["progress"];
  ASSERT_TRUE(schema) << "status.progress is not in the CRD";
  p.steps_per_second = 10;
  const Json full = ProgressStatus(p);
  for (auto it = full.begin(); it != full.end(); ++it) {
    const YAML::Node field = schema["properties"][it.key()];
    ASSERT_TRUE(field) << it.key();
    const std::string type = field["type"].as<std::string>();
    EXPECT_EQ(type, it.value().is_string() ? "string" : it.value().is_number_integer() ? "integer" : "number")
        << it.key();
  }
}

// A local endpoint that answers as told.
class FakeEndpoint {
 public:
  enum class Mode { kGood, kGarbage, kClose, kStall, kHuge, kNotFound };
  FakeEndpoint() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 16);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeEndpoint() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }
  void Set(Mode mode, std::string body = "") {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
    body_ = std::move(body);
  }
  int requests() const { return requests_; }

 private:
  void Serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++requests_;
      char buf[4096];
      (void)::recv(c, buf, sizeof buf, 0);
      Mode mode;
      std::string body;
      {
        std::lock_guard<std::mutex> lock(mu_);
        mode = mode_;
        body = body_;
      }
      std::string out;
      if (mode == Mode::kGood) {
        out = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body;
      } else if (mode == Mode::kGarbage) {
        static constexpr char kGarbage[] = "\x16\x03\x01 not http at all\r\n\r\n\x00\x01";
        out = std::string(kGarbage, sizeof kGarbage - 1);  // the NULs included, the terminator not
      } else if (mode == Mode::kNotFound) {
        out = "HTTP/1.1 404 Not Found\r\n\r\nnope";
      } else if (mode == Mode::kHuge) {
        out = "HTTP/1.1 200 OK\r\n\r\n" + std::string(size_t(8) << 20, 'x');
      } else if (mode == Mode::kStall) {
        // Say nothing until the reader gives up and closes.
        while (!stop_) {
          pollfd p{c, POLLIN, 0};
          char byte;
          if (::poll(&p, 1, 50) > 0 && ::recv(c, &byte, 1, 0) <= 0) break;
        }
      }
      for (size_t sent = 0; sent < out.size();) {
        const ssize_t n = ::send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += size_t(n);
      }
      ::close(c);
    }
  }
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::mutex mu_;
  Mode mode_ = Mode::kGood;
  std::string body_;
  std::thread thread_;
};

TEST(BoundedHttpGetTest, EveryBadEndpointCostsOneBoundedRead) {
  FakeEndpoint e;
  const milliseconds timeout(500);
  e.Set(FakeEndpoint::Mode::kGood, "hello");
  auto good = BoundedHttpGet("127.0.0.1", e.port(), "/metrics", timeout, 1 << 20);
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_EQ(*good, "hello");
  for (auto mode : {FakeEndpoint::Mode::kGarbage, FakeEndpoint::Mode::kClose, FakeEndpoint::Mode::kStall,
                    FakeEndpoint::Mode::kHuge, FakeEndpoint::Mode::kNotFound}) {
    e.Set(mode);
    const auto start = Clock::now();
    auto r = BoundedHttpGet("127.0.0.1", e.port(), "/metrics", timeout, 1 << 20);
    EXPECT_FALSE(r.ok()) << int(mode);
    EXPECT_LT(Clock::now() - start, timeout + milliseconds(2500)) << int(mode);  // bounded (slack for a loaded machine)
  }
  EXPECT_FALSE(BoundedHttpGet("node-0.example", 80, "/", timeout, 100).ok()) << "no name lookups";
  EXPECT_FALSE(BoundedHttpGet("127.0.0.1", test::FreePort(), "/", timeout, 100).ok()) << "nobody listening";
}

bool WaitFor(const std::function<bool()>& done, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return done();
}

TEST(ProgressPollerTest, KeepsTheLastGoodReadingWhateverTheEndpointDoes) {
  FakeEndpoint e;
  e.Set(FakeEndpoint::Mode::kGood, Exposition(10, 4.5));
  std::atomic<int> changes{0};
  ProgressPoller::Options o;
  o.interval = milliseconds(100);
  o.timeout = milliseconds(300);
  ProgressPoller poller(o, [&](const std::string& key) {
    EXPECT_EQ(key, "ml/j");
    ++changes;
  });
  poller.Track("ml/j", "127.0.0.1", e.port());
  ASSERT_TRUE(WaitFor([&] { return poller.Latest("ml/j").has_value(); }, milliseconds(5000)));
  EXPECT_EQ(poller.Latest("ml/j")->step, 10);
  // A change is reported just after its reading is stored: wait for it.
  ASSERT_TRUE(WaitFor([&] { return changes.load() >= 1; }, milliseconds(5000)));
  e.Set(FakeEndpoint::Mode::kGood, Exposition(20, 4.0));
  ASSERT_TRUE(WaitFor([&] { return poller.Latest("ml/j")->step == 20; }, milliseconds(5000)));
  EXPECT_GT(poller.Latest("ml/j")->steps_per_second, 0) << "a rate from two readings";
  // Stop the good readings and let the last one's report land (two more
  // reads: the poller reports before it reads again) before counting.
  e.Set(FakeEndpoint::Mode::kGarbage);
  const int settle = e.requests();
  ASSERT_TRUE(WaitFor([&] { return e.requests() >= settle + 2; }, milliseconds(5000)));
  const int before = changes.load();
  EXPECT_GE(before, 2) << "the first reading and the new step were reported";
  for (auto mode : {FakeEndpoint::Mode::kGarbage, FakeEndpoint::Mode::kClose, FakeEndpoint::Mode::kStall,
                    FakeEndpoint::Mode::kHuge, FakeEndpoint::Mode::kNotFound}) {
    e.Set(mode);
    const int requests = e.requests();
    ASSERT_TRUE(WaitFor([&] { return e.requests() >= requests + 2; }, milliseconds(5000))) << int(mode);
    const auto latest = poller.Latest("ml/j");
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(latest->step, 20) << int(mode);
    EXPECT_DOUBLE_EQ(*latest->loss, 4.0) << int(mode);
  }
  EXPECT_EQ(changes.load(), before) << "bad reads change nothing";
  // Untracked: no more reads, the last progress kept; forgotten: gone.
  poller.Untrack("ml/j");
  std::this_thread::sleep_for(milliseconds(400));
  const int requests = e.requests();
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_LE(e.requests(), requests + 1);
  EXPECT_TRUE(poller.Latest("ml/j").has_value());
  poller.Forget("ml/j");
  EXPECT_FALSE(poller.Latest("ml/j").has_value());
}

TEST(ProgressStatusTest, StatusCarriesTheProgressAndKeepsItWhenNoneIsRead) {
  JobObservation o;
  o.job = Json::parse(R"({"apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob",
    "metadata": {"name": "j", "namespace": "ml", "uid": "u", "generation": 1, "resourceVersion": "1"},
    "spec": {"numNodes": 1, "nprocPerNode": 1, "device": "cpu",
             "config": {"model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 40, "max_seq_len": 12},
                        "train": {"batch_size": 4, "seq_len": 8, "steps": 4}}}})");
  o.now = std::chrono::system_clock::now();
  o.fresh_store_token = "t";
  o.progress = Json{{"step", 3}, {"targetSteps", 4}};
  JobActions a = DecideJobActions(o, {});
  ASSERT_TRUE(a.status);
  EXPECT_EQ((*a.status)["progress"]["step"], 3);
  o.job["status"] = *a.status;
  o.progress = Json();  // the endpoint said nothing new
  JobActions b = DecideJobActions(o, {});
  const Json status = b.status ? *b.status : o.job["status"];
  EXPECT_EQ(status["progress"]["step"], 3);
}

}  // namespace
}  // namespace pstar::op

// pstar-operator: runs the PatrickStarJob controller. Flags are documented in
// docs/operator.md and by --help.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "operator/controller/leader_election.h"
#include "operator/kube/kube_client.h"
#include "operator/kube/kube_config.h"
#include "operator/metrics/operator_metrics.h"
#include "operator/reconciler/job_reconciler.h"
#include "worker/core/build_info.h"

namespace pstar::op {
namespace {

constexpr const char* kUsage =
    "usage: pstar-operator [flags]\n"
    "  --kubeconfig PATH               kubeconfig (default: $KUBECONFIG, in-cluster, ~/.kube/config)\n"
    "  --namespace NS                  watch one namespace (default: all)\n"
    "  --workers N                     jobs reconciled in parallel (default 4)\n"
    "  --metrics-address A             address of /metrics, /healthz, /readyz (default 0.0.0.0)\n"
    "  --metrics-port P                their port (default 8080; 0 picks one)\n"
    "  --metrics-legacy-names          also serve each series under its old name, pstar_operator_*\n"
    "                                  (deprecated: the names are patrickstar_operator_*)\n"
    "  --leader-elect                  hold a Lease before reconciling (for several replicas)\n"
    "  --leader-election-namespace NS  the Lease's namespace (default: the pod's, else pstar)\n"
    "  --leader-election-id NAME       the Lease's name (default pstar-operator)\n"
    "  --identity ID                   this replica's name (default: hostname-pid)\n"
    "  --worker-image IMAGE            image of jobs that name none\n"
    "  --cpu-worker-image IMAGE        image of device: cpu jobs that name none (default: --worker-image)\n"
    "  --cluster-domain DOMAIN         cluster DNS domain (default cluster.local)\n"
    "  --pstar-command CMD             the worker command in pods (default pstar)\n"
    "  --no-node-check                 do not list nodes to check that pods fit\n"
    "  --gang-scheduler NAME           none (default), volcano, scheduler-plugins or kueue: place each job's\n"
    "                                  pods together, while the cluster serves that scheduler's API\n"
    "  --gang-scheduler-name NAME      the pods' schedulerName with it (default: volcano,\n"
    "                                  scheduler-plugins-scheduler; kueue: the default scheduler)\n"
    "  --qps Q --burst B               client-side API rate limit (default 50, 100)\n"
    "  --sync-timeout SECONDS          how long the caches may take to fill (default 120)\n"
    "  --progress-interval SECONDS     how often status.progress is read from rank 0 (default 30; 0: never)\n"
    "  --network-policy                a NetworkPolicy per job: its pods reach each other; from outside\n"
    "                                  only the metrics ports, for the two below\n"
    "  --monitoring-namespace NS       the namespace whose pods may scrape jobs (default monitoring)\n"
    "  --operator-namespace NS         this operator's namespace (default: $POD_NAMESPACE)\n"
    "  --operator-pod-labels K=V,...   labels selecting this operator's pods there\n";

struct Flags {
  std::string kubeconfig, ns, metrics_address = "0.0.0.0", lease_ns, lease_id = "pstar-operator", identity;
  int workers = 4, metrics_port = 8080, sync_timeout = 120, burst = 100, progress_interval = 30;
  double qps = 50;
  bool leader_elect = false, node_check = true, legacy_metric_names = false;
  OperatorDefaults defaults;
};

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    const size_t eq = name.find('=');
    const bool has_inline = eq != std::string::npos;
    if (has_inline) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto take = [&]() -> Result<std::string> {
      if (has_inline) return value;
      if (i + 1 >= args.size()) return Status::InvalidArgument(name + " needs a value");
      return args[++i];
    };
    auto take_int = [&](int lo, int hi, int* out) -> Status {
      auto v = take();
      if (!v.ok()) return v.status();
      char* end = nullptr;
      const long n = std::strtol(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || n < lo || n > hi) {
        return Status::InvalidArgument(name + " must be an integer in [" + std::to_string(lo) + ", " +
                                       std::to_string(hi) + "], not '" + *v + "'");
      }
      *out = int(n);
      return Status::Ok();
    };
    auto take_str = [&](std::string* out) -> Status {
      auto v = take();
      if (!v.ok()) return v.status();
      if (v->empty()) return Status::InvalidArgument(name + " must not be empty");
      *out = *v;
      return Status::Ok();
    };
    Status s;
    if (name == "--kubeconfig") s = take_str(&f.kubeconfig);
    else if (name == "--namespace") s = take_str(&f.ns);
    else if (name == "--workers") s = take_int(1, 256, &f.workers);
    else if (name == "--metrics-address") s = take_str(&f.metrics_address);
    else if (name == "--metrics-port") s = take_int(0, 65535, &f.metrics_port);
    else if (name == "--metrics-legacy-names") f.legacy_metric_names = true;
    else if (name == "--leader-elect") f.leader_elect = true;
    else if (name == "--leader-election-namespace") s = take_str(&f.lease_ns);
    else if (name == "--leader-election-id") s = take_str(&f.lease_id);
    else if (name == "--identity") s = take_str(&f.identity);
    else if (name == "--worker-image") s = take_str(&f.defaults.worker_image);
    else if (name == "--cpu-worker-image") s = take_str(&f.defaults.cpu_worker_image);
    else if (name == "--cluster-domain") s = take_str(&f.defaults.cluster_domain);
    else if (name == "--pstar-command") s = take_str(&f.defaults.pstar_command);
    else if (name == "--no-node-check") f.node_check = false;
    else if (name == "--gang-scheduler") {
      std::string scheduler;
      s = take_str(&scheduler);
      if (s.ok()) {
        Result<GangScheduler> parsed = ParseGangScheduler(scheduler);
        if (parsed.ok()) {
          f.defaults.gang.scheduler = *parsed;
        } else {
          s = parsed.status();
        }
      }
    }
    else if (name == "--gang-scheduler-name") s = take_str(&f.defaults.gang.scheduler_name);
    else if (name == "--network-policy") f.defaults.network_policy.enabled = true;
    else if (name == "--progress-interval") s = take_int(0, 86400, &f.progress_interval);
    else if (name == "--monitoring-namespace") s = take_str(&f.defaults.network_policy.monitoring_namespace);
    else if (name == "--operator-namespace") s = take_str(&f.defaults.network_policy.operator_namespace);
    else if (name == "--operator-pod-labels") {
      std::string list;
      s = take_str(&list);
      for (size_t at = 0; s.ok() && at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        const std::string item = list.substr(at, comma - at);
        const size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0) {
          s = Status::InvalidArgument("--operator-pod-labels: '" + item + "' is not KEY=VALUE");
        } else {
          f.defaults.network_policy.operator_pod_labels[item.substr(0, eq)] = item.substr(eq + 1);
        }
        at = comma + 1;
      }
    }
    else if (name == "--sync-timeout") s = take_int(1, 3600, &f.sync_timeout);
    else if (name == "--burst") s = take_int(1, 100000, &f.burst);
    else if (name == "--qps") {
      int q = 0;
      s = take_int(1, 100000, &q);
      f.qps = q;
    } else {
      return Status::InvalidArgument("unknown flag " + name + " (see --help)");
    }
    PSTAR_RETURN_IF_ERROR(s);
  }
  if (f.defaults.network_policy.operator_namespace.empty()) {
    if (const char* ns = std::getenv("POD_NAMESPACE"); ns != nullptr) f.defaults.network_policy.operator_namespace = ns;
  }
  if (f.defaults.network_policy.enabled && !f.defaults.network_policy.operator_namespace.empty() &&
      f.defaults.network_policy.operator_pod_labels.empty()) {
    return Status::InvalidArgument("--network-policy lets the operator reach the jobs' metrics: give "
                                   "--operator-pod-labels to select its pods");
  }
  if (f.identity.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    f.identity = std::string(host) + "-" + std::to_string(::getpid());
  }
  return f;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "pstar-operator: error: %s\n", s.message().c_str());
  return 1;
}

ReconcilerOptions ReconcilerOptionsFrom(const Flags& flags) {
  ReconcilerOptions options;
  options.watch_namespace = flags.ns;
  options.workers = flags.workers;
  options.defaults = flags.defaults;
  options.identity = flags.identity;
  options.watch_nodes = flags.node_check;
  options.poll_progress = flags.progress_interval > 0;
  options.progress.interval = std::chrono::seconds(std::max(1, flags.progress_interval));
  return options;
}

// The running operator: its metrics endpoint, the reconciler, and with
// --leader-elect the elector that starts the reconciler once it leads.
// Members go in the reverse of their order here: the elector and the
// reconciler before the metrics endpoint (which the reconciler records into),
// and that before the state its handlers read.
class OperatorProcess {
 public:
  OperatorProcess(const Flags& flags, const KubeConfig& config, std::unique_ptr<KubeClient> client)
      : flags_(flags), config_(config), client_(std::move(client)), leading_(!flags.leader_elect) {}

  // Until SIGTERM or SIGINT (which the caller blocked), or a lost lease;
  // returns the exit code.
  int Run(const sigset_t& stop_signals);

 private:
  Status StartMetrics();
  // Fills the caches and starts the workers (on the starter thread when
  // leading, so that the elector's thread keeps renewing).
  Status StartReconciling();
  Status ElectLeader();
  // Stops in the order that keeps every callback and handler safe.
  int Stop(int sig);

  const Flags& flags_;
  const KubeConfig& config_;
  std::unique_ptr<KubeClient> client_;
  LeaderElectionConfig lease_;  // outlives the elector's callbacks, which print it
  std::atomic<bool> leading_;
  std::atomic<bool> failed_{false};  // lost the lease, or could not start
  std::atomic<bool> stopping_{false};
  std::atomic<JobReconciler*> live_{nullptr};
  std::unique_ptr<OperatorMetrics> metrics_;
  std::unique_ptr<JobReconciler> reconciler_;
  std::unique_ptr<KubeClient> elector_client_;
  std::unique_ptr<LeaderElector> elector_;
  std::thread starter_;
};

Status OperatorProcess::StartMetrics() {
  OperatorMetricsOptions options;
  options.bind_address = flags_.metrics_address;
  options.legacy_names = flags_.legacy_metric_names;
  options.port = flags_.metrics_port;
  options.snapshot = [this] {
    JobReconciler* r = live_.load();
    OperatorSnapshot s = r != nullptr ? r->Snapshot() : OperatorSnapshot{};
    s.leader = leading_.load();
    return s;
  };
  options.healthy = [this] { return !failed_.load(); };
  options.ready = [this] {
    JobReconciler* r = live_.load();
    return !leading_.load() || (r != nullptr && r->Synced());
  };
  auto started = OperatorMetrics::Start(std::move(options));
  if (!started.ok()) return started.status().WithPrefix("metrics");
  metrics_ = std::move(started).value();
  std::printf("pstar-operator %s: metrics, /healthz and /readyz on %s:%d\n", kPstarVersion,
              flags_.metrics_address.c_str(), metrics_->port());
  std::fflush(stdout);
  return Status::Ok();
}

Status OperatorProcess::StartReconciling() {
  PSTAR_RETURN_IF_ERROR(reconciler_->Start(std::chrono::seconds(flags_.sync_timeout)));
  live_ = reconciler_.get();
  std::printf("pstar-operator: reconciling PatrickStarJobs in %s\n",
              flags_.ns.empty() ? "every namespace" : ("namespace " + flags_.ns).c_str());
  std::fflush(stdout);
  return Status::Ok();
}

Status OperatorProcess::ElectLeader() {
  lease_.lease_namespace = !flags_.lease_ns.empty()             ? flags_.lease_ns
                           : config_.default_namespace.empty() ? "pstar"
                                                               : config_.default_namespace;
  lease_.lease_name = flags_.lease_id;
  lease_.identity = flags_.identity;
  LeaderCallbacks callbacks;
  // The callbacks run on the elector's thread, which must keep renewing: the
  // caches fill on a thread of their own.
  callbacks.on_started_leading = [this] {
    leading_ = true;
    std::printf("pstar-operator: %s leads (lease %s/%s)\n", flags_.identity.c_str(), lease_.lease_namespace.c_str(),
                lease_.lease_name.c_str());
    std::fflush(stdout);
    starter_ = std::thread([this] {
      Status s = StartReconciling();
      if (!s.ok() && !stopping_) {
        std::fprintf(stderr, "pstar-operator: error: %s\n", s.message().c_str());
        failed_ = true;
        ::kill(::getpid(), SIGTERM);
      }
    });
  };
  callbacks.on_stopped_leading = [this] {
    leading_ = false;
    if (stopping_) return;  // released on the way out
    // Another replica may act on the jobs now: stop at once, restart clean.
    failed_ = true;
    std::fprintf(stderr, "pstar-operator: lost the leader lease; exiting\n");
    ::kill(::getpid(), SIGTERM);
  };
  // The elector has a client of its own, without retries and with a short
  // timeout, so one renewal can never outlast the renew deadline.
  ClientOptions lease_options;
  lease_options.request_timeout = lease_.retry_period;
  lease_options.max_retries = 0;
  auto lease_client = KubeClient::Create(config_, lease_options);
  if (!lease_client.ok()) return lease_client.status();
  elector_client_ = std::move(lease_client).value();
  elector_ = std::make_unique<LeaderElector>(*elector_client_, lease_, callbacks);
  elector_->Start();
  return Status::Ok();
}

int OperatorProcess::Stop(int sig) {
  stopping_ = true;
  std::printf("pstar-operator: stopping (%s)\n", failed_ ? "lost the lease or failed to start" : strsignal(sig));
  std::fflush(stdout);
  live_ = nullptr;
  // Requests in flight (a list or watch against a stalled server, a status
  // write) are cancelled, so the stop below is prompt; the next leader redoes
  // whatever they were doing.
  client_->Shutdown();
  reconciler_->Stop();  // also ends a start still waiting for the caches
  // Stop joins the elector's thread, so no callback runs after it; only then
  // is the starter thread (which a callback creates) joined. The lease is
  // released only once this replica no longer reconciles.
  if (elector_) elector_->Stop();
  if (starter_.joinable()) starter_.join();
  metrics_.reset();  // its handlers read the state above
  return failed_ ? 1 : 0;
}

int OperatorProcess::Run(const sigset_t& stop_signals) {
  if (Status s = StartMetrics(); !s.ok()) return Fail(s);
  reconciler_ = std::make_unique<JobReconciler>(*client_, ReconcilerOptionsFrom(flags_), metrics_.get());
  if (!flags_.leader_elect) {
    if (Status s = StartReconciling(); !s.ok()) {
      // Informers still listing a server that does not answer would hold
      // the exit for their retries: cancel them first.
      client_->Shutdown();
      return Fail(s);
    }
  } else if (Status s = ElectLeader(); !s.ok()) {
    return Fail(s);
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  return Stop(sig);
}

bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return true;
  }
  return false;
}

int Run(int argc, char** argv) {
  if (AsksForHelp(argc, argv)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "pstar-operator: error: %s\n", flags.status().message().c_str());
    return 2;
  }
  auto config = ResolveConfig(flags->kubeconfig);
  if (!config.ok()) return Fail(config.status());
  ClientOptions client_options;
  client_options.qps = flags->qps;
  client_options.burst = flags->burst;
  auto client = KubeClient::Create(*config, client_options);
  if (!client.ok()) return Fail(client.status());
  // SIGTERM and SIGINT end the process cleanly: the main thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  OperatorProcess process(*flags, *config, std::move(client).value());
  return process.Run(stop_signals);
}

}  // namespace
}  // namespace pstar::op

int main(int argc, char** argv) { return pstar::op::Run(argc, argv); }

#include "operator/controller/leader_election.h"

#include <random>

#include "operator/kube/kube_time.h"

namespace pstar::op {
namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t Seconds(std::chrono::milliseconds d) {
  return std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(d).count());
}

}  // namespace

LeaderElector::LeaderElector(KubeClient& client, LeaderElectionConfig config, LeaderCallbacks callbacks)
    : client_(client), config_(std::move(config)), callbacks_(std::move(callbacks)) {}

LeaderElector::~LeaderElector() { Stop(); }

void LeaderElector::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void LeaderElector::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string LeaderElector::ObservedLeader() const {
  std::lock_guard<std::mutex> lock(observed_mu_);
  return observed_holder_;
}

bool LeaderElector::SleepFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [this] { return stop_.load(); });
  return !stop_.load();
}

bool LeaderElector::TryAcquireOrRenew() {
  const auto now = std::chrono::system_clock::now();
  const std::string now_str = FormatMicroTime(now);
  ApiResponse got = client_.Get(Leases(), config_.lease_namespace, config_.lease_name);
  if (got.not_found()) {
    Json lease = {{"apiVersion", Leases().api_version()},
                  {"kind", Leases().kind},
                  {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
                  {"spec",
                   {{"holderIdentity", config_.identity},
                    {"leaseDurationSeconds", Seconds(config_.lease_duration)},
                    {"acquireTime", now_str},
                    {"renewTime", now_str},
                    {"leaseTransitions", 0}}}};
    ApiResponse created = client_.Create(Leases(), config_.lease_namespace, lease);
    if (!created.ok()) return false;  // 409: someone else created it first
    std::lock_guard<std::mutex> lock(observed_mu_);
    observed_holder_ = config_.identity;
    observed_renew_time_ = now_str;
    observed_at_ = SteadyClock::now();
    return true;
  }
  if (!got.ok() || !got.body.is_object()) return false;

  Json lease = got.body;
  Json spec = lease.contains("spec") && lease["spec"].is_object() ? lease["spec"] : Json::object();
  const std::string holder = spec.contains("holderIdentity") && spec["holderIdentity"].is_string()
                                 ? spec["holderIdentity"].get<std::string>()
                                 : "";
  const std::string renew = spec.contains("renewTime") && spec["renewTime"].is_string()
                                ? spec["renewTime"].get<std::string>()
                                : "";
  int64_t duration_s = spec.contains("leaseDurationSeconds") && spec["leaseDurationSeconds"].is_number_integer()
                           ? spec["leaseDurationSeconds"].get<int64_t>()
                           : Seconds(config_.lease_duration);
  bool holder_changed = false;
  SteadyClock::time_point observed_at;
  {
    std::lock_guard<std::mutex> lock(observed_mu_);
    if (holder != observed_holder_ || renew != observed_renew_time_) {
      holder_changed = holder != observed_holder_;
      observed_holder_ = holder;
      observed_renew_time_ = renew;
      observed_at_ = SteadyClock::now();
    }
    observed_at = observed_at_;
  }
  if (holder_changed && !holder.empty() && callbacks_.on_new_leader) callbacks_.on_new_leader(holder);

  const bool ours = holder == config_.identity;
  if (!holder.empty() && !ours && SteadyClock::now() < observed_at + std::chrono::seconds(duration_s)) {
    return false;  // held by someone else and not expired
  }
  if (!ours) {
    spec["acquireTime"] = now_str;
    int64_t transitions = spec.contains("leaseTransitions") && spec["leaseTransitions"].is_number_integer()
                              ? spec["leaseTransitions"].get<int64_t>()
                              : 0;
    spec["leaseTransitions"] = transitions + 1;
  } else if (!spec.contains("acquireTime")) {
    spec["acquireTime"] = now_str;
  }
  spec["holderIdentity"] = config_.identity;
  spec["leaseDurationSeconds"] = Seconds(config_.lease_duration);
  spec["renewTime"] = now_str;
  lease["spec"] = spec;
  ApiResponse put = client_.Replace(Leases(), config_.lease_namespace, lease);  // carries the RV
  if (!put.ok()) return false;  // 409: another candidate won the race
  std::lock_guard<std::mutex> lock(observed_mu_);
  observed_holder_ = config_.identity;
  observed_renew_time_ = now_str;
  observed_at_ = SteadyClock::now();
  return true;
}

void LeaderElector::Release() {
  ApiResponse got = client_.Get(Leases(), config_.lease_namespace, config_.lease_name);
  if (!got.ok() || !got.body.is_object()) return;
  Json lease = got.body;
  if (!lease.contains("spec") || lease["spec"].value("holderIdentity", "") != config_.identity) return;
  const std::string now_str = FormatMicroTime(std::chrono::system_clock::now());
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["leaseDurationSeconds"] = 1;
  lease["spec"]["renewTime"] = now_str;
  (void)client_.Replace(Leases(), config_.lease_namespace, lease);
}

void LeaderElector::Run() {
  std::mt19937_64 rng(std::random_device{}());
  auto jittered = [&](std::chrono::milliseconds d) {
    double f = std::uniform_real_distribution<double>(1.0, 1.2)(rng);
    return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(d.count()) * f));
  };
  // Acquire.
  while (!stop_.load()) {
    if (TryAcquireOrRenew()) break;
    if (!SleepFor(jittered(config_.retry_period))) return;
  }
  if (stop_.load()) return;
  leading_ = true;
  if (callbacks_.on_new_leader) callbacks_.on_new_leader(config_.identity);
  if (callbacks_.on_started_leading) callbacks_.on_started_leading();
  // Renew until stopped or the renew deadline passes without success.
  // A renewal counts from when it was attempted (the lease's renewTime is
  // that moment), and a lease found held by another replica ends leadership
  // at once. The client's request timeout must be well below renew_deadline.
  auto last_renew = SteadyClock::now();
  while (true) {
    if (!SleepFor(config_.retry_period)) break;
    const auto attempt = SteadyClock::now();
    if (TryAcquireOrRenew()) {
      last_renew = attempt;
      continue;
    }
    const std::string holder = ObservedLeader();
    if ((!holder.empty() && holder != config_.identity) ||
        SteadyClock::now() - last_renew >= config_.renew_deadline) {
      leading_ = false;
      if (callbacks_.on_stopped_leading) callbacks_.on_stopped_leading();
      return;
    }
  }
  Release();
  leading_ = false;
  if (callbacks_.on_stopped_leading) callbacks_.on_stopped_leading();
}

}  // namespace pstar::op

// LeaderElector: Lease-based leader election (coordination.k8s.io/v1), so
// only one operator replica reconciles at a time. A candidate takes the Lease
// when it is absent, released, or not renewed for leaseDurationSeconds (as
// observed on the candidate's own clock, so clock skew between replicas does
// not matter); the leader renews every retry period and steps down when it
// could not renew for the renew deadline. Stop() while leading releases the
// Lease so a successor takes over at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "operator/kube/kube_client.h"

namespace pstar::op {

struct LeaderElectionConfig {
  std::string lease_namespace;
  std::string lease_name;
  std::string identity;  // unique per replica, e.g. the pod name
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
};

// Called on the elector's thread; keep them short.
struct LeaderCallbacks {
  std::function<void()> on_started_leading;
  // Leadership lost (renewal failed past the deadline) or released by Stop().
  std::function<void()> on_stopped_leading;
  // The observed holder changed (also reports ourselves).
  std::function<void(const std::string& identity)> on_new_leader;
};

class LeaderElector {
 public:
  // `client` must outlive the elector.
  LeaderElector(KubeClient& client, LeaderElectionConfig config, LeaderCallbacks callbacks);
  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Runs the election on its own thread. After losing leadership the thread
  // ends (the operator is expected to exit and restart clean).
  void Start();
  // Stops the thread; releases the Lease when leading.
  void Stop();
  bool IsLeader() const { return leading_.load(); }
  // The holder last observed ("" = none or unknown).
  std::string ObservedLeader() const;

 private:
  void Run();
  // One attempt to acquire or renew; true when we hold the Lease afterwards.
  bool TryAcquireOrRenew();
  void Release();
  bool SleepFor(std::chrono::milliseconds d);  // false when stopping

  KubeClient& client_;
  const LeaderElectionConfig config_;
  const LeaderCallbacks callbacks_;

  std::atomic<bool> leading_{false};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;

  // The last observed Lease record and when (our monotonic clock) it changed.
  mutable std::mutex observed_mu_;
  std::string observed_holder_;
  std::string observed_renew_time_;
  std::chrono::steady_clock::time_point observed_at_{};
};

}  // namespace pstar::op

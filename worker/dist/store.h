// Store: the TCP key-value rendezvous that bootstraps a group of ranks (the
// role of torch's TCPStore). Rank 0 hosts the server on MASTER_PORT; every
// rank, rank 0 included, is a client of it. Ranks use it to publish their
// transport addresses and to wait for each other before the collectives run.
//
// Keys live under the rendezvous id, so two jobs that reach the same server
// cannot read each other's keys. Connecting retries with exponential backoff
// until the timeout (rank 0 may start after the others); every blocking call
// gives up at the timeout with a one-line Status naming host:port.
//
// Wire format: every request and reply is one frame, a 4-byte little-endian
// length followed by that many bytes; keys and values are bounded (below), so
// a stray client cannot make the server allocate without limit.
//
// Authentication: with a token (PSTAR_STORE_TOKEN; `pstar launch` makes one,
// the operator keeps one per job in a Secret), a connection must open with a
// hello carrying the same token within kStoreHelloWithin, in a small frame;
// until then the server answers nothing else, and a wrong token, a late or
// oversized hello closes the connection. Without one, any peer that reaches
// the port may use the store (the server then refuses clients that bring a
// token, which means the ranks disagree).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

inline constexpr size_t kStoreMaxKeyBytes = 4096;
inline constexpr size_t kStoreMaxValueBytes = size_t(16) << 20;
// The server's bounds against a peer that is not a rank: connections at once
// (several per rank of the largest jobs), and all keys and values together.
inline constexpr size_t kMaxStoreClients = 4096;
inline constexpr size_t kMaxStoreBytes = size_t(256) << 20;
inline constexpr std::chrono::milliseconds kStoreHelloWithin{10000};
inline constexpr size_t kStoreMaxTokenBytes = 1024;

struct StoreOptions {
  std::string host = "127.0.0.1";  // where rank 0's server is reached
  int port = 29500;
  std::string rdzv_id = "pstar";
  int rank = 0;  // rank 0 hosts the server
  int world_size = 1;
  // Bounds connecting and every blocking call (Get, Wait).
  std::chrono::milliseconds timeout{30000};
  // The shared secret every rank presents (rank 0's server requires it);
  // empty: no authentication.
  std::string token;
};

class StoreServer;

class Store {
 public:
  // Rank 0 first starts the server (listening on every interface at `port`),
  // then every rank connects as a client, retrying until the timeout.
  static Result<std::unique_ptr<Store>> Connect(const StoreOptions& options);
  // Rank 0's Store stops the server after the other ranks have disconnected,
  // waiting at most a few seconds for them.
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  Status Set(const std::string& key, std::string value);
  // Blocks until the key exists or the timeout passes.
  Result<std::string> Get(const std::string& key) { return Get(key, options_.timeout); }
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);
  // Atomically adds `delta` to the integer counter at `key` (absent: 0) and
  // returns the new value. Get reads a counter as decimal text.
  Result<int64_t> Add(const std::string& key, int64_t delta);
  // Blocks until every key exists or the timeout passes.
  Status Wait(const std::vector<std::string>& keys) { return Wait(keys, options_.timeout); }
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  const StoreOptions& options() const { return options_; }
  // "host:port" of the server, as messages name it.
  std::string server() const;
  // The local IP address of this client's connection: the interface that
  // reaches the server, where this rank's transport should listen.
  const std::string& local_address() const { return local_address_; }
  // A fresh key prefix "<name>/<n>", n counting the calls on this Store. Ranks
  // that make the same calls in the same order get the same prefixes, so each
  // rendezvous built on one Store (e.g. one communicator) has its own keys.
  std::string NextScope(const std::string& name);

 private:
  explicit Store(const StoreOptions& options);
  // One request/reply round trip, the reply due by `deadline`.
  Result<std::string> Call(const std::string& request, std::chrono::steady_clock::time_point deadline);
  std::string Namespaced(const std::string& key) const { return options_.rdzv_id + "/" + key; }

  StoreOptions options_;
  std::unique_ptr<StoreServer> server_;  // rank 0 only
  std::mutex mu_;                        // one request in flight per connection
  int fd_ = -1;
  std::string local_address_;
  int scopes_ = 0;
};

// "2 s", "1.5 s", "250 ms": a timeout as messages name it.
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace pstar

#include "worker/dist/gloo_communicator.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

namespace pstar {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Gloo's rendezvous store interface over ours. Gloo reports failures as
// exceptions; the first Status is kept so the caller can return it verbatim.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(pstar::Store& store, std::string scope, milliseconds timeout)
      : store_(store), scope_(std::move(scope)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(Key(key), std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    Result<std::string> value = store_.Get(Key(key), timeout_);
    Check(Missing(key, value.status(), timeout_));
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  // Gloo's keys are the ranks; a missing one is a rank that never joined.
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    const milliseconds limit = timeout.count() > 0 ? timeout : timeout_;
    const Clock::time_point deadline = Clock::now() + limit;
    for (const std::string& k : keys) {
      const auto left = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      Check(Missing(k, store_.Wait({Key(k)}, left), limit));
    }
  }

  const Status& error() const { return error_; }

 private:
  std::string Key(const std::string& key) const { return scope_ + "/" + key; }
  // A rank's key missing at the timeout means the rank never joined.
  Status Missing(const std::string& key, Status s, milliseconds limit) const {
    if (s.ok() || key.empty() || key.find_first_not_of("0123456789") != std::string::npos ||
        s.message().find("was not set within") == std::string::npos) {
      return s;
    }
    return Status::Internal("rank " + key + " did not join within " + FormatDuration(limit) + " (store at " +
                            store_.server() + ")");
  }
  void Check(const Status& s) {
    if (s.ok()) return;
    if (error_.ok()) error_ = s;
    throw gloo::IoException(s.message());
  }

  pstar::Store& store_;
  const std::string scope_;
  const milliseconds timeout_;
  Status error_;
};

// Gloo's messages start with "[/path/file.cc:123] " and may span lines.
std::string GlooText(const char* what) {
  std::string s = what;
  if (!s.empty() && s[0] == '[') {
    const size_t end = s.find("] ");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// Gloo writes to its sockets without MSG_NOSIGNAL, so writing to a peer that
// just died raises SIGPIPE, whose default action kills the process before the
// error can be reported. While one of these lives, SIGPIPE is blocked in the
// calling thread, and one raised meanwhile is discarded. Threads Gloo starts
// inherit the blocked mask. The process-wide disposition stays untouched.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~ScopedSigpipeBlock() {
    if (sigismember(&previous_, SIGPIPE)) return;  // it was blocked already
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) {
      const timespec now{0, 0};
      sigtimedwait(&pipe_, nullptr, &now);
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_, previous_;
};

// One point-to-point transfer of a collective step.
struct Transfer {
  int peer;
  void* data;
  size_t bytes;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::unique_ptr<Store> owned_store, int rank, int world_size, milliseconds timeout)
      : owned_store_(std::move(owned_store)), rank_(rank), size_(world_size), timeout_(timeout) {}

  Status Connect(Store& store);

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  Status AllGather(const float* shard, float* full, int64_t shard_elems) override {
    if (shard_elems < 0) return Status::InvalidArgument("all_gather: negative shard size");
    return Counted(CollectiveOp::kAllGather, [&](int64_t* sent) {
      float* mine = full + int64_t(rank_) * shard_elems;
      if (shard != mine) std::memmove(mine, shard, size_t(shard_elems) * sizeof(float));
      return RingAllGather(CollectiveOp::kAllGather, 0, reinterpret_cast<char*>(full),
                           EvenOffsets(shard_elems * int64_t(sizeof(float))), sent);
    });
  }

  Status ReduceScatter(const float* full, float* shard, int64_t shard_elems) override {
    if (shard_elems < 0) return Status::InvalidArgument("reduce_scatter: negative shard size");
    return Counted(CollectiveOp::kReduceScatter,
                   [&](int64_t* sent) { return RingReduceScatter(full, shard, shard_elems, sent); });
  }

  Status ReduceScatterHalf(const uint16_t* full, uint16_t* shard, int64_t shard_elems, HalfFormat format) override {
    if (shard_elems < 0) return Status::InvalidArgument("reduce_scatter: negative shard size");
    return Counted(CollectiveOp::kReduceScatter,
                   [&](int64_t* sent) { return RingReduceScatterHalf(full, shard, shard_elems, format, sent); });
  }

  Status AllReduceSum(double* data, int64_t n) override {
    if (n < 0) return Status::InvalidArgument("all_reduce: negative element count");
    return Counted(CollectiveOp::kAllReduce, [&](int64_t* sent) {
      return n * int64_t(sizeof(double)) <= kDirectAllReduceBytes ? DirectAllReduce(data, n, sent)
                                                                  : RingAllReduce(data, n, sent);
    });
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    if (bytes < 0) return Status::InvalidArgument("broadcast: negative byte count");
    if (root < 0 || root >= size_) {
      return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank of " +
                                     std::to_string(size_));
    }
    return Counted(CollectiveOp::kBroadcast, [&](int64_t* sent) {
      std::vector<Transfer> sends, recvs;
      if (rank_ == root) {
        for (int p = 0; p < size_; ++p) {
          if (p != rank_) sends.push_back({p, data, size_t(bytes)});
        }
      } else {
        recvs.push_back({root, data, size_t(bytes)});
      }
      return Exchange(CollectiveOp::kBroadcast, 0, sends, recvs, sent);
    });
  }

  Status Barrier() override {
    return Counted(CollectiveOp::kBarrier, [&](int64_t* sent) { return RingBarrier(sent); });
  }

 private:
  // Runs one collective: refuses once broken, times it, counts it, and keeps
  // the first failure.
  template <typename Fn>
  Status Counted(CollectiveOp op, Fn&& fn) {
    if (!broken_.ok()) {
      return Status::Internal(std::string(CollectiveOpName(op)) +
                              ": the communicator failed earlier: " + broken_.message());
    }
    const int i = int(op);
    ScopedSigpipeBlock no_sigpipe;
    const Clock::time_point start = Clock::now();
    int64_t sent = 0;
    Status s = fn(&sent);
    counters_.calls[size_t(i)] += 1;
    counters_.bytes[size_t(i)] += sent;
    counters_.nanoseconds[size_t(i)] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    if (!s.ok()) broken_ = s;
    return s;
  }

  // Gloo matches a send to a receive by (peer, slot). Each op and step has its
  // own slot, above the range Gloo's own collectives use.
  static uint64_t Slot(CollectiveOp op, int step) {
    return (uint64_t(0x70 + int(op)) << 56) | uint64_t(step);
  }
  static constexpr uint64_t kAckSlotBit = uint64_t(1) << 55;

  // Byte (or element) offsets of N equal blocks of `block` each.
  std::vector<size_t> EvenOffsets(int64_t block) const {
    std::vector<size_t> off(size_t(size_) + 1);
    for (int i = 0; i <= size_; ++i) off[size_t(i)] = size_t(block) * size_t(i);
    return off;
  }
  int Next() const { return (rank_ + 1) % size_; }
  int Prev() const { return (rank_ + size_ - 1) % size_; }
  int Mod(int i) const { return ((i % size_) + size_) % size_; }

  // Posts every receive, then every send, then waits for all of them. Each
  // receiver acknowledges a transfer with one byte on a sibling slot, and a
  // sender waits for that acknowledgement: Gloo fails pending receives when a
  // connection breaks, but not always a send already queued on it. Empty
  // transfers are skipped (both sides agree on the sizes). Adds the payload
  // bytes sent (not the acknowledgements) to *sent.
  Status Exchange(CollectiveOp op, int step, const std::vector<Transfer>& sends,
                  const std::vector<Transfer>& recvs, int64_t* sent);
  Status Exchange(CollectiveOp op, int step, Transfer send, Transfer recv, int64_t* sent) {
    return Exchange(op, step, std::vector<Transfer>{send}, std::vector<Transfer>{recv}, sent);
  }

  // Ring all-gather of blocks [off[i], off[i+1]) of `data`, block r already in
  // place on rank r: N-1 steps, each passing on the block received last.
  Status RingAllGather(CollectiveOp op, int first_step, char* data, const std::vector<size_t>& off,
                       int64_t* sent) {
    auto block = [&](int peer, int i) {
      return Transfer{peer, data + off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]};
    };
    for (int s = 0; s < size_ - 1; ++s) {
      PSTAR_RETURN_IF_ERROR(
          Exchange(op, first_step + s, block(Next(), Mod(rank_ - s)), block(Prev(), Mod(rank_ - s - 1)), sent));
    }
    return Status();
  }

  // Ring reduce-scatter: at step s rank r passes on its partial sum of block
  // r-s-1 and adds its own part to the partial of block r-s-2 it receives.
  // After N-1 steps it holds the total of block r.
  Status RingReduceScatter(const float* full, float* shard, int64_t n, int64_t* sent) {
    const size_t bytes = size_t(n) * sizeof(float);
    acc_.resize(size_t(n));
    recv_.resize(size_t(n));
    for (int s = 0; s < size_ - 1; ++s) {
      const int cs = Mod(rank_ - s - 1), cr = Mod(rank_ - s - 2);
      // The first step sends this rank's own part; Gloo only reads a send.
      void* out = s == 0 ? const_cast<float*>(full + int64_t(cs) * n) : acc_.data();
      PSTAR_RETURN_IF_ERROR(
          Exchange(CollectiveOp::kReduceScatter, s, {Next(), out, bytes}, {Prev(), recv_.data(), bytes}, sent));
      const float* own = full + int64_t(cr) * n;
      for (int64_t i = 0; i < n; ++i) acc_[size_t(i)] = recv_[size_t(i)] + own[i];
    }
    std::memcpy(shard, acc_.data(), bytes);
    return Status();
  }

  // The same ring over 16-bit values: each partial sum taken in fp32 (the
  // received value and this rank's part, both widened exactly) and rounded
  // to `format` before it is passed on.
  Status RingReduceScatterHalf(const uint16_t* full, uint16_t* shard, int64_t n, HalfFormat format, int64_t* sent) {
    const size_t bytes = size_t(n) * sizeof(uint16_t);
    acc_half_.resize(size_t(n));
    recv_half_.resize(size_t(n));
    acc_.resize(size_t(n));
    recv_.resize(size_t(n));
    for (int s = 0; s < size_ - 1; ++s) {
      const int cs = Mod(rank_ - s - 1), cr = Mod(rank_ - s - 2);
      void* out = s == 0 ? const_cast<uint16_t*>(full + int64_t(cs) * n) : acc_half_.data();
      PSTAR_RETURN_IF_ERROR(Exchange(CollectiveOp::kReduceScatter, s, {Next(), out, bytes},
                                     {Prev(), recv_half_.data(), bytes}, sent));
      WidenFromHalf(recv_.data(), recv_half_.data(), n, format);
      WidenFromHalf(acc_.data(), full + int64_t(cr) * n, n, format);
      for (int64_t i = 0; i < n; ++i) acc_[size_t(i)] = recv_[size_t(i)] + acc_[size_t(i)];
      NarrowToHalf(acc_half_.data(), acc_.data(), n, format);
    }
    std::memcpy(shard, acc_half_.data(), bytes);
    return Status();
  }

  // Ring all-reduce in place: the reduce-scatter above over N near-equal
  // blocks, then an all-gather of the totals.
  // A small all-reduce (the step's loss, norm and stop vote) is bound by
  // latency, not bandwidth: every rank sends its vector to every other in one
  // exchange, where the ring takes 2(N-1) exchanges one after another. Each
  // rank adds the vectors up in rank order, so every rank holds the same bits.
  static constexpr int64_t kDirectAllReduceBytes = 4096;
  Status DirectAllReduce(double* data, int64_t n, int64_t* sent) {
    const size_t bytes = size_t(n) * sizeof(double);
    std::vector<double> from(size_t(size_) * size_t(n));
    std::vector<Transfer> sends, recvs;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      sends.push_back({p, data, bytes});
      recvs.push_back({p, from.data() + size_t(p) * size_t(n), bytes});
    }
    PSTAR_RETURN_IF_ERROR(Exchange(CollectiveOp::kAllReduce, 0, sends, recvs, sent));
    std::copy(data, data + n, from.begin() + ptrdiff_t(rank_) * n);
    for (int64_t i = 0; i < n; ++i) {
      double sum = from[size_t(i)];
      for (int p = 1; p < size_; ++p) sum += from[size_t(p) * size_t(n) + size_t(i)];
      data[i] = sum;
    }
    return Status();
  }

  Status RingAllReduce(double* data, int64_t n, int64_t* sent) {
    std::vector<size_t> off(size_t(size_) + 1);
    for (int i = 0; i <= size_; ++i) off[size_t(i)] = size_t(n * i / size_);
    std::vector<double> recv(size_t(n / size_ + 1));
    for (int s = 0; s < size_ - 1; ++s) {
      const int cs = Mod(rank_ - s - 1), cr = Mod(rank_ - s - 2);
      const size_t ns = off[size_t(cs) + 1] - off[size_t(cs)], nr = off[size_t(cr) + 1] - off[size_t(cr)];
      PSTAR_RETURN_IF_ERROR(Exchange(CollectiveOp::kAllReduce, s, {Next(), data + off[size_t(cs)], ns * sizeof(double)},
                                     {Prev(), recv.data(), nr * sizeof(double)}, sent));
      double* own = data + off[size_t(cr)];
      for (size_t i = 0; i < nr; ++i) own[i] = recv[i] + own[i];
    }
    for (size_t& o : off) o *= sizeof(double);
    return RingAllGather(CollectiveOp::kAllReduce, size_ - 1, reinterpret_cast<char*>(data), off, sent);
  }

  // Every rank's token has reached every rank only once all have arrived.
  Status RingBarrier(int64_t* sent) {
    std::vector<char> tokens(size_t(size_), 1);
    return RingAllGather(CollectiveOp::kBarrier, 0, tokens.data(), EvenOffsets(1), sent);
  }

  // Declared first: destroyed after the Gloo context that rendezvoused on it.
  std::unique_ptr<Store> owned_store_;
  const int rank_, size_;
  const milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  char ack_byte_ = 1;
  std::unique_ptr<gloo::transport::UnboundBuffer> ack_out_;  // every acknowledgement is sent from here
  Status broken_;
  std::vector<float> acc_, recv_;  // reduce-scatter scratch, reused
  std::vector<uint16_t> acc_half_, recv_half_;
};

Status GlooCommunicator::Connect(Store& store) {
  ScopedSigpipeBlock no_sigpipe;  // also for the device thread started here
  const std::string where = store.local_address().empty() ? "127.0.0.1" : store.local_address();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = where;
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return Status::Internal("gloo: cannot listen on " + where + ": " + GlooText(e.what()));
  }
  GlooStoreAdapter adapter(store, store.NextScope("gloo"), timeout_);
  try {
    context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context_->setTimeout(timeout_);
    context_->connectFullMesh(adapter, device_);
  } catch (const std::exception& e) {
    if (!adapter.error().ok()) return adapter.error().WithPrefix("gloo rendezvous");
    return Status::Internal("gloo rendezvous of rank " + std::to_string(rank_) + " failed: " + GlooText(e.what()));
  }
  ack_out_ = context_->createUnboundBuffer(&ack_byte_, 1);
  // Every rank has connected all its pairs once this returns, so no rank needs
  // the store any more: rank 0 may stop serving it.
  int64_t unused = 0;
  Status s = RingBarrier(&unused);
  if (!s.ok()) return s.WithPrefix("gloo rendezvous");
  return Status();
}

Status GlooCommunicator::Exchange(CollectiveOp op, int step, const std::vector<Transfer>& sends,
                                  const std::vector<Transfer>& recvs, int64_t* sent) {
  const uint64_t slot = Slot(op, step), ack_slot = slot | kAckSlotBit;
  using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;
  std::vector<Buffer> data_in, acks_in, data_out;
  std::vector<char> ack_bytes(sends.size());
  const Transfer* current = nullptr;  // the transfer a failure concerns
  bool sending = false;
  try {
    for (const Transfer& t : recvs) {
      if (t.bytes == 0) continue;
      current = &t;
      data_in.push_back(context_->createUnboundBuffer(t.data, t.bytes));
      data_in.back()->recv(t.peer, slot);
    }
    sending = true;
    for (size_t i = 0; i < sends.size(); ++i) {
      const Transfer& t = sends[i];
      if (t.bytes == 0) continue;
      current = &t;
      acks_in.push_back(context_->createUnboundBuffer(&ack_bytes[i], 1));
      acks_in.back()->recv(t.peer, ack_slot);
      data_out.push_back(context_->createUnboundBuffer(t.data, t.bytes));
      data_out.back()->send(t.peer, slot);
      *sent += int64_t(t.bytes);
    }
    sending = false;
    size_t i = 0;
    for (const Transfer& t : recvs) {
      if (t.bytes == 0) continue;
      current = &t;
      if (!data_in[i++]->waitRecv(timeout_)) throw std::runtime_error("receive aborted");
      // Never waited for: the peer's acknowledgement receive is already
      // posted, and a lost peer shows up in this rank's next receive.
      ack_out_->send(t.peer, ack_slot);
    }
    // A send whose peer died may never complete (Gloo leaves it queued), but
    // the peer's acknowledgement then fails at once: wait for those first.
    sending = true;
    i = 0;
    for (const Transfer& t : sends) {
      if (t.bytes == 0) continue;
      current = &t;
      if (!acks_in[i]->waitRecv(timeout_)) throw std::runtime_error("receive aborted");
      if (!data_out[i++]->waitSend(timeout_)) throw std::runtime_error("send aborted");
    }
  } catch (const std::exception& e) {
    const std::string name = CollectiveOpName(op);
    const std::string text = GlooText(e.what());
    if (current == nullptr) return Status::Internal(name + " failed: " + text);
    const std::string peer = "rank " + std::to_string(current->peer);
    if (text.find("Timed out") != std::string::npos) {
      return Status::Internal(name + " failed: " + peer + (sending ? " took none of our data" : " sent nothing") +
                              " within " + FormatDuration(timeout_) + " (is it alive?)");
    }
    return Status::Internal(name + " failed: lost the connection to " + peer + " (" + text + ")");
  }
  return Status();
}

Result<std::unique_ptr<Communicator>> MakeGloo(std::unique_ptr<Store> owned, Store& store, int rank,
                                               int world_size, milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("gloo: rank " + std::to_string(rank) + " is outside a world of " +
                                   std::to_string(world_size));
  }
  if (timeout.count() <= 0) return Status::InvalidArgument("gloo: the timeout must be positive");
  if (world_size == 1) return MakeSingleRankCommunicator();
  auto comm = std::make_unique<GlooCommunicator>(std::move(owned), rank, world_size, timeout);
  PSTAR_RETURN_IF_ERROR(comm->Connect(store));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace

Result<std::unique_ptr<Communicator>> MakeGlooCommunicator(Store& store, int rank, int world_size,
                                                           milliseconds timeout) {
  return MakeGloo(nullptr, store, rank, world_size, timeout);
}

Result<std::unique_ptr<Communicator>> MakeGlooCommunicator(std::unique_ptr<Store> store, int rank,
                                                           int world_size, milliseconds timeout) {
  if (store == nullptr) return Status::InvalidArgument("gloo: no store");
  Store& ref = *store;
  return MakeGloo(std::move(store), ref, rank, world_size, timeout);
}

}  // namespace pstar

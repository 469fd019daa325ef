#include "worker/dist/dist_env.h"

#include <charconv>
#include <cstdlib>

#include "worker/dist/gloo_communicator.h"
#ifdef PSTAR_WITH_NCCL
#include "worker/dist/nccl_communicator.h"
#endif
#include "worker/dist/store.h"

namespace pstar {

namespace {

// Reads integer variable `name` into *out when it is set; keeps *out otherwise.
Status ReadInt(const std::function<const char*(const char*)>& lookup, const char* name, int* out) {
  const char* v = lookup(name);
  if (v == nullptr || *v == '\0') return Status();
  const std::string s = v;
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return Status::InvalidArgument(std::string(name) + " must be an integer, got '" + s + "'");
  }
  *out = value;
  return Status();
}

}  // namespace

Result<DistEnv> ParseDistEnv(const std::function<const char*(const char*)>& lookup) {
  DistEnv env;
  PSTAR_RETURN_IF_ERROR(ReadInt(lookup, "WORLD_SIZE", &env.world_size));
  PSTAR_RETURN_IF_ERROR(ReadInt(lookup, "RANK", &env.rank));
  PSTAR_RETURN_IF_ERROR(ReadInt(lookup, "LOCAL_WORLD_SIZE", &env.local_world_size));
  PSTAR_RETURN_IF_ERROR(ReadInt(lookup, "LOCAL_RANK", &env.local_rank));
  PSTAR_RETURN_IF_ERROR(ReadInt(lookup, "MASTER_PORT", &env.master_port));
  auto is_set = [&](const char* name) {
    const char* v = lookup(name);
    return v != nullptr && *v != '\0';
  };
  if (is_set("MASTER_ADDR")) env.master_addr = lookup("MASTER_ADDR");
  if (is_set("PSTAR_RDZV_ID")) env.rdzv_id = lookup("PSTAR_RDZV_ID");
  if (is_set("PSTAR_STORE_TOKEN")) env.store_token = lookup("PSTAR_STORE_TOKEN");

  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (env.world_size < 1) return bad("WORLD_SIZE must be at least 1, got " + std::to_string(env.world_size));
  if (env.world_size > 1 && !is_set("RANK")) {
    return bad("RANK is not set, but WORLD_SIZE is " + std::to_string(env.world_size));
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    return bad("RANK must be in 0.." + std::to_string(env.world_size - 1) + " (WORLD_SIZE " +
               std::to_string(env.world_size) + "), got " + std::to_string(env.rank));
  }
  if (env.local_world_size < 1 || env.local_world_size > env.world_size) {
    return bad("LOCAL_WORLD_SIZE must be in 1.." + std::to_string(env.world_size) + " (WORLD_SIZE), got " +
               std::to_string(env.local_world_size));
  }
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size) {
    return bad("LOCAL_RANK must be in 0.." + std::to_string(env.local_world_size - 1) +
               " (LOCAL_WORLD_SIZE " + std::to_string(env.local_world_size) + "), got " +
               std::to_string(env.local_rank));
  }
  if (env.master_port < 1 || env.master_port > 65535) {
    return bad("MASTER_PORT must be in 1..65535, got " + std::to_string(env.master_port));
  }
  if (env.rdzv_id.size() > 256) return bad("PSTAR_RDZV_ID must have at most 256 characters");
  if (env.store_token.size() > kStoreMaxTokenBytes) {
    return bad("PSTAR_STORE_TOKEN must have at most " + std::to_string(kStoreMaxTokenBytes) + " bytes");
  }
  return env;
}

Result<DistEnv> ReadDistEnv() {
  return ParseDistEnv([](const char* name) -> const char* { return std::getenv(name); });
}

Result<std::unique_ptr<Communicator>> ConnectCommunicator(const DistEnv& env, std::chrono::milliseconds timeout,
                                                          Transport transport) {
  if (env.world_size == 1) return MakeSingleRankCommunicator();
#ifndef PSTAR_WITH_NCCL
  if (transport == Transport::kNccl) {
    return Status::FailedPrecondition("a GPU run with " + std::to_string(env.world_size) +
                                      " ranks needs NCCL, and this pstar was built without it");
  }
#endif
  StoreOptions options;
  options.host = env.master_addr;
  options.port = env.master_port;
  options.rdzv_id = env.rdzv_id;
  options.rank = env.rank;
  options.world_size = env.world_size;
  options.timeout = timeout;
  options.token = env.store_token;
  PSTAR_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Connect(options));
  // Queued, so that collectives can run under the compute (every caller
  // shares the one queue, and with it one order of collectives).
#ifdef PSTAR_WITH_NCCL
  if (transport == Transport::kNccl) {
    PSTAR_ASSIGN_OR_RETURN(auto nccl,
                           MakeNcclCommunicator(std::move(store), env.rank, env.world_size, env.local_rank, timeout));
    return MakeQueuedCommunicator(std::move(nccl));
  }
#endif
  PSTAR_ASSIGN_OR_RETURN(auto gloo, MakeGlooCommunicator(std::move(store), env.rank, env.world_size, timeout));
  return MakeQueuedCommunicator(std::move(gloo));
}

}  // namespace pstar

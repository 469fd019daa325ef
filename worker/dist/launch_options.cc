#include "worker/dist/launch_options.h"

#include <algorithm>
#include <charconv>
#include <thread>

namespace pstar {

namespace {

constexpr int kMaxWorldSize = 1 << 16;

Status ParseInt(const std::string& option, const std::string& text, int min, int max, int* out) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || value < min || value > max) {
    return Status::InvalidArgument("launch: " + option + " must be an integer in " + std::to_string(min) + ".." +
                                   std::to_string(max) + ", got '" + text + "'");
  }
  *out = value;
  return Status();
}

}  // namespace

Result<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool have_nproc = false, have_command = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      o.command.assign(args.begin() + int64_t(i) + 1, args.end());
      have_command = true;
      break;
    }
    std::string name = args[i], value;
    const size_t eq = name.find('=');
    if (name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    // torchrun spells the options with underscores.
    if (name.rfind("--", 0) == 0) std::replace(name.begin() + 2, name.end(), '_', '-');
    if (name == "--standalone") {
      if (eq != std::string::npos) return Status::InvalidArgument("launch: --standalone takes no value");
      o.standalone = true;
      continue;
    }
    if (eq != std::string::npos) {
      // the value came with the option
    } else if (name == "--nproc-per-node" || name == "--nnodes" || name == "--node-rank" ||
               name == "--master-addr" || name == "--master-port" || name == "--rdzv-id") {
      if (i + 1 >= args.size()) return Status::InvalidArgument("launch: " + name + " needs a value");
      value = args[++i];
    } else {
      return Status::InvalidArgument("launch: unknown option '" + name + "' (the command to run goes after '--')");
    }
    if (name == "--nproc-per-node") {
      PSTAR_RETURN_IF_ERROR(ParseInt(name, value, 1, kMaxWorldSize, &o.nproc_per_node));
      have_nproc = true;
    } else if (name == "--nnodes") {
      PSTAR_RETURN_IF_ERROR(ParseInt(name, value, 1, kMaxWorldSize, &o.nnodes));
    } else if (name == "--node-rank") {
      PSTAR_RETURN_IF_ERROR(ParseInt(name, value, 0, kMaxWorldSize - 1, &o.node_rank));
    } else if (name == "--master-port") {
      PSTAR_RETURN_IF_ERROR(ParseInt(name, value, 1, 65535, &o.master_port));
    } else if (name == "--master-addr" || name == "--rdzv-id") {
      if (value.empty()) return Status::InvalidArgument("launch: " + name + " must not be empty");
      (name == "--master-addr" ? o.master_addr : o.rdzv_id) = value;
    } else {
      return Status::InvalidArgument("launch: unknown option '" + name + "'");
    }
  }
  if (!have_nproc) return Status::InvalidArgument("launch: --nproc-per-node is required");
  if (o.standalone) {
    if (o.nnodes != 1 || o.node_rank != 0) {
      return Status::InvalidArgument("launch: --standalone runs one node; drop --nnodes/--node-rank");
    }
    o.master_addr = "127.0.0.1";
    o.master_port = 0;  // picked free by the launcher
  }
  if (int64_t(o.nnodes) * o.nproc_per_node > kMaxWorldSize) {
    return Status::InvalidArgument("launch: more than " + std::to_string(kMaxWorldSize) + " ranks");
  }
  if (o.node_rank >= o.nnodes) {
    return Status::InvalidArgument("launch: --node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                                   std::to_string(o.nnodes));
  }
  if (!have_command || o.command.empty()) {
    return Status::InvalidArgument("launch: no command; put the pstar command after '--', e.g. "
                                   "'pstar launch --nproc-per-node 2 -- train --config job.yaml'");
  }
  if (o.command[0] == "launch") return Status::InvalidArgument("launch: the command cannot be 'launch' itself");
  return o;
}

std::vector<std::string> RankEnvironment(const LaunchOptions& options, int local_rank,
                                         const char* const* environ) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(options.node_rank * options.nproc_per_node + local_rank)},
      {"WORLD_SIZE", std::to_string(options.world_size())},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
      {"PSTAR_RDZV_ID", options.rdzv_id},
  };
  std::vector<std::pair<std::string, std::string>> set = ours;
  if (!options.store_token.empty()) set.emplace_back("PSTAR_STORE_TOKEN", options.store_token);
  std::vector<std::string> env;
  bool has_omp_threads = false;
  for (const char* const* e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [n, v] : set) replaced = replaced || n == name;
    if (replaced) continue;
    has_omp_threads = has_omp_threads || name == "OMP_NUM_THREADS";
    env.push_back(entry);
  }
  for (const auto& [n, v] : set) env.push_back(n + "=" + v);
  if (!has_omp_threads) {
    const int threads = std::max(1, int(std::thread::hardware_concurrency()) / options.nproc_per_node);
    env.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  }
  return env;
}

}  // namespace pstar

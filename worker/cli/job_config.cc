#include "worker/cli/commands.h"

namespace pstar::cli {

Result<JobArgs> ParseJobArgs(const std::string& command, const std::vector<std::string>& args,
                             const std::vector<std::string>& flags) {
  JobArgs job;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--config" || a == "--set") {
      if (i + 1 >= args.size()) return Status::InvalidArgument(a + " needs a value");
      (a == "--config" ? job.config_path : job.overrides.emplace_back()) = args[++i];
      continue;
    }
    bool known = false;
    for (const std::string& f : flags) known = known || a == f;
    if (!known) return Status::InvalidArgument(command + ": unknown option '" + a + "'");
    job.flags.push_back(a);
  }
  return job;
}

Result<Config> LoadJobConfig(const JobArgs& job) {
  if (!job.config_path.empty()) return LoadConfigFile(job.config_path, job.overrides);
  // The built-in job's model is only a default: a directory given with
  // --set model.init_from describes the model in its place.
  std::vector<std::string> overrides = job.overrides;
  for (const std::string& o : job.overrides) {
    if (o.rfind("model.init_from=", 0) == 0) {
      overrides.insert(overrides.begin(), "model.preset=\"\"");
      break;
    }
  }
  return ParseConfig(DefaultConfigYaml(), "default config", overrides);
}

}  // namespace pstar::cli

// The CRD schema against the parser: every spec field ParseJob accepts is in
// the schema and nothing else is, defaults and enums agree, and the status
// schema has the fields the operator writes.
#include <yaml-cpp/yaml.h>

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "operator/job/desired_objects.h"
#include "operator/job/job_spec.h"
#include "operator/job/sizing.h"
#include "tests/operator/job/job_fixtures.h"
#include "tests/test_util.h"

namespace pstar::op {
namespace {

using test::MinimalJob;

YAML::Node LoadCrd() { return YAML::LoadFile(pstar::test::SourceDir() + "/crds/patrickstarjob.yaml"); }

YAML::Node VersionSchema(const YAML::Node& crd) { return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]; }

// Leaf fields below `schema` as dotted paths; also checks the schema is
// structural (every node typed, or int-or-string, or preserving unknowns).
void CollectLeaves(const YAML::Node& schema, const std::string& prefix, std::set<std::string>* out) {
  for (const auto& entry : schema["properties"]) {
    const std::string path = prefix + entry.first.as<std::string>();
    const YAML::Node& node = entry.second;
    EXPECT_TRUE(node["type"] || node["x-kubernetes-int-or-string"]) << path << " has no type";
    if (node["properties"]) {
      EXPECT_EQ(node["type"].as<std::string>(), "object") << path;
      CollectLeaves(node, path + ".", out);
    } else {
      out->insert(path);
    }
  }
}

YAML::Node SpecField(const YAML::Node& spec_schema, const std::string& dotted) {
  YAML::Node node;
  node.reset(spec_schema);
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    node.reset(node["properties"][dotted.substr(start, dot - start)]);  // rebinds; = would assign into the tree
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

// Sets spec.<dotted> in a job.
void SetField(Json* job, const std::string& dotted, const Json& value) {
  std::string pointer = "/spec/" + dotted;
  for (char& c : pointer) c = c == '.' ? '/' : c;
  (*job)[Json::json_pointer(pointer)] = value;
}

TEST(CrdTest, Identity) {
  const YAML::Node crd = LoadCrd();
  EXPECT_EQ(crd["apiVersion"].as<std::string>(), "apiextensions.k8s.io/v1");
  EXPECT_EQ(crd["kind"].as<std::string>(), "CustomResourceDefinition");
  EXPECT_EQ(crd["metadata"]["name"].as<std::string>(), "patrickstarjobs.patrickstar.io");
  const YAML::Node spec = crd["spec"];
  EXPECT_EQ(spec["group"].as<std::string>(), "patrickstar.io");
  EXPECT_EQ(spec["scope"].as<std::string>(), "Namespaced");
  EXPECT_EQ(spec["names"]["kind"].as<std::string>(), kKind);
  EXPECT_EQ(spec["names"]["plural"].as<std::string>(), "patrickstarjobs");
  EXPECT_EQ(spec["names"]["shortNames"].as<std::vector<std::string>>(), std::vector<std::string>{"psj"});
  EXPECT_EQ(spec["names"]["categories"].as<std::vector<std::string>>(), std::vector<std::string>{"pstar"});
  ASSERT_EQ(spec["versions"].size(), 1u);
  const YAML::Node v = spec["versions"][0];
  EXPECT_EQ(std::string(kApiVersion), "patrickstar.io/" + v["name"].as<std::string>());
  EXPECT_TRUE(v["served"].as<bool>());
  EXPECT_TRUE(v["storage"].as<bool>());
  EXPECT_TRUE(v["subresources"]["status"].IsMap());
}

TEST(CrdTest, SpecFieldsMatchTheParser) {
  const YAML::Node spec_schema = VersionSchema(LoadCrd())["properties"]["spec"];
  std::set<std::string> schema_fields;
  CollectLeaves(spec_schema, "", &schema_fields);
  std::set<std::string> parser_fields(JobSpecFieldPaths().begin(), JobSpecFieldPaths().end());
  for (const std::string& f : PodSpecPassThroughFields()) parser_fields.insert("template.spec." + f);
  for (const std::string& f : parser_fields) EXPECT_TRUE(schema_fields.count(f)) << "not in the CRD: spec." << f;
  for (const std::string& f : schema_fields) EXPECT_TRUE(parser_fields.count(f)) << "not in the parser: spec." << f;
  EXPECT_EQ(spec_schema["required"].as<std::vector<std::string>>(), std::vector<std::string>{"config"});
  EXPECT_TRUE(SpecField(spec_schema, "config")["x-kubernetes-preserve-unknown-fields"].as<bool>());
}

TEST(CrdTest, DefaultsMatchTheParser) {
  const YAML::Node s = VersionSchema(LoadCrd())["properties"]["spec"];
  const JobSpec defaults;
  EXPECT_EQ(SpecField(s, "numNodes")["default"].as<int>(), defaults.num_nodes);
  EXPECT_EQ(SpecField(s, "nprocPerNode")["default"].as<int>(), defaults.nproc_per_node);
  EXPECT_EQ(SpecField(s, "device")["default"].as<std::string>(), "cuda");
  EXPECT_EQ(SpecField(s, "masterPort")["default"].as<int>(), defaults.master_port);
  EXPECT_EQ(SpecField(s, "metricsPort")["default"].as<int>(), defaults.metrics_port);
  EXPECT_EQ(SpecField(s, "hostMemory.headroomPercent")["default"].as<int>(), defaults.host_memory.headroom_percent);
  EXPECT_EQ(SpecField(s, "runPolicy.backoffLimit")["default"].as<int>(), defaults.run_policy.backoff_limit);
  EXPECT_EQ(SpecField(s, "runPolicy.cleanPodPolicy")["default"].as<std::string>(), "Running");
  EXPECT_EQ(SpecField(s, "runPolicy.restartPolicy")["default"].as<std::string>(), "ExitCode");
  // Every default is accepted by the parser, and parses to the parser's own default.
  Json job = MinimalJob();
  job["spec"].erase("numNodes");
  job["spec"].erase("nprocPerNode");
  job["spec"].erase("device");
  const auto bare = ParseJob(job);
  ASSERT_TRUE(bare.ok());
  for (const std::string& f : JobSpecFieldPaths()) {
    const YAML::Node d = SpecField(s, f)["default"];
    if (!d) continue;
    Json with = job;
    SetField(&with, f, d.IsScalar() && SpecField(s, f)["type"].as<std::string>() == "integer" ? Json(d.as<int64_t>())
                       : SpecField(s, f)["type"].as<std::string>() == "boolean"                ? Json(d.as<bool>())
                                                                                                : Json(d.as<std::string>()));
    auto parsed = ParseJob(with);
    ASSERT_TRUE(parsed.ok()) << f << ": " << parsed.status().message();
    EXPECT_EQ(parsed->world_size(), bare->world_size()) << f;
    EXPECT_EQ(parsed->device, bare->device) << f;
    EXPECT_EQ(parsed->master_port, bare->master_port) << f;
    EXPECT_EQ(parsed->metrics_port, bare->metrics_port) << f;
    EXPECT_EQ(parsed->host_memory.headroom_percent, bare->host_memory.headroom_percent) << f;
    EXPECT_EQ(parsed->run_policy.backoff_limit, bare->run_policy.backoff_limit) << f;
    EXPECT_EQ(parsed->run_policy.clean_pod_policy, bare->run_policy.clean_pod_policy) << f;
    EXPECT_EQ(parsed->run_policy.restart_policy, bare->run_policy.restart_policy) << f;
  }
}

TEST(CrdTest, EnumsAndBoundsMatchTheParser) {
  const YAML::Node s = VersionSchema(LoadCrd())["properties"]["spec"];
  int enums = 0, bounds = 0;
  for (const std::string& f : JobSpecFieldPaths()) {
    const YAML::Node field = SpecField(s, f);
    if (field["enum"]) {
      ++enums;
      for (const auto& value : field["enum"]) {
        Json job = MinimalJob();
        SetField(&job, f, value.as<std::string>());
        EXPECT_TRUE(ParseJob(job).ok()) << f << "=" << value.as<std::string>();
      }
      Json job = MinimalJob();
      SetField(&job, f, "NotAValue");
      EXPECT_FALSE(ParseJob(job).ok()) << f;
    }
    if (field["minimum"] && field["type"].as<std::string>() == "integer") {
      ++bounds;
      Json job = MinimalJob();
      SetField(&job, f, field["minimum"].as<int64_t>() - 1);
      EXPECT_FALSE(ParseJob(job).ok()) << f << " below its minimum";
    }
    if (field["maximum"] && field["type"].as<std::string>() == "integer") {
      Json job = MinimalJob();
      SetField(&job, f, field["maximum"].as<int64_t>() + 1);
      EXPECT_FALSE(ParseJob(job).ok()) << f << " above its maximum";
    }
  }
  EXPECT_EQ(enums, 4);  // device, imagePullPolicy, cleanPodPolicy, restartPolicy
  EXPECT_GE(bounds, 8);
}

TEST(CrdTest, StatusSchema) {
  const YAML::Node crd = LoadCrd();
  const YAML::Node status = VersionSchema(crd)["properties"]["status"]["properties"];
  for (const char* field : {"phase", "conditions", "observedGeneration", "worldSize", "readyRanks", "ready", "restarts",
                            "startTime", "completionTime", "lastRestartTime", "memory", "nodeFit", "progress"}) {
    EXPECT_TRUE(status[field]) << "status." << field;
  }
  const YAML::Node condition = status["conditions"]["items"]["properties"];
  for (const char* field :
       {"type", "status", "reason", "message", "lastTransitionTime", "lastUpdateTime", "observedGeneration"}) {
    EXPECT_TRUE(condition[field]) << "status.conditions[]." << field;
  }
  // status.memory has exactly what SizingStatus writes, with matching types.
  const Json memory = SizingStatus(PodSizing{});
  std::set<std::string> schema_keys;
  for (const auto& entry : status["memory"]["properties"]) {
    const std::string key = entry.first.as<std::string>();
    schema_keys.insert(key);
    ASSERT_TRUE(memory.contains(key)) << "status.memory." << key << " is never written";
    EXPECT_EQ(entry.second["type"].as<std::string>(), memory[key].is_string() ? "string" : "integer") << key;
  }
  EXPECT_EQ(schema_keys.size(), memory.size());

  // Printer columns point at schema fields.
  std::vector<std::string> names;
  for (const auto& column : crd["spec"]["versions"][0]["additionalPrinterColumns"]) {
    names.push_back(column["name"].as<std::string>());
    const std::string path = column["jsonPath"].as<std::string>();
    if (path.rfind(".status.", 0) != 0) continue;
    YAML::Node node;
    node.reset(VersionSchema(crd)["properties"]["status"]);
    std::string rest = path.substr(8);
    size_t start = 0;
    while (true) {
      const size_t dot = rest.find('.', start);
      node.reset(node["properties"][rest.substr(start, dot - start)]);
      ASSERT_TRUE(node) << path;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    EXPECT_EQ(node["type"].as<std::string>(), column["type"].as<std::string>()) << path;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"Phase", "Ready", "Restarts", "Model", "Host-Mem", "Disk", "Step", "Loss", "ETA", "Age"}));
}

}  // namespace
}  // namespace pstar::op

namespace pstar::op {
namespace {

// The CEL rules of the CRD, by the schema path they sit on.
std::map<std::string, std::vector<std::string>> CelRules(const YAML::Node& schema, const std::string& path) {
  std::map<std::string, std::vector<std::string>> rules;
  if (const YAML::Node v = schema["x-kubernetes-validations"]) {
    for (const YAML::Node& r : v) {
      EXPECT_TRUE(r["rule"] && r["message"]) << path << ": every rule needs a message";
      rules[path].push_back(r["rule"].as<std::string>());
    }
  }
  for (const auto& entry : schema["properties"]) {
    for (auto& [p, list] : CelRules(entry.second, path + "." + entry.first.as<std::string>())) {
      rules[p].insert(rules[p].end(), list.begin(), list.end());
    }
  }
  return rules;
}

// Where the API server evaluates CEL it refuses these jobs at admission; the
// operator refuses the same ones, so a cluster without CEL behaves alike.
TEST(CrdTest, CelRulesMatchTheParser) {
  const auto rules = CelRules(VersionSchema(LoadCrd())["properties"]["spec"], "spec");
  ASSERT_EQ(rules.count("spec"), 1u);
  EXPECT_NE(rules.at("spec")[0].find("4096"), std::string::npos);
  ASSERT_EQ(rules.count("spec.device"), 1u);
  EXPECT_EQ(rules.at("spec.device")[0], "self == oldSelf");
  ASSERT_EQ(rules.count("spec.nccl"), 1u);
  EXPECT_EQ(rules.at("spec.nccl").size(), 3u);
  ASSERT_EQ(rules.count("spec.nccl.env"), 1u);

  Json world = MinimalJob();
  world["spec"]["numNodes"] = 64;
  world["spec"]["nprocPerNode"] = 65;
  EXPECT_FALSE(ParseJob(world).ok());
  for (const char* name : {"NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_DEBUG"}) {
    Json both = MinimalJob();
    both["spec"]["nccl"] = {{"socketIfname", "eth0"}, {"ibDisable", true}, {"debug", "WARN"},
                            {"env", {{name, "x"}}}};
    auto parsed = ParseJob(both);
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_NE(parsed.status().message().find(name), std::string::npos) << parsed.status().message();
  }
  Json other = MinimalJob();
  other["spec"]["nccl"] = {{"env", {{"OMP_NUM_THREADS", "4"}}}};
  EXPECT_FALSE(ParseJob(other).ok());
}

}  // namespace
}  // namespace pstar::op

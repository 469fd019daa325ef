// JSON to block-style YAML for the worker's config file. Deterministic: keys
// in the JSON object's (sorted) order, strings double-quoted in JSON syntax
// (valid YAML), so "true" or "1e3" given as strings stay strings.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace pstar::op {

std::string JsonToYaml(const nlohmann::json& value);

}  // namespace pstar::op

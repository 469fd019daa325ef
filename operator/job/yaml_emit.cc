#include "operator/job/yaml_emit.h"

namespace pstar::op {

namespace {

using Json = nlohmann::json;

// Keys print bare when YAML cannot read them as anything but that string.
std::string Key(const std::string& key) {
  bool plain = !key.empty() && ((key[0] >= 'a' && key[0] <= 'z') || (key[0] >= 'A' && key[0] <= 'Z') || key[0] == '_');
  for (char c : key) {
    plain = plain && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '-' || c == '.' || c == '/');
  }
  std::string lower;
  for (char c : key) lower += char(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (const char* special : {"true", "false", "null", "yes", "no", "on", "off", "y", "n"}) {
    plain = plain && lower != special;
  }
  return plain ? key : Json(key).dump();
}

bool IsEmptyCollection(const Json& v) { return (v.is_object() || v.is_array()) && v.empty(); }

// A value that fits on its key's line: scalars and empty collections.
std::string Inline(const Json& v) {
  if (v.is_object() && v.empty()) return "{}";
  if (v.is_array() && v.empty()) return "[]";
  if (v.is_null()) return "null";
  return v.dump();  // JSON strings, numbers and booleans are YAML too
}

void Emit(const Json& v, int indent, std::string* out);

void EmitEntry(const std::string& lead, const Json& v, int indent, std::string* out) {
  if ((v.is_object() || v.is_array()) && !v.empty()) {
    *out += lead + "\n";
    Emit(v, indent, out);
  } else {
    *out += lead + " " + Inline(v) + "\n";
  }
}

void Emit(const Json& v, int indent, std::string* out) {
  const std::string pad(size_t(indent), ' ');
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      EmitEntry(pad + Key(it.key()) + ":", it.value(), indent + 2, out);
    }
  } else if (v.is_array()) {
    for (const Json& item : v) {
      if (item.is_object() && !item.empty()) {
        // "- " then the first key on the same line, the rest aligned under it.
        std::string nested;
        Emit(item, indent + 2, &nested);
        *out += pad + "- " + nested.substr(size_t(indent) + 2);
      } else {
        EmitEntry(pad + "-", item, indent + 2, out);
      }
    }
  } else {
    *out += pad + Inline(v) + "\n";
  }
}

}  // namespace

std::string JsonToYaml(const Json& value) {
  if (!value.is_object() && !value.is_array()) return Inline(value) + "\n";
  if (IsEmptyCollection(value)) return Inline(value) + "\n";
  std::string out;
  Emit(value, 0, &out);
  return out;
}

}  // namespace pstar::op

#include "operator/kube/label_selector.h"

namespace pstar::op {

std::string FormatSelector(const std::map<std::string, std::string>& labels) {
  std::string out;
  for (const auto& [key, value] : labels) {  // std::map iterates in key order
    if (!out.empty()) out += ',';
    out += key + "=" + value;
  }
  return out;
}

}  // namespace pstar::op

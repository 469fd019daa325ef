// Label selectors in the API's string form.
#pragma once

#include <map>
#include <string>

namespace pstar::op {

// {"b":"2","a":"1"} -> "a=1,b=2" (keys sorted, so the result is stable).
std::string FormatSelector(const std::map<std::string, std::string>& labels);

}  // namespace pstar::op

// Which resident chunk gives up its device slot when another needs one
// (runtime.eviction; worker/runtime/eviction.h chooses).
#pragma once

namespace pstar {

// kOpt: the farthest next use, from the step's recorded trace (Belady);
// kLru: the least recently used.
enum class EvictionPolicy { kOpt, kLru };
const char* EvictionPolicyName(EvictionPolicy policy);  // "opt" or "lru"

}  // namespace pstar

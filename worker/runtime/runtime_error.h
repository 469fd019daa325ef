// RuntimeBug: ends the process on a state of the chunk runtime that its
// start-up checks rule out (a bug in the runtime or its caller, never a
// user error), naming what was found. CollectiveFailed: ends it on a failed
// collective (a lost or stalled peer), the design's lost-peer rule: the
// operator restarts the gang.
#pragma once

#include <string>

namespace pstar {

[[noreturn]] void RuntimeBug(const std::string& what);
[[noreturn]] void CollectiveFailed(int rank, const std::string& what);

}  // namespace pstar

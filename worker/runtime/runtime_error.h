// RuntimeBug: ends the process on a state of the chunk runtime that its
// start-up checks rule out (a bug in the runtime or its caller, never a
// user error), naming what was found.
#pragma once

#include <string>

namespace pstar {

[[noreturn]] void RuntimeBug(const std::string& what);

}  // namespace pstar

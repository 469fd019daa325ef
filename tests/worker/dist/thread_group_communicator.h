// Communicators for N ranks that are threads of one process, exchanging
// through shared memory. A test double for ZeRO training: it gives the same
// collective semantics as Gloo (sums in rank order) without sockets, so a test
// can run N trainers side by side and compare them with one.
#pragma once

#include <memory>
#include <vector>

#include "worker/dist/communicator.h"

namespace pstar::test {

// One communicator per rank; each must be used by its own thread.
std::vector<std::unique_ptr<Communicator>> MakeThreadGroupCommunicators(int world_size);

}  // namespace pstar::test

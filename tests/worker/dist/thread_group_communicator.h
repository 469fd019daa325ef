// Communicators for N ranks that are threads of one process, exchanging
// through shared memory. A test double for ZeRO training: the same collective
// results as the Gloo communicator up to summation order (it sums in rank
// order; Gloo's ring starts each block at another rank), without sockets, so a
// test can run N trainers side by side in one process and compare them with one.
#pragma once

#include <memory>
#include <vector>

#include "worker/dist/communicator.h"

namespace pstar::test {

// One communicator per rank; each must be used by its own thread.
std::vector<std::unique_ptr<Communicator>> MakeThreadGroupCommunicators(int world_size);

}  // namespace pstar::test

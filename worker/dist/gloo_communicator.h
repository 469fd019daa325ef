// The Gloo (TCP) communicator for CPU runs. Gloo provides the transport: a
// full mesh of TCP pairs, bootstrapped through our Store. The collectives are
// rings written here on Gloo's point-to-point sends, so that the summation
// order is fixed for a world size, every byte sent is accounted for, and a
// failure can name the peer this rank was exchanging with.
//
// Bytes counted per call (this rank's sends; N = world size):
//   all_gather:      (N-1) * shard_elems * 4
//   reduce_scatter:  (N-1) * shard_elems * 4 (* 2 for the 16-bit one)
//   all_reduce:      (2n - n_r - n_(r+1)) * 8, n_i = |block i| (n/N rounded):
//                    a ring reduce-scatter, then a ring all-gather
//   broadcast:       (N-1) * bytes at the root, 0 elsewhere
//   barrier:         N-1 (a ring all-gather of one byte per rank)
//
// Sum order: block c of a reduce-scatter (and of the all-reduce) is summed
// around the ring starting at rank c+1: ((x[c+1] + x[c+2]) + ...) + x[c]. All
// ranks receive identical all-reduce results.
//
// Receivers acknowledge every transfer with one byte (not counted above): Gloo
// fails a pending receive as soon as a connection breaks, but may leave a send
// queued on a dead connection until the timeout. SIGPIPE from writing to a
// dead peer is blocked in the calling thread during each call.
//
// Every step waits at most `timeout` for its peer. The first failure leaves
// the communicator unusable: later calls fail with the same message, and the
// process should exit (the operator restarts the gang). Calls must not be made
// concurrently from several threads.
#pragma once

#include <chrono>
#include <memory>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"
#include "worker/dist/store.h"

namespace pstar {

// Connects this rank to the others through `store`, which must outlive the
// call (the rendezvous is finished when it returns). Ranks listen on
// store.local_address(), the interface that reaches the store's server. A
// world of one needs no transport and gets MakeSingleRankCommunicator().
Result<std::unique_ptr<Communicator>> MakeGlooCommunicator(Store& store, int rank, int world_size,
                                                           std::chrono::milliseconds timeout);

// The same, keeping `store` alive for as long as the communicator (for rank 0,
// whose Store hosts the server the other ranks talk to).
Result<std::unique_ptr<Communicator>> MakeGlooCommunicator(std::unique_ptr<Store> store, int rank,
                                                           int world_size, std::chrono::milliseconds timeout);

}  // namespace pstar

// The NCCL communicator for GPU runs (built with the CUDA backend when NCCL is
// found). Rank 0 creates the NCCL unique id and publishes it through the
// Store; every rank joins with ncclCommInitRank on its CUDA device.
//
// Buffers passed to AllGather/ReduceScatter are device memory; AllReduceSum and
// Broadcast take host memory and stage it through a small device buffer (they
// carry scalars: the gradient norm, the loss, stop flags).
//
// Every call runs on the communicator's own stream and waits for it while
// polling ncclCommGetAsyncError; past `timeout` the communicator is aborted
// (ncclCommAbort) and the call fails. NCCL does not say which peer was lost,
// so the message names the op and the timeout. The first failure leaves the
// communicator unusable. Bytes counted: the same ring formulas as Gloo.
#pragma once

#include <chrono>
#include <memory>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"
#include "worker/dist/store.h"

namespace pstar {

// `device` is this rank's CUDA device (LOCAL_RANK on one node per GPU).
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Store& store, int rank, int world_size,
                                                           int device, std::chrono::milliseconds timeout);
// As above, and the communicator keeps `store` (rank 0's hosts the rendezvous
// server the other ranks may still be reading from).
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(std::unique_ptr<Store> store, int rank, int world_size,
                                                           int device, std::chrono::milliseconds timeout);

}  // namespace pstar

// The accept loop the worker's small servers share (the rendezvous store, the
// metrics endpoint): wait on a listening socket and on a wake pipe, hand each
// accepted connection to a handler, return when the pipe becomes readable.
#pragma once

#include <functional>

namespace pstar {

// Accepts on `listen_fd` (connections are SOCK_CLOEXEC) until `wake_fd` is
// readable or polling fails. `on_client` owns the accepted fd; returning false
// from it ends the loop.
void AcceptUntilWoken(int listen_fd, int wake_fd, const std::function<bool(int fd)>& on_client);

}  // namespace pstar

#include "worker/core/accept_loop.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace pstar {

void AcceptUntilWoken(int listen_fd, int wake_fd, const std::function<bool(int fd)>& on_client) {
  pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
  while (true) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // asked to stop
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the connection stays queued and poll would
      // report it again at once; wait a moment instead of spinning.
      if (errno == EMFILE || errno == ENFILE) ::poll(nullptr, 0, 10);
      continue;
    }
    if (!on_client(fd)) return;
  }
}

}  // namespace pstar

#include "common/socket_waiter.h"

#include <cerrno>
#include <system_error>

namespace fleet {

std::size_t SocketWaiter::Add(zmq::socket_t& socket) {
  const int fd = static_cast<int>(socket.get(zmq::sockopt::fd));
  fds_.push_back({fd, POLLIN, 0});
  zmq_.push_back(1);
  ready_.push_back(1);
  return fds_.size() - 1;
}

std::size_t SocketWaiter::AddFd(int fd) {
  fds_.push_back({fd, POLLIN, 0});
  zmq_.push_back(0);
  ready_.push_back(0);
  return fds_.size() - 1;
}

void SocketWaiter::Wait(std::chrono::milliseconds timeout) {
  bool any_ready = false;
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    if (zmq_[i] == 0) {
      ready_[i] = 0;
    } else if (ready_[i] != 0) {
      any_ready = true;
    }
  }
  int ms = 0;
  if (!any_ready && timeout.count() > 0) {
    ms = timeout.count() > 0x7fffffff ? 0x7fffffff : static_cast<int>(timeout.count());
  }
  const int n = ::poll(fds_.data(), static_cast<nfds_t>(fds_.size()), ms);
  if (n < 0) {
    if (errno == EINTR) return;
    throw std::system_error(errno, std::generic_category(), "poll");
  }
  if (n == 0) return;
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    // For a zmq socket any event counts: the receive that follows finds out
    // what there is (an error on libzmq's own descriptor would show there).
    const short want = zmq_[i] != 0 ? static_cast<short>(~0) : static_cast<short>(POLLIN);
    if ((fds_[i].revents & want) != 0) ready_[i] = 1;
  }
}

}  // namespace fleet

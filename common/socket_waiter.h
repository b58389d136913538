// SocketWaiter: a loop's wait for input on its zmq sockets and plain
// descriptors, in one poll(2) over their descriptors.
//
// Why not zmq::poll: before and after each wait it asks every zmq socket for
// ZMQ_EVENTS, and on a socket with nothing pending that costs two system
// calls (libzmq's signaler checks its pid, then polls its own descriptor).
// The broker waits on six sockets, of which four (the control endpoint and
// three connection monitors) are idle nearly always: with one batch per
// SUBMIT, those checks were the largest cost of its loop.
//
// A zmq socket's ZMQ_FD is not a level: it becomes readable when commands
// reach the socket (among them "a pipe has input again"), and whichever call
// on the socket processes the commands next takes that wake-up with it, a
// send as much as a receive. So each socket carries a flag, ready ("it may
// have input"):
//   - Wait sets it when the socket's descriptor is readable;
//   - Drained(i, false) clears it after a receive found nothing: libzmq has
//     then processed every pending command, and its descriptor again says
//     when input comes;
//   - Touched(i) sets it after anything else done with the socket (a send),
//     which may have taken the wake-up of input that came meanwhile.
// While a socket is ready, Wait does not block (it still polls, with no
// timeout, so the other descriptors are heard). A plain descriptor (an
// eventfd) is a level: it is ready exactly when the last Wait found it
// readable.
//
// Not thread-safe: one loop owns it, like its sockets, which must outlive it.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <vector>

#include <zmq.hpp>

namespace fleet {

class SocketWaiter {
 public:
  // Adds a zmq socket (its ZMQ_FD is read once, here) and returns its index.
  // It starts ready: input may be waiting already. Throws zmq::error_t if the
  // socket has no descriptor (a thread-safe socket type).
  std::size_t Add(zmq::socket_t& socket);
  // Adds a plain descriptor, waited on for POLLIN; returns its index.
  std::size_t AddFd(int fd);

  // Waits up to `timeout` for a descriptor to become readable, not at all
  // when a socket is ready. A signal (EINTR) ends the wait with nothing new.
  // Throws std::system_error if poll(2) fails otherwise.
  void Wait(std::chrono::milliseconds timeout);

  // A socket: it may have input. A plain descriptor: it was readable.
  bool ready(std::size_t i) const { return ready_[i] != 0; }
  // A receive on socket i found nothing (more == false), or stopped at its
  // bound with more perhaps waiting (more == true).
  void Drained(std::size_t i, bool more) { ready_[i] = more; }
  // Socket i was used otherwise (a send): it may have input.
  void Touched(std::size_t i) { ready_[i] = 1; }

  std::size_t size() const { return fds_.size(); }

 private:
  std::vector<pollfd> fds_;
  std::vector<char> zmq_;    // per entry: a zmq socket (else a plain descriptor)
  std::vector<char> ready_;  // per entry: see ready()
};

}  // namespace fleet

// InboundBudget: how much memory connections that have not yet sent a valid
// message may make the broker hold, and which connection to refuse when a
// new one would pass it.
//
// libzmq reads a frame into a buffer as it arrives and shows the
// application nothing until the frame is complete, so the bytes a peer
// makes the broker hold cannot be seen per connection. What can be bounded
// is the worst case: a connection may hold one frame of its endpoint's
// ZMQ_MAXMSGSIZE. Each connection is charged that much from its accept
// until its first valid message ("proven"); proven connections are charged
// nothing, so a fleet of hundreds of workers (each proven by its HELLO
// within milliseconds) never fills the budget. A new connection that does
// not fit is admitted only by evicting the oldest unproven connection, when
// that one has been silent for longer than `grace` (an idle client that
// never sent anything loses nothing: libzmq reconnects it); otherwise the
// new one is refused. Refused and evicted connections are closed by the
// owner (ConnectionGuard); their peers' libzmq reconnects later.
//
// Connections are named by file descriptor, which the kernel reuses as soon
// as libzmq closes one: an accept of an fd still held means the old
// connection closed (its close event from another endpoint's monitor not
// read yet), and a close event only ends the connection of its endpoint.
//
// Pure state: no sockets, no clock (`now` is an argument). Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "common/clock.h"

namespace fleet::broker {

class InboundBudget {
 public:
  struct Victim {
    int fd;
    std::size_t endpoint;
  };
  struct Decision {
    bool admitted = false;
    // Older unproven connections to close to make room (when admitted).
    std::vector<Victim> evict;
  };

  // `budget_bytes` > 0: the most worst-case bytes charged at once.
  // `grace`: how long an unproven connection is safe from eviction.
  InboundBudget(std::uint64_t budget_bytes, Duration grace);

  // A connection accepted as `fd` on `endpoint` (an index the caller
  // chooses), charged `charge` bytes until it proves itself. A refused one
  // is not tracked (its close event is ignored).
  Decision OnAccepted(int fd, std::size_t endpoint, std::uint64_t charge, TimePoint now);
  // Its first valid message: the charge is released. Unknown or already
  // proven fds are ignored. Returns true when this proved a connection.
  bool OnProven(int fd);
  // The connection on `fd` of `endpoint` closed (or was evicted).
  void OnClosed(int fd, std::size_t endpoint);

  std::uint64_t budget_bytes() const { return budget_; }
  std::uint64_t reserved_bytes() const { return reserved_; }
  std::size_t unproven() const { return unproven_; }
  std::size_t connections() const { return open_; }

 private:
  struct Entry {
    bool open = false;
    bool proven = false;
    std::size_t endpoint = 0;
    std::uint64_t charge = 0;
    std::uint64_t generation = 0;  // tells a reused fd's entries apart
    TimePoint since;
  };
  struct Queued {
    int fd;
    std::uint64_t generation;
  };

  Entry* Find(int fd);
  void Release(Entry& e);
  // Drops queue heads that no longer name an unproven connection.
  void TrimQueue();

  std::uint64_t budget_;
  Duration grace_;
  std::vector<Entry> by_fd_;
  std::deque<Queued> unproven_order_;  // oldest first; stale entries skipped
  std::uint64_t next_generation_ = 1;
  std::uint64_t reserved_ = 0;
  std::size_t unproven_ = 0;
  std::size_t open_ = 0;
};

}  // namespace fleet::broker

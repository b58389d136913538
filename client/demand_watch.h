// DemandWatch: hears from the broker the moment work waits, instead of at
// the next metrics poll. It sends the control op `wait-demand MS` on a
// DEALER socket of its own; the broker holds the request and answers it
// when a batch is queued (at once if one already is), or with "no demand"
// once MS have passed. The autoscaler keeps a request out while its pool is
// empty, so a burst arriving at zero workers starts one without waiting for
// the poll.
//
// A request is due (Arm sends one) when none is out, or when the one out is
// overdue: its wait plus a few seconds have passed with no answer (a broker
// that restarted forgot it), or it was refused (an older broker that does
// not know the op, too many requests pending), so a refusal is retried at
// that pace rather than at once.
//
// Owns its socket; borrows the context, which must outlive it. The caller
// polls socket() with its other sockets and calls Receive() when readable.
// Not thread-safe.
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/codec.h"
#include "common/zmq_util.h"

namespace fleet::client {

class DemandWatch {
 public:
  struct Options {
    std::string endpoint = "tcp://127.0.0.1:5557";
    SocketLimits socket;
    proto::Limits limits;  // applied to replies
    // How long the broker holds one request before it answers "no demand";
    // clamped to the broker's 1 ms .. 600 s.
    std::chrono::milliseconds wait{10000};
  };

  DemandWatch(zmq::context_t& context, Options options);

  // Sends a wait-demand request if one is due (see above); false when none
  // went out (none due, or no connection yet: POLLOUT says when to retry).
  bool Arm(TimePoint now);
  // True when Arm would send.
  bool due(TimePoint now) const { return !outstanding_ || now >= overdue_at_; }
  // When the request out becomes due again.
  TimePoint overdue_at() const { return overdue_at_; }

  // Reads every reply waiting on the socket, without blocking. Returns the
  // queue depth of a demand answer to the request out (which ends it);
  // nullopt otherwise ("no demand" ends it too, so the next Arm asks again).
  std::optional<double> Receive();

  zmq::socket_t& socket() { return socket_; }

 private:
  Options options_;
  zmq::socket_t socket_;
  std::string buffer_;
  std::uint64_t request_id_ = 0;
  bool outstanding_ = false;  // a request is out (or refused, until overdue_at_)
  bool refusal_logged_ = false;
  TimePoint overdue_at_;
};

}  // namespace fleet::client

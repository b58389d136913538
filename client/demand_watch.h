// DemandWatch: hears from the broker the moment work waits, instead of at
// the next metrics poll. It sends the control op `wait-demand MS` on a
// DEALER socket of its own; the broker holds the request and answers it
// when a batch is queued (at once if one already is), or with "no demand"
// once MS have passed. The autoscaler arms it while its pool is empty, so a
// burst arriving at zero workers starts one without waiting for the poll.
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
    // How long the broker holds one request before it answers "no demand".
    std::chrono::milliseconds wait{30000};
  };

  DemandWatch(zmq::context_t& context, Options options);

  // Sends a wait-demand request unless one is out and not yet overdue (its
  // wait plus a few seconds: a broker that restarted forgot it). A no-op
  // once the broker refused the op (an older broker).
  void Arm(TimePoint now);
  bool armed() const { return armed_; }
  // False once the broker answered that it does not know wait-demand.
  bool supported() const { return supported_; }

  // Reads every reply waiting on the socket, without blocking. Returns the
  // queue depth of a demand answer to the current request (which disarms
  // the watch); nullopt otherwise ("no demand" disarms it too, so the next
  // Arm asks again).
  std::optional<double> Receive();

  zmq::socket_t& socket() { return socket_; }

 private:
  Options options_;
  zmq::socket_t socket_;
  std::string buffer_;
  std::uint64_t request_id_ = 0;
  bool armed_ = false;
  bool supported_ = true;
  TimePoint overdue_at_;
};

}  // namespace fleet::client

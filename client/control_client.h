// ControlClient: request/reply over the broker's control endpoint, for
// fleet-ctl and the autoscaler. One CONTROL out, the reply with the same
// request_id back, or nothing within the timeout.
//
// A socket monitor on the DEALER feeds a HandshakeWatch: once the broker
// refused this client for good (common/handshake_watch.h), Call and
// CheckHandshake throw fleet::AuthenticationError instead of waiting out
// their timeouts in silence.
//
// Owns one DEALER socket connected to the endpoint and its monitor; borrows the ZeroMQ
// context, which must outlive it. Move-only. Timeouts are real time (the
// steady clock): a call blocks the caller, so a fake clock has no use here.
//
// Not thread-safe: one thread makes calls, one at a time.
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/codec.h"
#include "common/handshake_watch.h"
#include "common/protocol.h"
#include "common/zmq_util.h"

namespace fleet::client {

// A reply: ControlReply, WorkersReply or StatsReply. `message`
// borrows from `frame` (heap-held so moving the reply keeps views valid).
struct ControlResponse {
  std::unique_ptr<zmq::message_t> frame;
  proto::Message message;
};

class ControlClient {
 public:
  struct Options {
    std::string endpoint = "tcp://127.0.0.1:5557";
    SocketLimits socket;
    proto::Limits limits;  // applied to replies
  };

  // Connects in the background. Throws std::invalid_argument on a
  // malformed endpoint (naming it), zmq::error_t when the socket cannot be
  // monitored.
  ControlClient(zmq::context_t& context, Options options);
  ControlClient(ControlClient&&) = default;
  ControlClient& operator=(ControlClient&&) = delete;

  // Sends `request` with a fresh request_id (whatever the caller set is
  // replaced) and waits up to `timeout` for the reply carrying that id.
  // Replies to earlier calls that timed out are skipped, and so is every
  // ERROR: it names no request, so it may answer an earlier call (the
  // broker answers a CONTROL it refuses with a CONTROL_REPLY under the
  // request's id). Returns nullopt on timeout
  // (including when no broker is connected to send to), or early when a
  // stop signal (common/signals.h) arrives during the call. Throws
  // fleet::AuthenticationError once the broker refused our handshake.
  std::optional<ControlResponse> Call(proto::Control request,
                                      std::chrono::milliseconds timeout);

  // Reads the handshake events waiting, without blocking; throws
  // fleet::AuthenticationError once the broker refused us. For a loop that
  // polls monitor() beside its own sockets between calls.
  void CheckHandshake();
  zmq::socket_t& monitor() { return monitor_; }

  // The request_id the last Call used.
  std::uint64_t last_request_id() const { return next_request_id_ - 1; }
  // Replies skipped because their request_id did not match, or undecodable.
  std::uint64_t stale_replies() const { return stale_replies_; }

 private:
  // Waits for `events` on the socket until `deadline`; false on timeout.
  bool WaitFor(short events, TimePoint deadline, bool stop_at_entry);

  Options options_;
  zmq::socket_t monitor_;  // PAIR: socket_'s handshake events
  zmq::socket_t socket_;
  HandshakeWatch handshake_;
  std::uint64_t next_request_id_ = 1;
  std::uint64_t stale_replies_ = 0;
  std::string buffer_;
};

}  // namespace fleet::client

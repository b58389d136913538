// HandshakeWatch: tells a client that the broker refuses it for good, from
// the handshake events of a ZeroMQ socket monitor on its connecting socket.
// Without it a refused client waits in silence: libzmq reports a refused
// handshake only to a monitor.
//
// What a client sees, measured with libzmq 4.3.4 (docs/protocol.md,
// Security):
//   key not on the broker's allowlist   HANDSHAKE_FAILED_AUTH (value: the
//                                       ZAP status, 400), once; libzmq
//                                       does not reconnect
//   plaintext client, CURVE broker      HANDSHAKE_FAILED_PROTOCOL
//   (or a CURVE client, plain broker)   (ZMTP_MECHANISM_MISMATCH), once; no
//                                       reconnect. Or, when the broker saw
//                                       the mismatch first and hung up, as
//                                       below (fleet-submit against
//                                       fleet-broker: measured both ways)
//   wrong --curve-server-key            HANDSHAKE_FAILED_NO_DETAIL (EPIPE:
//                                       the broker hung up), then a
//                                       reconnect every 100-200 ms, forever
// The rule: AUTH or PROTOCOL fails at once (the broker said no, and libzmq
// gives that connection up); NO_DETAIL fails after `no_detail_limit` in a
// row with no successful handshake between them, spread over at least
// kNoDetailSpan (a broker stopping in the middle of one handshake is one
// such event, not five; a broker whose inbound budget closes new
// connections before their handshake, as after a restart with hundreds of
// workers reconnecting at once, gives a few in a row within seconds). A
// successful handshake resets the count.
//
// Pure state: no sockets; callers pass `now`. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <zmq.h>

#include <chrono>

#include "common/clock.h"

namespace fleet {

class HandshakeWatch {
 public:
  // The events to ask zmq_socket_monitor for (callers may add their own).
  static constexpr int kEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  static constexpr int kDefaultNoDetailLimit = 5;
  // The least time from the first to the last hang-up of a failing streak.
  static constexpr std::chrono::seconds kNoDetailSpan{10};

  // `endpoint` names the broker in the error; `curve` says whether this
  // client speaks CURVE (it picks the advice).
  HandshakeWatch(std::string endpoint, bool curve, int no_detail_limit = kDefaultNoDetailLimit)
      : endpoint_(std::move(endpoint)), curve_(curve), limit_(no_detail_limit) {}

  // Feeds one monitor event (other events are ignored). Returns true when
  // this event is the one that made the watch fail.
  bool OnEvent(std::uint16_t event, std::uint32_t value, TimePoint now);

  bool failed() const { return !error_.empty(); }
  // Why, for a person: starts with "authentication failed" when the broker
  // refused the client's credentials or its mechanism, "handshake ...
  // failed" for another protocol error. Empty until failed.
  const std::string& error() const { return error_; }
  std::uint64_t handshakes() const { return handshakes_; }  // successful ones

 private:
  void Fail(std::string why);

  std::string endpoint_;
  bool curve_;
  int limit_;
  int no_detail_in_a_row_ = 0;
  TimePoint first_no_detail_{};  // the first hang-up of the current streak
  std::uint64_t handshakes_ = 0;
  std::string error_;
};

}  // namespace fleet

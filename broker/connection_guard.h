// ConnectionGuard: enforces the inbound budget (--max-inbound-mb) on the
// broker's ROUTER sockets.
//
// A libzmq socket monitor reports each accepted connection with its file
// descriptor (ZMQ_EVENT_ACCEPTED) and its end (DISCONNECTED, CLOSED). The
// guard charges every connection the worst case it can make the broker hold
// (one frame of the endpoint's ZMQ_MAXMSGSIZE) until it sends its first
// valid message, and closes connections the budget has no room for
// (InboundBudget decides which): shutdown(2) on the fd, after checking that
// the fd is still a TCP socket of that endpoint's port, so a number the
// kernel has already handed to something else is left alone. libzmq then
// sees the connection end and the peer's libzmq reconnects later.
//
// The loop tells the guard of valid messages with OnValidMessage only while
// some connection is unproven (watching()): a fleet of proven peers costs
// the dispatch path one branch per message.
//
// libzmq allows one monitor per socket. With CURVE the CurveMonitor owns
// the monitors and hands the guard its events (Track + OnEvent); otherwise
// the guard owns them (Watch), and the loop polls socket(i) and calls
// Drain(i).
//
// Counts refusals by endpoint and reason, and logs at most one line per
// endpoint and reason per 10 s. Not thread-safe: the loop owns it. Watched
// sockets must outlive it.
#pragma once

#include <zmq.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "broker/inbound_budget.h"
#include "common/clock.h"
#include "common/log.h"

namespace fleet::broker {

class ConnectionGuard {
 public:
  enum Reason { kBudget = 0, kEvicted, kReasonCount };
  // "inbound_budget" (a new connection refused), "unproven_evicted" (a
  // connection silent past the grace closed to make room for a new one).
  static const char* ReasonName(int reason);
  // The monitor events the guard needs.
  static constexpr int kEvents =
      ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED;

  ConnectionGuard(zmq::context_t& context, std::uint64_t budget_bytes, Duration grace);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // Starts monitoring `server` (bound to tcp `endpoint`, as resolved) under
  // `name`, charging each unproven connection `charge` bytes. Endpoints are
  // numbered in the order of Watch/Track calls. Throws std::runtime_error
  // when libzmq refuses the monitor.
  void Watch(zmq::socket_t& server, const std::string& endpoint, const std::string& name,
             std::uint64_t charge);
  // Like Watch for a socket whose monitor someone else owns: its events
  // come through OnEvent with this endpoint's number.
  void Track(const std::string& endpoint, const std::string& name, std::uint64_t charge);

  // One monitor event of endpoint `i` (ACCEPTED, DISCONNECTED, CLOSED; the
  // value is the fd). Others are ignored.
  void OnEvent(std::size_t i, std::uint16_t event, std::uint32_t value, TimePoint now);

  // Monitors the guard owns (0 when it only tracks) and their sockets.
  std::size_t monitors() const { return owned_; }
  zmq::socket_t& socket(std::size_t i) { return endpoints_[i].monitor; }
  // Reads every event the i-th owned monitor holds, up to a bound per call;
  // returns true when it stopped at the bound (more may wait).
  bool Drain(std::size_t i, TimePoint now);

  // True while some connection has not yet sent a valid message.
  bool watching() const { return budget_.unproven() > 0; }
  // A message that decoded; `frame` as received (it carries the fd).
  void OnValidMessage(zmq::message_t& frame);

  std::size_t size() const { return endpoints_.size(); }
  const std::string& name(std::size_t i) const { return endpoints_[i].name; }
  std::uint64_t refused(std::size_t i, int reason) const { return endpoints_[i].counts[reason]; }
  const InboundBudget& budget() const { return budget_; }

 private:
  struct Endpoint {
    zmq::socket_t* server;  // null when tracked
    zmq::socket_t monitor;
    std::string name;
    std::uint64_t charge;
    int port;  // the listener's TCP port, to recognise its connections
    std::array<std::uint64_t, kReasonCount> counts{};
    std::array<LogThrottle, kReasonCount> throttles;
  };

  void Add(zmq::socket_t* server, const std::string& endpoint, const std::string& name,
           std::uint64_t charge);
  // Closes the connection on `fd` of endpoint `i` and counts it.
  void Close(int fd, std::size_t i, int reason, TimePoint now);

  zmq::context_t& context_;
  InboundBudget budget_;
  std::vector<Endpoint> endpoints_;
  std::size_t owned_ = 0;  // the first owned_ endpoints have monitors
  std::vector<zmq::message_t> frames_;
};

}  // namespace fleet::broker

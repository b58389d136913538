// CurveMonitor: the handshakes a CURVE server refuses, logged and counted.
//
// The ZAP handler sees only clients that speak CURVE and reach the key
// check. A client that speaks plain TCP to a CURVE endpoint, or holds the
// wrong server key, fails earlier, inside libzmq, and nothing told anyone:
// the client waits in silence and the broker said nothing either. A libzmq
// socket monitor on each server socket reports those failures
// (ZMQ_EVENT_HANDSHAKE_FAILED_*); this class owns the monitors' PAIR
// sockets, which the owner's loop polls, and turns each event into a
// counter by endpoint and reason and a warning naming the endpoint, the
// peer's address and what went wrong (at most one line per 10 s for each
// endpoint and reason; the next says how many it stands for).
//
// Reasons: "key" (the ZAP handler refused the client's key; it logs those
// itself, with the key), "mechanism" (no CURVE: plain TCP or another
// mechanism), "cryptographic" (the handshake did not decrypt: a wrong
// --curve-server-key, or damaged data), "other".
//
// Not thread-safe: the loop that polls the sockets owns it. Watched
// sockets must outlive it.
#pragma once

#include <zmq.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/log.h"

namespace fleet {

class CurveMonitor {
 public:
  enum Reason { kKey = 0, kMechanism, kCryptographic, kOther, kReasonCount };
  static const char* ReasonName(int reason);
  // The reason for a monitor event and its value; -1 for events that are
  // not refusals.
  static int ReasonOf(std::uint16_t event, std::uint32_t value);

  explicit CurveMonitor(zmq::context_t& context) : context_(context) {}
  ~CurveMonitor();
  CurveMonitor(const CurveMonitor&) = delete;
  CurveMonitor& operator=(const CurveMonitor&) = delete;

  // libzmq allows one monitor per socket: another watcher of the same
  // sockets (the broker's ConnectionGuard) asks here for the events in
  // `events`, which `hook` then gets with the endpoint's index. Call before
  // Watch.
  using Hook = std::function<void(std::size_t i, std::uint16_t event, std::uint32_t value,
                                  TimePoint now)>;
  void Share(int events, Hook hook) {
    shared_events_ = events;
    hook_ = std::move(hook);
  }

  // Starts watching `server`, a CURVE server socket, under `name` (the
  // endpoint's role: producers, workers, control). Throws
  // std::runtime_error when libzmq refuses the monitor.
  void Watch(zmq::socket_t& server, const std::string& name);

  std::size_t size() const { return watched_.size(); }
  // The i-th monitor's socket, to poll for ZMQ_POLLIN.
  zmq::socket_t& socket(std::size_t i) { return watched_[i].monitor; }
  const std::string& name(std::size_t i) const { return watched_[i].name; }
  // Reads every event the i-th monitor holds: counts and logs refusals.
  void Drain(std::size_t i, TimePoint now);
  // Refusals on the i-th endpoint for `reason` so far.
  std::uint64_t refused(std::size_t i, int reason) const { return watched_[i].counts[reason]; }

 private:
  struct Watched {
    zmq::socket_t* server;
    zmq::socket_t monitor;
    std::string name;
    std::array<std::uint64_t, kReasonCount> counts{};
    std::array<LogThrottle, kReasonCount> throttles;
  };

  zmq::context_t& context_;
  std::vector<Watched> watched_;
  std::vector<zmq::message_t> frames_;
  int shared_events_ = 0;
  Hook hook_;
};

}  // namespace fleet

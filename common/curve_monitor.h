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
// peer's address and what went wrong (at most one line per peer address,
// endpoint and reason per 10 s; the next says how many it stands for, and
// Tick logs a summary of those no line reported).
//
// The peer's address: libzmq 4.3.4's monitor events name only the bound
// endpoint (the peer's address is in the draft v2 monitor). The accepted
// connection's descriptor comes with ZMQ_EVENT_ACCEPTED, and its
// DISCONNECTED event follows each failed handshake at once (one I/O
// thread; libzmq emits both from the same call, before it closes the
// descriptor). So the address is read with getpeername when the ACCEPTED
// event is read and matched to the failure by descriptor. Best effort: a
// connection that is already gone when the loop reads the event (a fast
// failure while the loop is busy) is logged as "address unknown"; one
// whose descriptor was closed and reused in that moment could be named
// with the reusing connection's address.
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
#include <map>
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
  // Reads every event the i-th monitor holds, up to a bound per call: counts
  // and logs refusals. Returns true when it stopped at the bound (more may
  // wait).
  bool Drain(std::size_t i, TimePoint now);
  // Housekeeping: forgets quiet peers and logs one summary line of the
  // refusals no line reported. Call every few seconds.
  void Tick(TimePoint now);
  // Refusals on the i-th endpoint for `reason` so far.
  std::uint64_t refused(std::size_t i, int reason) const { return watched_[i].counts[reason]; }

 private:
  struct Pending {  // a refusal waiting for its DISCONNECTED (the address)
    int reason = -1;
    std::uint16_t event = 0;
    std::uint32_t value = 0;
  };
  struct Watched {
    zmq::socket_t* server;
    zmq::socket_t monitor;
    std::string name;
    std::array<std::uint64_t, kReasonCount> counts{};
    KeyedLogThrottle throttle;          // by peer address and reason
    std::map<int, std::string> peers;  // descriptor -> address ("" unknown)
    Pending pending;
  };
  void Log(Watched& w, const Pending& p, const std::string& address, TimePoint now);

  zmq::context_t& context_;
  std::vector<Watched> watched_;
  std::vector<zmq::message_t> frames_;
  int shared_events_ = 0;
  Hook hook_;
};

}  // namespace fleet

// BrokerServer: owns the broker's three ROUTER sockets and runs its one
// event loop: poll, decode, hand to BrokerCore, dispatch, flush the outbox,
// and tick housekeeping on a deadline. Nothing else touches the sockets.
//
// Not thread-safe. Run() returns when `stop` says so.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "broker/broker_core.h"
#include "broker/journal_pacer.h"
#include "broker/broker_options.h"
#include "broker/connection_guard.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/curve.h"
#include "common/curve_monitor.h"
#include "common/socket_waiter.h"

namespace fleet::broker {

// Checks --frontend, --backend and --control as endpoints to bind
// (common/endpoint.h); throws std::invalid_argument naming the bad one.
void CheckBrokerEndpoints(const BrokerOptions& options);

class BrokerServer {
 public:
  // With options.data_dir, opens and replays the journal first (throws
  // JournalError when it is damaged); then binds the three endpoints;
  // throws std::invalid_argument for a malformed one (before the journal)
  // and std::runtime_error naming the one that failed to bind. `clock` must
  // outlive the server.
  BrokerServer(const BrokerOptions& options, const Clock& clock);
  BrokerServer(const BrokerServer&) = delete;
  BrokerServer& operator=(const BrokerServer&) = delete;

  // Runs until stop() returns true (checked at least every heartbeat).
  // `reload` (may be empty) is asked on every turn of the loop; when it
  // returns true the loop reloads the CURVE allowlists (ReloadAllowlists).
  void Run(const std::function<bool()>& stop, const std::function<bool()>& reload = {});

  // Reads the three --curve-* allowlists again and swaps them into the ZAP
  // handler: newly listed keys get in from their next handshake on, removed
  // keys are refused on theirs (connections already made stay). All or
  // nothing: a file that cannot be read or has a bad line keeps every old
  // list and returns false, having logged the error. Without CURVE it logs
  // that there is nothing to reload and returns false.
  bool ReloadAllowlists();

  // Endpoints as bound (a wildcard port resolved).
  const std::string& frontend_endpoint() const { return frontend_endpoint_; }
  const std::string& backend_endpoint() const { return backend_endpoint_; }
  const std::string& control_endpoint() const { return control_endpoint_; }

  BrokerCore& core() { return core_; }
  // The journal in durable mode, else null.
  const Journal* journal() const { return journal_.get(); }
  // With CURVE: the ZAP handler (counts of clients let in and refused).
  const ZapHandler* zap() const { return zap_.get(); }
  // With CURVE: handshakes refused per endpoint and reason, else null.
  const CurveMonitor* curve_monitor() const { return curve_monitor_.get(); }
  // With --max-inbound-mb: connections charged and refused, else null.
  const ConnectionGuard* guard() const { return guard_.get(); }
  // The broker's public key (Z85) with CURVE, else empty.
  const std::string& curve_public_key() const { return curve_keys_.public_key; }

  // Metrics refreshed on every housekeeping tick; borrowed, may be null.
  void set_metrics(class BrokerMetrics* metrics) { metrics_ = metrics; }
  // Extra key=value lines for the ready file (e.g. the metrics URL).
  void add_ready_line(std::string line) { ready_lines_.push_back(std::move(line)); }
  const std::vector<std::string>& ready_lines() const { return ready_lines_; }

 private:
  // Receives and handles up to kBurst messages from an endpoint if the
  // waiter has it ready; returns how many it received.
  int Drain(Socket which, TimePoint now);
  void Flush(TimePoint now);
  // Flush, and if that found a worker gone, dispatch what came back and
  // flush again.
  void FlushAndRedispatch(TimePoint now);
  // Durable mode: starts the journal's next write unless one is out or the
  // last started less than --journal-sync-interval-ms ago (then
  // journal_due_ says when).
  void StartJournalWrite(TimePoint now);
  zmq::socket_t& SocketFor(Socket which);

  BrokerOptions options_;
  const Clock& clock_;
  BrokerCore core_;
  std::unique_ptr<Journal> journal_;
  JournalPacer pacer_{options_.journal_sync_interval};
  TimePoint journal_due_ = TimePoint::max();  // a paced write starts then
  proto::Limits limits_;
  zmq::context_t context_;
  zmq::socket_t frontend_;
  zmq::socket_t backend_;
  zmq::socket_t control_;
  std::string frontend_endpoint_;
  std::string backend_endpoint_;
  std::string control_endpoint_;
  SocketWaiter waiter_;                 // Run's wait; Flush marks the sockets it sent on
  std::vector<zmq::message_t> frames_;  // reused receive buffer
  std::string scratch_;                 // reused encode buffer
  class BrokerMetrics* metrics_ = nullptr;
  std::vector<std::string> ready_lines_;
  CurveKeyPair curve_keys_;
  // The inbound budget; stops its monitors before the sockets close.
  std::unique_ptr<ConnectionGuard> guard_;
  ZapHandler::Allowlists allowlists_;  // as last loaded (for the reload's log)
  // With CURVE: refused handshakes; before the sockets in destruction.
  std::unique_ptr<CurveMonitor> curve_monitor_;
  // Last: stops before the sockets close. In that moment a handshake would
  // not be checked, but the loop has ended and nothing is read any more.
  std::unique_ptr<ZapHandler> zap_;
};

// Writes the resolved endpoints as key=value lines (atomically: temp file,
// then rename) for scripts and tests that bound to port 0.
void WriteReadyFile(const std::string& path, const BrokerServer& server);

}  // namespace fleet::broker

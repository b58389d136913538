// The worker's event loop: one DEALER to the broker and one inproc PULL for
// the slots' results, polled together on the main thread.
//
// Owns the zmq context, both sockets, the handler and the slot pool. Not
// thread-safe: construct it and call Run on one thread. The loop speaks the
// backend protocol (docs/protocol.md): HELLO on every (re)connect, DONE with
// coalesced results and the credit freed, HEARTBEAT when idle, DRAIN on
// SIGTERM/SIGINT, BYE when done; it reconnects with backoff when the broker
// goes silent, and never drops a batch it was given or a result it made.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/codec.h"
#include "common/handshake_watch.h"
#include "common/zmq_util.h"
#include "worker/credit_ledger.h"
#include "worker/handler.h"
#include "worker/process_handler.h"
#include "worker/slot_pool.h"
#include "worker/worker_metrics.h"

namespace fleet::worker {

struct WorkerOptions {
  std::string broker = "tcp://127.0.0.1:5556";  // the broker's backend
  std::string id;                 // required; 1..256 bytes, unique in the fleet
  int concurrency = 1;            // batches run at once; 1..1024
  // Batches held beyond the slots, waiting for one: the broker may send
  // concurrency + prefetch. More per DISPATCH and DONE (fewer messages for
  // short batches), at the price of a batch waiting here while another
  // worker may be free. 0..4096.
  int prefetch = 0;
  HandlerOptions handler;         // echo, sleep, sha256, exec (+ command)
  Timeout batch_timeout{0};       // seconds a batch may run; 0 = no limit
  std::vector<std::string> queues;  // queues to take from; empty = every one
  Millis heartbeat{1000};         // until WELCOME says otherwise; 10 ms..1 h
  std::uint32_t liveness = 3;     // silent heartbeats before the broker is
                                  // taken for dead, until WELCOME; 1..100
  Millis backoff_initial{250};    // first reconnect delay, doubled per failure
  Millis backoff_max{8000};       // ceiling of the reconnect delay
  SocketLimits socket_limits;     // for the DEALER
  proto::Limits limits;           // on what the broker sends us
  std::string metrics;            // address:port for /metrics; "" = off
  std::optional<BasicAuth> metrics_auth;  // basic auth on /metrics; none = open
};

// Throws std::invalid_argument naming the first bad field.
void ValidateOptions(const WorkerOptions& options);

class Worker {
 public:
  // Validates options, builds the handler, binds the results socket and
  // starts the slot threads. Throws std::invalid_argument on bad options.
  explicit Worker(WorkerOptions options);
  // The same with a handler of the caller's (the SDK's function handler);
  // options.handler is then unused but for its name in logs.
  Worker(WorkerOptions options, std::unique_ptr<Handler> handler);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs until the worker has drained and said BYE (returns 0), was stopped
  // by the broker before registering (0), or got a second stop signal while
  // draining (returns 1 with abandoned() true: held batches are left to the
  // broker to requeue and external children are killed; the caller should
  // then _Exit without destroying the Worker, whose slots may still be busy).
  // Throws on setup failures (zmq errors), and fleet::AuthenticationError
  // once the broker refused the handshake for good (common/handshake_watch.h:
  // a key not on its allowlist, plain TCP to a CURVE broker or the reverse,
  // the wrong server key); the caller then aborts the handler (AbortNow).
  int Run();

  bool abandoned() const { return abandoned_; }

  // Kills the handler's external work (exec children) at once; for the
  // caller's hard-exit paths. Safe to call from the loop's thread only.
  void AbortNow();

  // Asks Run to drain and return, as a first SIGTERM does. Thread-safe.
  void RequestStop();

 private:
  enum class State {
    kBackoff,       // no socket; waiting until reconnect_at_
    kConnecting,    // socket open, HELLO not sent yet (not connected, or
                    // waiting until hello_at_ after DUPLICATE_WORKER)
    kAwaitWelcome,  // HELLO sent
    kRegistered,    // WELCOME received
  };

  // Reads the handler's ready slots into the credit ledger.
  void UpdateCapacity();
  void TakeCompletion(Completion&& completion);
  void OpenSocket(TimePoint now);
  void Reconnect(TimePoint now, const std::string& why);
  Millis NextBackoff();
  void ReceiveCompletions();
  void ReceiveFromBroker(TimePoint now);
  // Reads the broker socket's handshake events; throws
  // fleet::AuthenticationError once the broker refused us for good.
  void ReadHandshakes();
  void HandleMessage(const proto::Message& message, TimePoint now);
  void HandleDispatch(const proto::Dispatch& dispatch);
  void CheckSignals();
  void CheckTimers(TimePoint now);
  // Sends whatever is due (HELLO, DRAIN, DONE, BYE). Sets want_out_ when the
  // socket refused a message, so the next poll waits for POLLOUT.
  void Flush(TimePoint now);
  bool SendDone(TimePoint now);
  bool Send(const proto::Message& message, TimePoint now);
  // The handlers' object requests, as OBJECT_GET (or refused at once when
  // we are not registered or the socket is full).
  void SendObjectGets(TimePoint now);
  void FailObjectGets(const char* why);
  Millis PollTimeout(TimePoint now) const;
  bool Draining() const { return stop_from_broker_ || stop_from_signal_; }
  bool MaySendResults() const;

  WorkerOptions options_;
  SteadyClock clock_;
  std::mt19937 rng_;

  // Declared before the sockets, handler and pool so it is destroyed after
  // them: every socket (the slots' too) belongs to it.
  zmq::context_t context_;
  zmq::socket_t results_;                   // PULL, bound before the slots
  std::unique_ptr<zmq::socket_t> broker_;   // DEALER; null while backing off
  std::unique_ptr<zmq::socket_t> monitor_;  // PAIR: broker_'s handshake events
  int results_fd_ = -1;     // results_'s ZMQ_FD, polled as a descriptor (Run)
  int monitor_fd_ = -1;     // monitor_'s ZMQ_FD, likewise
  bool monitor_unread_ = false;  // monitor_ not yet emptied by a receive
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<SlotPool> pool_;
  // handler_ when it is the process handler: its batches run on this
  // loop, with the handlers' pipes in the poll, not on slot threads.
  ProcessHandler* process_ = nullptr;
  ProcessHandler::Limits process_limits_;
  std::vector<ProcessHandler::ObjectGetOut> object_gets_;  // scratch
  std::vector<zmq::pollitem_t> poll_items_;  // reused each turn
  std::vector<Completion> finished_;        // reused: one Service's results
  std::unique_ptr<WorkerMetrics> metrics_;  // null without --metrics

  State state_ = State::kBackoff;
  Millis heartbeat_;
  std::uint32_t liveness_;
  Millis backoff_;
  HandshakeWatch handshake_;  // across reconnects: the broker's verdict on us
  TimePoint reconnect_at_{};
  TimePoint hello_at_{};
  TimePoint last_sent_{};
  TimePoint last_heard_{};
  bool want_out_ = false;

  CreditLedger credit_;
  bool warned_overcredit_ = false;

  std::deque<Completion> unsent_;  // results not yet in a DONE we sent
  std::vector<Task> tasks_;        // scratch: one DISPATCH's tasks
  std::uint64_t batches_done_ = 0;

  bool stop_from_broker_ = false;
  bool stop_from_signal_ = false;
  int reported_parent_repeats_ = 0;  // parent SIGTERMs after the first, logged
  std::string incarnation_;          // sent in HELLO: this process run
  bool legacy_hello_ = false;        // the broker refused the 6-field HELLO
  bool ever_ready_ = false;          // a handler process has been ready
  bool duplicate_logged_ = false;    // duplicate_worker logged (since WELCOME)
  bool drain_sent_ = false;   // DRAIN sent on the current registration
  bool abandoned_ = false;
  std::atomic<bool> stop_asked_{false};  // RequestStop
  bool signal_armed_ = false;             // the first stop signal was handled
  int stop_fd_ = -1;                      // eventfd: RequestStop wakes the poll
  std::optional<int> exit_code_;
  std::string out_;  // reused encode buffer
};

}  // namespace fleet::worker

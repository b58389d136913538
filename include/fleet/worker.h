// fleet's C++ SDK, worker side: run your own function on batches from a
// fleet broker, with everything fleet-worker does around it (registration,
// heartbeats, credit, prefetch, reconnects, retire and drain).
//
//   #include <fleet/worker.h>
//
//   int main() {
//     fleet::WorkerOptions options;
//     options.broker = "tcp://127.0.0.1:5556";
//     options.concurrency = 4;
//     fleet::Worker worker(options, [](const fleet::Batch& batch) {
//       if (batch.payload.empty()) return fleet::Reply::Error("empty payload");
//       return fleet::Reply::Ok(std::string(batch.payload) + "!");
//     });
//     return worker.Run();  // until SIGTERM/SIGINT, fleet-ctl retire or STOP
//   }
//
// Link with fleet::worker (find_package(fleet) after `cmake --install`).
// This header needs nothing but the standard library.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/errors.h"

namespace fleet {

// One batch, as your function sees it. The views are valid during the call.
struct Batch {
  std::string_view id;
  std::string_view payload;
  std::string_view queue;
  std::uint32_t attempt = 1;  // above 1: an earlier try failed or its worker died
};

// What your function returns: a result for the producer, or an error that
// fails the batch with its text (final: the broker does not run it again).
struct Reply {
  bool ok = true;
  std::string data;  // the result when ok, the error text otherwise

  static Reply Ok(std::string result) { return Reply{true, std::move(result)}; }
  static Reply Error(std::string message) { return Reply{false, std::move(message)}; }
};

// Runs on the worker's slot threads, `concurrency` calls at once: it must be
// thread-safe. An exception it throws fails that batch with its what().
using Function = std::function<Reply(const Batch&)>;

struct WorkerOptions {
  // The broker's backend (fleet-broker --backend).
  std::string broker = "tcp://127.0.0.1:5556";
  // Unique in the fleet, 1..256 bytes; "" makes one: hostname-pid.
  std::string id;
  // Batches run at once (1..1024), and held beyond those (0..4096).
  int concurrency = 1;
  int prefetch = 0;
  // Queues to take batches from; empty: every queue.
  std::vector<std::string> queues;
  // A batch that runs longer fails (0: no limit). A function cannot be
  // stopped: its batch fails when it returns late.
  std::chrono::milliseconds batch_timeout{0};
  // address:port for the worker's Prometheus /metrics; "" = off; and a
  // file of "user:password" lines for basic auth on it ("" = open; see the
  // README, Metrics).
  std::string metrics;
  std::string metrics_auth_file;
  // CURVE: the broker's public key file (.pub) and this worker's key pair
  // file (.key), both or neither.
  std::string curve_server_key;
  std::string curve_key;
  // Heartbeat interval until the broker's WELCOME sets its own.
  std::chrono::milliseconds heartbeat{1000};
  // Run() handles SIGINT and SIGTERM as fleet-worker does: the first drains
  // (finish what is held, say goodbye, return 0); a second SIGINT, or a
  // second SIGTERM from anyone but the parent process, ends the process at
  // once with status 1, leaving held batches to the broker to requeue.
  // false: signals are yours; use Stop(). A stop signal is remembered for
  // the process's life: one Worker per process run is the way to use it.
  // Either way, SIGPIPE is ignored from the Worker's construction on, if
  // it was at its default (a handler process that dies must not take the
  // worker with it).
  bool handle_signals = true;
  // Instead of a function, one of fleet-worker's handlers: "echo", "sleep",
  // "sha256", "exec" or "process" (with `exec` the command; see
  // docs/handler-protocol.md for process), and for process the grace
  // period its processes get to exit at shutdown.
  std::string handler;
  std::string exec;
  std::chrono::milliseconds handler_grace{5000};
};

class Worker {
 public:
  // Runs `function` on every batch. Throws std::invalid_argument on bad
  // options (naming the field).
  Worker(WorkerOptions options, Function function);
  // Runs options.handler (a built-in handler) on every batch.
  explicit Worker(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Connects, registers and runs batches until the worker has drained: it
  // was retired (fleet-ctl retire, the autoscaler), told to stop by the
  // broker, Stop() was called, or (handle_signals) SIGINT/SIGTERM arrived.
  // Returns 0 once drained. Call it once, from one thread. Throws
  // AuthenticationError when the broker refuses the worker's handshake for
  // good (a key not on its allowlist, plain TCP to a CURVE broker or the
  // reverse, the wrong server key; docs/protocol.md, Security).
  int Run();
  // Asks Run to drain and return. Thread-safe; returns at once.
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fleet

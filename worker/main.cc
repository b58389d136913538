// fleet-worker: pulls batches from the broker, runs a handler on each and
// returns the results; drains and exits on STOP or SIGTERM/SIGINT. Exit 0
// once drained, 1 on a failure, 2 on bad flags, 3 when the broker refused
// its handshake ("authentication failed").
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "common/curve.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/metrics_server.h"
#include "fleet/worker.h"

int main(int argc, char** argv) {
  // The SDK's options (include/fleet/worker.h): fleet-worker is a worker of
  // the SDK with a built-in handler.
  fleet::WorkerOptions options;
  options.handler = "echo";
  std::string log_level = "info";
  double batch_timeout = 0;
  int heartbeat_ms = static_cast<int>(options.heartbeat.count());

  CLI::App app{"fleet-worker: pulls batches from the fleet broker, runs a "
               "handler on each and sends the results back.\nExit 0 once drained, 1 on a "
               "failure, 2 on bad flags, 3 when the broker refuses the handshake "
               "(authentication failed)."};
  app.add_option("--broker", options.broker, "the broker's backend endpoint")
      ->capture_default_str();
  app.add_option("--id", options.id, "worker id, unique in the fleet (default <hostname>-<pid>)");
  app.add_option("--concurrency", options.concurrency, "batches run at once")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--prefetch", options.prefetch,
                 "batches held beyond --concurrency, waiting for a free slot: the broker sends "
                 "up to concurrency + prefetch, so short batches travel several per message "
                 "(raise it for batches of well under a millisecond; 0 keeps every waiting "
                 "batch at the broker, free for any worker)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_option("--handler", options.handler,
                 "echo (payload back), sleep (payload = ms), sha256 (hex digest), "
                 "exec (run --exec per batch), process (run --exec once per slot and keep it: "
                 "docs/handler-protocol.md)")
      ->check(CLI::IsMember({"echo", "sleep", "sha256", "exec", "process"}))
      ->capture_default_str();
  app.add_option("--exec", options.exec,
                 "the command: for --handler exec run by /bin/sh -c once per batch (payload "
                 "on stdin, result from stdout); for --handler process started once per slot "
                 "(directly when it is plain words, else by /bin/sh -c) and kept running, "
                 "speaking docs/handler-protocol.md on its stdin and stdout");
  double grace_seconds = static_cast<double>(options.handler_grace.count()) / 1000.0;
  app.add_option("--handler-grace-seconds", grace_seconds,
                 "--handler process: how long a handler has to exit after the worker closes "
                 "its stdin at shutdown before it is killed")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--batch-timeout", batch_timeout,
                 "seconds a batch may run before it is failed (0 = no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--queues", options.queues,
                 "comma-separated queues to take batches from (default: all)")
      ->delimiter(',');
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--metrics", options.metrics,
                 "ADDRESS:PORT to bind Prometheus /metrics on (0.0.0.0:9752: every interface, "
                 "127.0.0.1:9752: this host only; port 0 picks one); off when empty; only "
                 "/metrics is served");
  fleet::AddMetricsAuthFlag(app, &options.metrics_auth_file);
  app.add_option("--heartbeat-ms", heartbeat_ms,
                 "heartbeat interval until the broker's WELCOME sets one")
      ->check(CLI::Range(10, 3'600'000))
      ->capture_default_str();
  fleet::AddCurveClientFlags(app, &options.curve_server_key, &options.curve_key);

  if (int rc = fleet::ParseFlags(app, argc, argv); rc >= 0) return rc;
  if (options.handler == "exec" && options.exec.empty()) {
    std::cerr << "fleet-worker: --handler exec requires --exec \"CMD\" "
                 "(the shell command to run per batch)\n";
    return 2;
  }
  if (options.handler == "process" && options.exec.empty()) {
    std::cerr << "fleet-worker: --handler process requires --exec \"CMD\" "
                 "(the handler program to keep running per slot; docs/handler-protocol.md)\n";
    return 2;
  }
  options.handler_grace = std::chrono::milliseconds(std::llround(grace_seconds * 1000));
  options.batch_timeout = std::chrono::milliseconds(std::llround(batch_timeout * 1000));
  if (batch_timeout > 0 && options.batch_timeout.count() == 0) {
    options.batch_timeout = std::chrono::milliseconds(1);  // no "no limit" by rounding
  }
  options.heartbeat = std::chrono::milliseconds(heartbeat_ms);

  std::unique_ptr<fleet::Worker> worker;
  try {
    fleet::SetupLogging("fleet-worker", log_level);
    worker = std::make_unique<fleet::Worker>(options);
  } catch (const std::invalid_argument& e) {
    std::cerr << "fleet-worker: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    spdlog::critical("fleet-worker: {}", e.what());
    return 1;
  }
  if (!options.exec.empty() && options.handler != "exec" && options.handler != "process") {
    spdlog::warn("--exec is ignored with --handler {}", options.handler);
  }
  try {
    return worker->Run();  // SIGINT/SIGTERM drain; a second one exits at once
  } catch (const fleet::AuthenticationError& e) {
    // The broker will never let this worker in: say why, once, and go.
    std::cerr << "fleet-worker: " << e.what() << "\n";
    spdlog::default_logger()->flush();
    std::_Exit(fleet::kAuthFailed);
  } catch (const std::exception& e) {
    // Run has killed the handler's processes; slot threads may still be in
    // a batch (a sleep): do not wait for them.
    spdlog::critical("fleet-worker: {}", e.what());
    spdlog::default_logger()->flush();
    std::_Exit(1);
  }
}

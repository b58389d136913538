// fleet-worker: pulls batches from the broker, runs a handler on each and
// returns the results; drains and exits on STOP or SIGTERM/SIGINT.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "common/curve.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/metrics_server.h"
#include "common/signals.h"
#include "worker/worker.h"

namespace {

std::string DefaultId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "worker");
  }
  return std::string(host) + "-" + std::to_string(getpid());
}

}  // namespace

int main(int argc, char** argv) {
  fleet::worker::WorkerOptions options;
  options.id = DefaultId();
  std::string log_level = "info";
  double batch_timeout = 0;
  int heartbeat_ms = static_cast<int>(options.heartbeat.count());

  CLI::App app{"fleet-worker: pulls batches from the fleet broker, runs a "
               "handler on each and sends the results back"};
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
  app.add_option("--handler", options.handler.name,
                 "echo (payload back), sleep (payload = ms), sha256 (hex digest), "
                 "exec (run --exec per batch), process (run --exec once per slot and keep it: "
                 "docs/handler-protocol.md)")
      ->check(CLI::IsMember({"echo", "sleep", "sha256", "exec", "process"}))
      ->capture_default_str();
  app.add_option("--exec", options.handler.exec,
                 "the command: for --handler exec run by /bin/sh -c once per batch (payload "
                 "on stdin, result from stdout); for --handler process started once per slot "
                 "(directly when it is plain words, else by /bin/sh -c) and kept running, "
                 "speaking docs/handler-protocol.md on its stdin and stdout");
  double grace_seconds = options.handler.grace.count();
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
  std::string metrics_auth_file;
  fleet::AddMetricsAuthFlag(app, &metrics_auth_file);
  app.add_option("--heartbeat-ms", heartbeat_ms,
                 "heartbeat interval until the broker's WELCOME sets one")
      ->check(CLI::Range(10, 3'600'000))
      ->capture_default_str();
  std::string curve_server_key, curve_key;
  fleet::AddCurveClientFlags(app, &curve_server_key, &curve_key);

  if (int rc = fleet::ParseFlags(app, argc, argv); rc >= 0) return rc;
  if (options.handler.name == "exec" && options.handler.exec.empty()) {
    std::cerr << "fleet-worker: --handler exec requires --exec \"CMD\" "
                 "(the shell command to run per batch)\n";
    return 2;
  }
  if (options.handler.name == "process" && options.handler.exec.empty()) {
    std::cerr << "fleet-worker: --handler process requires --exec \"CMD\" "
                 "(the handler program to keep running per slot; docs/handler-protocol.md)\n";
    return 2;
  }
  options.handler.grace = fleet::worker::Timeout(grace_seconds);
  options.batch_timeout = fleet::worker::Timeout(batch_timeout);
  options.heartbeat = fleet::Millis(heartbeat_ms);

  try {
    fleet::SetupLogging("fleet-worker", log_level);
    options.socket_limits.curve = fleet::LoadCurveClient(curve_server_key, curve_key);
    options.metrics_auth = fleet::LoadMetricsFlags(options.metrics, metrics_auth_file);
  } catch (const std::exception& e) {
    std::cerr << "fleet-worker: " << e.what() << "\n";
    return 2;
  }
  if (!options.handler.exec.empty() && options.handler.name != "exec" &&
      options.handler.name != "process") {
    spdlog::warn("--exec is ignored with --handler {}", options.handler.name);
  }
  fleet::InstallStopSignals();

  std::unique_ptr<fleet::worker::Worker> worker;
  try {
    worker = std::make_unique<fleet::worker::Worker>(std::move(options));
    const int code = worker->Run();
    if (!worker->abandoned()) {
      worker.reset();  // joins the idle slots, delivers BYE within the linger
      return code;
    }
    spdlog::default_logger()->flush();
    std::_Exit(code);  // slots may still be busy: do not wait for them
  } catch (const std::exception& e) {
    spdlog::critical("fleet-worker: {}", e.what());
    spdlog::default_logger()->flush();
    if (worker) {
      worker->AbortNow();
      std::_Exit(1);  // slots may be busy; destroying the worker would wait
    }
    return 1;
  }
}

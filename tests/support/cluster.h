// A local fleet for integration tests: a real fleet-broker on ephemeral
// ports of 127.0.0.1, real fleet-worker processes, and the CLIs run as a user
// would. Everything is killed when the Cluster goes away.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace fleet::testing {

struct RunResult {
  int exit_code = -1;  // -1: timed out (and killed)
  std::string output;  // stdout and stderr
};

// Runs a program to completion (bounded by `timeout`), capturing its output.
RunResult Run(std::vector<std::string> argv, std::chrono::milliseconds timeout,
              const std::string& log_path);

class Cluster {
 public:
  Cluster();
  ~Cluster();

  // Starts fleet-broker with `extra` flags; waits for its ready file.
  void StartBroker(std::vector<std::string> extra = {});
  // Starts fleet-worker --id id with `extra` flags.
  Process& StartWorker(const std::string& id, std::vector<std::string> extra = {});
  Process& broker() { return *broker_; }
  Process& worker(const std::string& id) { return *workers_.at(id); }

  // fleet-submit against the frontend; --output goes to a file parsed into
  // `results` (one JSON object per line).
  struct Submitted {
    RunResult run;
    std::map<std::string, std::string> summary;  // key=value of the last line
    std::vector<nlohmann::json> results;
  };
  Submitted Submit(std::vector<std::string> extra,
                   std::chrono::milliseconds timeout = std::chrono::seconds(120));

  // fleet-ctl against the control endpoint (with the flags of
  // set_ctl_flags first, e.g. CURVE keys).
  RunResult Ctl(std::vector<std::string> args);
  void set_ctl_flags(std::vector<std::string> flags) { ctl_flags_ = std::move(flags); }
  // `fleet-ctl stats --json` values, or an empty object on failure.
  nlohmann::json Stats();
  // `fleet-ctl workers --json`, or an empty array on failure.
  nlohmann::json Workers();
  double StatValue(const std::string& name);

  const std::string& frontend() const { return frontend_; }
  const std::string& backend() const { return backend_; }
  const std::string& control() const { return control_; }
  // http://127.0.0.1:PORT/metrics of the broker.
  const std::string& metrics() const { return metrics_; }
  const TempDir& dir() const { return dir_; }
  std::string BrokerLog() const { return ReadFile(dir_.File("broker.log")); }
  std::string WorkerLog(const std::string& id) const {
    return ReadFile(dir_.File("worker-" + id + ".log"));
  }

 private:
  TempDir dir_;
  std::unique_ptr<Process> broker_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
  std::string frontend_, backend_, control_, metrics_;
  int runs_ = 0;
  std::vector<std::string> ctl_flags_;
};

// Broker flags naming fixed endpoints on 127.0.0.1 (--frontend, --backend,
// --control, and --metrics when `with_metrics`), found by starting a broker
// on ephemeral ports and killing it: a broker restarted with them listens
// where its producers, workers and autoscaler reconnect.
std::vector<std::string> FixedEndpointFlags(bool with_metrics = false);

// key=value pairs of a summary line.
std::map<std::string, std::string> ParseSummary(const std::string& line);

}  // namespace fleet::testing

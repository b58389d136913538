#include "tests/support/cluster.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tests/support/wait.h"

namespace fleet::testing {

RunResult Run(std::vector<std::string> argv, std::chrono::milliseconds timeout,
              const std::string& log_path) {
  RunResult r;
  {
    Process p(std::move(argv), log_path);
    auto code = p.Wait(timeout);
    r.exit_code = code ? *code : -1;
  }
  r.output = ReadFile(log_path);
  return r;
}

std::map<std::string, std::string> ParseSummary(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string kv;
  while (in >> kv) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

std::vector<std::string> FixedEndpointFlags(bool with_metrics) {
  Cluster ports;  // only its ports are wanted
  ports.StartBroker();
  std::vector<std::string> flags = {"--frontend", ports.frontend(), "--backend",
                                    ports.backend(), "--control", ports.control()};
  if (with_metrics) {
    const std::string& url = ports.metrics();  // http://HOST:PORT/metrics
    const auto host = url.find("//") + 2;
    flags.insert(flags.end(), {"--metrics", url.substr(host, url.find('/', host) - host)});
  }
  return flags;
}

Cluster::Cluster() = default;

Cluster::~Cluster() {
  workers_.clear();
  broker_.reset();
}

void Cluster::StartBroker(std::vector<std::string> extra) {
  std::string ready = dir_.File("broker.ready");
  std::remove(ready.c_str());  // a restart must not read the old one
  std::vector<std::string> argv = {Bin("fleet-broker"), "--ready-file", ready};
  // Ephemeral ports unless `extra` names the endpoint (a restart on the
  // same ports).
  for (const char* flag : {"--frontend", "--backend", "--control"}) {
    if (std::find(extra.begin(), extra.end(), flag) == extra.end()) {
      argv.insert(argv.end(), {flag, "tcp://127.0.0.1:*"});
    }
  }
  if (std::find(extra.begin(), extra.end(), "--metrics") == extra.end()) {
    argv.insert(argv.end(), {"--metrics", "127.0.0.1:0"});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  broker_ = std::make_unique<Process>(argv, dir_.File("broker.log"));
  if (!WaitFor([&] { return !ReadFile(ready).empty(); }, std::chrono::seconds(10))) {
    throw std::runtime_error("broker did not start: " + BrokerLog());
  }
  std::istringstream in(ReadFile(ready));
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "frontend") frontend_ = v;
    if (k == "backend") backend_ = v;
    if (k == "control") control_ = v;
    if (k == "metrics") metrics_ = v;
  }
}

Process& Cluster::StartWorker(const std::string& id, std::vector<std::string> extra) {
  std::vector<std::string> argv = {Bin("fleet-worker"), "--broker", backend_, "--id", id};
  argv.insert(argv.end(), extra.begin(), extra.end());
  workers_[id] = std::make_unique<Process>(argv, dir_.File("worker-" + id + ".log"));
  return *workers_[id];
}

Cluster::Submitted Cluster::Submit(std::vector<std::string> extra,
                                   std::chrono::milliseconds timeout) {
  int n = ++runs_;
  std::string out = dir_.File("results-" + std::to_string(n) + ".jsonl");
  std::string log = dir_.File("submit-" + std::to_string(n) + ".log");
  std::vector<std::string> argv = {Bin("fleet-submit"), "--broker", frontend_, "--output", out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Submitted s;
  s.run = Run(argv, timeout, log);
  std::istringstream lines(s.run.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("submitted=", 0) == 0) s.summary = ParseSummary(line);
  }
  std::ifstream in(out);
  while (std::getline(in, line)) {
    if (!line.empty()) s.results.push_back(nlohmann::json::parse(line));
  }
  return s;
}

RunResult Cluster::Ctl(std::vector<std::string> args) {
  std::string log = dir_.File("ctl-" + std::to_string(++runs_) + ".log");
  std::vector<std::string> argv = {Bin("fleet-ctl"), "--control", control_};
  argv.insert(argv.end(), ctl_flags_.begin(), ctl_flags_.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv, std::chrono::seconds(20), log);
}

nlohmann::json Cluster::Stats() {
  RunResult r = Ctl({"--json", "stats"});
  if (r.exit_code != 0) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(r.output);
  } catch (const std::exception&) {
    return nlohmann::json::object();
  }
}

double Cluster::StatValue(const std::string& name) {
  nlohmann::json s = Stats();
  if (s.contains("values") && s["values"].contains(name)) return s["values"][name].get<double>();
  return -1;
}

nlohmann::json Cluster::Workers() {
  RunResult r = Ctl({"--json", "workers"});
  if (r.exit_code != 0) return nlohmann::json::array();
  try {
    return nlohmann::json::parse(r.output).at("workers");
  } catch (const std::exception&) {
    return nlohmann::json::array();
  }
}

}  // namespace fleet::testing

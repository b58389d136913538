// fleet-autoscaler end to end: real broker, real autoscaler with the process
// launcher, real workers, over 127.0.0.1. Waits are bounded conditions.
#include <gtest/gtest.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tests/support/cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/http_server.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

// A metric's value on a Prometheus text page ("" labels: the plain series).
double PageValue(const std::string& page, const std::string& series) {
  auto at = page.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atof(page.c_str() + at + series.size() + 2);
}

// A free TCP port on 127.0.0.1 (for a program that cannot report the port
// it bound, like Prometheus).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class AutoscalerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A retired idle worker lingers 2 s before it is told to stop, so a
    // burst in that window can take it back.
    std::vector<std::string> flags{"--heartbeat-ms", "250", "--retire-linger-ms", "2000"};
    for (const auto& f : ExtraBrokerFlags()) flags.push_back(f);
    c_.StartBroker(flags);
    prefix_ = "as-" + std::to_string(getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-";
  }

  // `overrides`: flag, value pairs replacing the defaults below (an empty
  // value drops the flag); `env`: "K=V" added to its environment.
  std::unique_ptr<Process> StartAutoscaler(
      const std::string& log, const std::map<std::string, std::string>& overrides = {},
      std::vector<std::string> env = {}) {
    std::map<std::string, std::string> flags{
        {"--control", c_.control()},
        {"--metrics-source", c_.metrics()},
        {"--worker-args", "--broker " + c_.backend() + " --handler sleep --heartbeat-ms 250"},
        {"--min", "0"},
        {"--max", "4"},
        {"--idle-seconds", "2"},
        {"--cooldown-seconds", "1"},
        {"--stabilization-seconds", "2"},
        {"--poll-ms", "200"},
        {"--grace-seconds", "5"},
        {"--id-prefix", prefix_},
        {"--metrics", "127.0.0.1:0"}};
    for (const auto& [k, v] : overrides) flags[k] = v;
    std::vector<std::string> argv{Bin("fleet-autoscaler")};
    for (const auto& [k, v] : flags) {
      if (!v.empty()) argv.insert(argv.end(), {k, v});
    }
    return std::make_unique<Process>(argv, c_.dir().File(log), std::move(env));
  }

  virtual std::vector<std::string> ExtraBrokerFlags() { return {}; }

  // Debian's prometheus scraping the broker every second, with
  // `scrape_extra` (YAML at the level of static_configs) in its job.
  // Returns it running and ready; `listen` is its host:port.
  std::unique_ptr<Process> StartPrometheus(const std::string& scrape_extra, std::string* listen);

  int Registered() {
    int n = 0;
    for (const auto& w : c_.Workers()) n += w.value("state", "") != "retiring";
    return n;
  }

  Cluster c_;
  std::string prefix_;
};

TEST_F(AutoscalerTest, GrowsToMaxForABurstAndShrinksToZeroWithoutFailingABatch) {
  auto scaler = StartAutoscaler("autoscaler.log");
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "400", "--payload",
                  "50", "--inflight", "400"},
                 c_.dir().File("submit.log"));
  int most = 0;
  ASSERT_TRUE(WaitFor([&] {
    most = std::max(most, Registered());
    return most == 4;
  }, seconds(30))) << ReadFile(c_.dir().File("autoscaler.log"));
  auto code = submit.Wait(seconds(120));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  EXPECT_NE(submit.ReadLog().find("submitted=400 ok=400 failed=0 lost=0"), std::string::npos)
      << submit.ReadLog();
  // Idle 2 s + stabilization 2 s + cooldown 1 s + a few polls, with margin.
  ASSERT_TRUE(WaitFor([&] { return c_.Workers().empty(); }, seconds(30)))
      << ReadFile(c_.dir().File("autoscaler.log"));
  // Every worker process exited and was reaped.
  EXPECT_TRUE(WaitFor([&] { return CountWorkers(prefix_) == 0; }, seconds(20)));
  // The page is refreshed on the broker's housekeeping tick.
  std::string page;
  EXPECT_TRUE(WaitFor([&] {
    page = HttpGet(c_.metrics());
    return PageValue(page, "fleet_workers_retired_total") == 4;
  })) << page;
  EXPECT_EQ(PageValue(page, "fleet_dispatched_to_retiring_total"), 0) << page;
  EXPECT_EQ(c_.StatValue("completed_failed"), 0);
  EXPECT_EQ(c_.StatValue("requeued"), 0);
  scaler->Signal(SIGTERM);
  auto sc = scaler->Wait(seconds(20));
  ASSERT_TRUE(sc.has_value());
  EXPECT_EQ(*sc, 0);
  std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(log.find("decision scale_up"), std::string::npos) << log;
  EXPECT_NE(log.find("decision scale_down"), std::string::npos) << log;
}

// With a 10-minute poll, only the broker's answer to wait-demand can start
// a worker for a burst that arrives at zero: the test would time out long
// before the next scheduled poll.
TEST_F(AutoscalerTest, BurstAtZeroWorkersWakesItBeforeTheNextPoll) {
  auto scaler = StartAutoscaler("autoscaler.log", {{"--poll-ms", "600000"}});
  // The first poll has run (and found nothing to do).
  ASSERT_TRUE(WaitFor([&] {
    return ReadFile(c_.dir().File("autoscaler.log")).find("decision hold") != std::string::npos;
  }, seconds(20))) << ReadFile(c_.dir().File("autoscaler.log"));
  ASSERT_EQ(Registered(), 0);
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "5", "--payload",
                  "20", "--inflight", "5"},
                 c_.dir().File("submit.log"));
  auto code = submit.Wait(seconds(60));
  ASSERT_TRUE(code.has_value()) << ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  EXPECT_NE(submit.ReadLog().find("submitted=5 ok=5 failed=0 lost=0"), std::string::npos)
      << submit.ReadLog();
  std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(log.find("decision scale_up (demand)"), std::string::npos) << log;
  // How many of the 5 the answer counted depends on the broker's turns.
  EXPECT_NE(log.find("woken by the broker: "), std::string::npos) << log;
  scaler->Signal(SIGTERM);
  auto sc = scaler->Wait(seconds(20));
  ASSERT_TRUE(sc.has_value());
  EXPECT_EQ(*sc, 0);
}

TEST_F(AutoscalerTest, KilledAndRestartedItNeitherDoublesThePoolNorLeavesOrphans) {
  auto scaler = StartAutoscaler("autoscaler-1.log");
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "300", "--payload",
                  "50", "--inflight", "300", "--resend-after-seconds", "2"},
                 c_.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] { return Registered() == 4; }, seconds(30)));
  std::set<std::string> first_run;
  for (const auto& w : c_.Workers()) first_run.insert(w.value("id", ""));
  scaler->Signal(SIGKILL);
  ASSERT_TRUE(scaler->Wait(seconds(10)).has_value());
  auto again = StartAutoscaler("autoscaler-2.log");
  // The killed one's workers drain (SIGTERM from the kernel) while the new
  // one takes over: the new one never runs more than --max of its own.
  int most = 0;
  std::string at_most;
  auto code = std::optional<int>();
  ASSERT_TRUE(WaitFor([&] {
    nlohmann::json workers = c_.Workers();
    int mine = 0;
    for (const auto& w : workers) {
      mine += first_run.count(w.value("id", "")) == 0 && w.value("state", "") != "retiring";
    }
    if (mine > most) at_most = workers.dump();
    most = std::max(most, mine);
    code = submit.Wait(std::chrono::milliseconds(0));
    return code.has_value();
  }, seconds(120)));
  EXPECT_LE(most, 4) << at_most << ReadFile(c_.dir().File("autoscaler-2.log"));
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  EXPECT_NE(submit.ReadLog().find("ok=300 failed=0 lost=0"), std::string::npos)
      << submit.ReadLog();
  again->Signal(SIGTERM);
  ASSERT_TRUE(again->Wait(seconds(30)).has_value());
  // Nothing of either autoscaler is left running.
  EXPECT_TRUE(WaitFor([&] { return CountWorkers(prefix_) == 0; }, seconds(20)))
      << ReadFile(c_.dir().File("autoscaler-2.log"));
}

// The FLEET_* variables of the autoscaler's environment are its own
// settings: a worker it starts must not read them as its flags. Each of
// these, inherited, would stop every worker: FLEET_METRICS (the
// autoscaler's port, taken), FLEET_HANDLER and FLEET_CONCURRENCY (invalid).
TEST_F(AutoscalerTest, ItsOwnFleetVariablesNeverReachTheWorkersItStarts) {
  const std::string metrics = "127.0.0.1:" + std::to_string(FreePort());
  auto scaler = StartAutoscaler(
      "autoscaler.log", {{"--metrics", ""}, {"--target-per-worker", "1"}},
      {"FLEET_METRICS=" + metrics, "FLEET_LOG_LEVEL=debug", "FLEET_HANDLER=no-such-handler",
       "FLEET_CONCURRENCY=0", "NOT_FLEET_VALUE=-DFLEET_WERROR=ON"});
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "40", "--payload",
                  "100", "--inflight", "40", "--timeout-seconds", "90"},
                 c_.dir().File("submit.log"));
  // While they run: no worker's environment holds a FLEET_ variable.
  std::vector<pid_t> pids;
  ASSERT_TRUE(WaitFor([&] {
    pids = WorkerPids(prefix_);
    return !pids.empty();
  }, seconds(30))) << ReadFile(c_.dir().File("autoscaler.log"));
  for (pid_t pid : pids) {
    std::string environ = ReadFile("/proc/" + std::to_string(pid) + "/environ");
    if (environ.empty()) continue;  // exited meanwhile
    // Names only: a value may mention FLEET_ (CI's CMAKE_FLAGS does).
    const std::string entries = std::string(1, '\0') + environ;
    EXPECT_EQ(entries.find(std::string("\0FLEET_", 7)), std::string::npos)
        << "worker pid " << pid;
    EXPECT_NE(environ.find("PATH="), std::string::npos) << "worker pid " << pid;
    EXPECT_NE(entries.find(std::string("\0NOT_FLEET_VALUE=-DFLEET_WERROR=ON\0", 35)),
              std::string::npos) << "worker pid " << pid;
  }
  auto code = submit.Wait(seconds(120));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << submit.ReadLog() << ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(submit.ReadLog().find("submitted=40 ok=40 failed=0 lost=0"), std::string::npos)
      << submit.ReadLog();
  const std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_EQ(log.find("cannot serve metrics"), std::string::npos) << log;
  EXPECT_EQ(log.find("(status 2)"), std::string::npos) << log;
  // The autoscaler itself did take its settings from them.
  const std::string page = HttpGet("http://" + metrics + "/metrics");
  EXPECT_GE(PageValue(page, "fleet_autoscaler_workers_launched_total"), 1) << page;
  EXPECT_EQ(PageValue(page, "fleet_autoscaler_start_failures_total"), 0) << page;
  EXPECT_NE(log.find("debug"), std::string::npos) << log;
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
}

// Regression: after kill -9 of the autoscaler, each worker got the
// parent-death SIGTERM two or more times within milliseconds (once per
// thread of the dying autoscaler) and took the second as "exit now",
// leaving its batch to be requeued. Each must drain: its batch finishes on
// it, and it says BYE and exits.
TEST_F(AutoscalerTest, KilledAutoscalersWorkersFinishTheirBatchesAndExit) {
  auto scaler = StartAutoscaler("autoscaler.log", {{"--target-per-worker", "1"}});
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "2", "--payload",
                  "2000", "--inflight", "2", "--timeout-seconds", "90"},
                 c_.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] {
    int holding = 0;
    for (const auto& w : c_.Workers()) holding += w.value("held", 0) == 1;
    return holding == 2;
  }, seconds(30))) << ReadFile(c_.dir().File("autoscaler.log"));
  scaler->Signal(SIGKILL);
  ASSERT_TRUE(scaler->Wait(seconds(10)).has_value());
  auto code = submit.Wait(seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  EXPECT_NE(submit.ReadLog().find("submitted=2 ok=2 failed=0 lost=0"), std::string::npos)
      << submit.ReadLog();
  EXPECT_EQ(c_.StatValue("requeued"), 0);
  EXPECT_TRUE(WaitFor([&] { return CountWorkers(prefix_) == 0; }, seconds(20)));
  // The workers' stderr is the autoscaler's log file.
  const std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_EQ(log.find("second stop signal"), std::string::npos) << log;
  std::size_t drained = 0;
  for (auto at = log.find("drained after 1 batches"); at != std::string::npos;
       at = log.find("drained after 1 batches", at + 1)) {
    ++drained;
  }
  EXPECT_EQ(drained, 2u) << log;
  EXPECT_TRUE(WaitFor([&] { return c_.Workers().empty(); })) << c_.Workers().dump();
  EXPECT_EQ(c_.StatValue("workers_dead"), 0);
}

TEST_F(AutoscalerTest, BurstArrivingWhileWorkersRetireTakesThemBackInsteadOfColdStarting) {
  auto scaler = StartAutoscaler("autoscaler.log", {{"--idle-seconds", "1"},
                                                   {"--cooldown-seconds", "0"},
                                                   {"--stabilization-seconds", "0"}});
  auto first = c_.Submit({"--count", "80", "--payload", "50", "--inflight", "80"}, seconds(60));
  ASSERT_EQ(first.run.exit_code, 0) << first.run.output;
  // Quiet: all four are retired and linger.
  ASSERT_TRUE(WaitFor([&] {
    auto workers = c_.Workers();
    int retiring = 0;
    for (const auto& w : workers) retiring += w.value("state", "") == "retiring";
    return workers.size() == 4 && retiring == 4;
  }, seconds(30))) << ReadFile(c_.dir().File("autoscaler.log"));
  auto second = c_.Submit({"--count", "40", "--payload", "50", "--inflight", "40"}, seconds(60));
  ASSERT_EQ(second.run.exit_code, 0) << second.run.output;
  EXPECT_EQ(second.summary["ok"], "40");
  std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(log.find("took back retiring worker"), std::string::npos) << log;
  // Only the first burst's four were ever launched.
  std::string url;
  auto at = log.find("own metrics ");
  ASSERT_NE(at, std::string::npos);
  url = log.substr(at + 12, log.find(';', at) - at - 12);
  EXPECT_EQ(PageValue(HttpGet(url), "fleet_autoscaler_workers_launched_total"), 4) << log;
  EXPECT_EQ(c_.StatValue("completed_failed"), 0);
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
}

TEST_F(AutoscalerTest, UnreadableMetricsFreezeScaleDownButWorkStillStartsWorkers) {
  // Nothing listens on port 1: every read fails.
  auto scaler = StartAutoscaler("autoscaler.log",
                                {{"--metrics-source", "http://127.0.0.1:1/metrics"},
                                 {"--idle-seconds", "1"},
                                 {"--cooldown-seconds", "0"},
                                 {"--stabilization-seconds", "0"}});
  auto s = c_.Submit({"--count", "40", "--payload", "20", "--inflight", "40"}, seconds(60));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output << ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_EQ(s.summary["ok"], "40");
  // Let at least 15 more polls (3 s, well past --idle-seconds) go by, counted
  // by the autoscaler's own error counter: nobody may be retired meanwhile.
  std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  auto at = log.find("own metrics ");
  ASSERT_NE(at, std::string::npos) << log;
  std::string url = log.substr(at + 12, log.find(';', at) - at - 12);
  double errors_then = PageValue(HttpGet(url), "fleet_autoscaler_metric_source_errors_total");
  ASSERT_GT(errors_then, 0);
  ASSERT_TRUE(WaitFor([&] {
    return PageValue(HttpGet(url), "fleet_autoscaler_metric_source_errors_total") >=
           errors_then + 15;
  }, seconds(30)));
  EXPECT_FALSE(c_.Workers().empty());
  EXPECT_EQ(c_.StatValue("workers_retired"), 0);
  log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(log.find("decision scale_up"), std::string::npos) << log;
  EXPECT_NE(log.find("scale-down frozen"), std::string::npos) << log;
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
  EXPECT_TRUE(WaitFor([&] { return CountWorkers(prefix_) == 0; }, seconds(20)));
}

TEST_F(AutoscalerTest, CrashingWorkerBackoffPreventsALaunchStorm) {
  // Every "worker" dies at once: launches must back off (1 s, 2 s, 4 s ...)
  // instead of restarting it every poll.
  auto scaler = StartAutoscaler("autoscaler.log", {{"--worker-bin", "/bin/false"}});
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "10",
                  "--timeout-seconds", "60"},
                 c_.dir().File("submit.log"));
  std::string log;
  ASSERT_TRUE(WaitFor([&] {
    log = ReadFile(c_.dir().File("autoscaler.log"));
    return log.find("own metrics ") != std::string::npos;
  }));
  auto at = log.find("own metrics ");
  std::string url = log.substr(at + 12, log.find(';', at) - at - 12);
  // 15 polls held back by the backoff (3 s at 200 ms): without a backoff
  // each of them would have launched again.
  const std::string held =
      "fleet_autoscaler_decisions_total{action=\"hold\",reason=\"start_backoff\"}";
  ASSERT_TRUE(WaitFor([&] { return PageValue(HttpGet(url), held) >= 15; }, seconds(30)))
      << ReadFile(c_.dir().File("autoscaler.log"));
  std::string page = HttpGet(url);
  double failures = PageValue(page, "fleet_autoscaler_start_failures_total");
  double launched = PageValue(page, "fleet_autoscaler_workers_launched_total");
  EXPECT_GE(failures, 3);
  EXPECT_LE(launched, 12) << page;
  // Never scaled down, yet the series is there at 0, so increase() over it
  // counts a run's first scale-down too.
  EXPECT_EQ(PageValue(page, "fleet_autoscaler_decisions_total{action=\"scale_down\",reason=\"idle\"}"), 0)
      << page;
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
}

// Sum of every series of `name` on a Prometheus text page.
double PageSum(const std::string& page, const std::string& name) {
  std::istringstream in(page);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next == ' ' || next == '{') sum += std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return sum;
}

// The loop never waits on the outside world: its metrics source never
// answers (a server that holds every request open) and each start command
// takes 5 s. Its own /metrics keeps answering and its decisions counter
// grows by many polls' worth while not one read has been answered; the
// read that runs into --metrics-timeout is counted, and the decisions go
// on after it too.
TEST_F(AutoscalerTest, SilentMetricsSourceAndSlowStartsNeverHoldItsDecisions) {
  TestServer silent([](const Request&) { return std::optional<std::string>(); });
  auto scaler = StartAutoscaler("autoscaler.log",
                                {{"--metrics-source", silent.url() + "/metrics"},
                                 {"--metrics-timeout", "3"},
                                 {"--launcher", "command"},
                                 {"--start-command", "sleep 5"},
                                 {"--worker-args", ""}});
  // Work waits at the broker: the control stats drive a scale-up.
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "8",
                  "--timeout-seconds", "120"},
                 c_.dir().File("submit.log"));
  std::string log;
  ASSERT_TRUE(WaitFor([&] {
    log = ReadFile(c_.dir().File("autoscaler.log"));
    return log.find("own metrics ") != std::string::npos;
  }));
  auto at = log.find("own metrics ");
  const std::string url = log.substr(at + 12, log.find(';', at) - at - 12);
  auto decisions = [&] { return PageSum(HttpGet(url), "fleet_autoscaler_decisions_total"); };
  const double then = decisions();
  // 10 polls of 200 ms; the bound is for a machine that is very slow.
  ASSERT_TRUE(WaitFor([&] { return decisions() >= then + 10; }, seconds(60)))
      << ReadFile(c_.dir().File("autoscaler.log"));
  ASSERT_FALSE(silent.requests().empty());  // the reads went out, and none came back
  std::string page = HttpGet(url);
  EXPECT_GE(PageValue(page, "fleet_autoscaler_workers_launched_total"), 1) << page;
  // The first read runs into its 3 s deadline: counted once, and the
  // decisions go on.
  ASSERT_TRUE(WaitFor(
      [&] { return PageValue(HttpGet(url), "fleet_autoscaler_metric_source_timeouts_total") >= 1; },
      seconds(60)))
      << ReadFile(c_.dir().File("autoscaler.log"));
  const double after = decisions();
  ASSERT_TRUE(WaitFor([&] { return decisions() >= after + 5; }, seconds(60)));
  log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(log.find("timed out: no complete answer within 3000 ms (--metrics-timeout)"),
            std::string::npos)
      << log;
  EXPECT_EQ(c_.StatValue("workers_retired"), 0);
  scaler->Signal(SIGTERM);
  EXPECT_TRUE(scaler->Wait(seconds(30)).has_value());
  submit.Signal(SIGTERM);
  submit.Wait(seconds(30));
}

std::unique_ptr<Process> AutoscalerTest::StartPrometheus(const std::string& scrape_extra,
                                                         std::string* listen) {
  std::string target = c_.metrics().substr(7, c_.metrics().find("/metrics") - 7);
  std::string config = c_.dir().File("prometheus.yml");
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: broker\n"
                        << scrape_extra
                        << "    static_configs:\n      - targets: ['" << target << "']\n";
  *listen = "127.0.0.1:" + std::to_string(FreePort());
  auto prometheus = std::make_unique<Process>(
      std::vector<std::string>{"/usr/bin/prometheus", "--config.file=" + config,
                               "--storage.tsdb.path=" + c_.dir().File("tsdb"),
                               "--web.listen-address=" + *listen},
      c_.dir().File("prometheus.log"));
  if (!WaitFor([&] { return HttpGet("http://" + *listen + "/-/ready").size() > 0; },
               seconds(30))) {
    ADD_FAILURE() << "prometheus not ready: " << ReadFile(c_.dir().File("prometheus.log"));
  }
  return prometheus;
}

TEST_F(AutoscalerTest, ScalesFromAPrometheusServerThatScrapesTheBroker) {
  std::string listen;
  auto prometheus = StartPrometheus("", &listen);
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto scaler = StartAutoscaler("autoscaler.log",
                                {{"--metrics-source", "prometheus:http://" + listen},
                                 {"--idle-seconds", "1"},
                                 {"--cooldown-seconds", "0"},
                                 {"--stabilization-seconds", "1"}});
  auto s = c_.Submit({"--count", "200", "--payload", "20", "--inflight", "200"}, seconds(60));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  EXPECT_EQ(s.summary["ok"], "200");
  // Fresh answers from Prometheus let it scale down too.
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("workers_retired") >= 1; }, seconds(30)))
      << ReadFile(c_.dir().File("autoscaler.log"));
  std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(log.find("metrics source prometheus:http://"), std::string::npos) << log;
  EXPECT_NE(log.find("decision scale_down"), std::string::npos) << log;
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
  prometheus->Signal(SIGTERM);
  prometheus->Wait(seconds(20));
}

TEST_F(AutoscalerTest, RetiringIdleWorkersWhileBatchesKeepArrivingNeverLosesOrFailsOne) {
  // An eager autoscaler (idle 1 s, no cooldown or stabilization) under an
  // uneven stream: short and long batches mixed, so workers keep going idle
  // and busy while it retires them.
  auto scaler = StartAutoscaler(
      "autoscaler.log", {{"--idle-seconds", "1"}, {"--cooldown-seconds", "0"},
                         {"--stabilization-seconds", "0"}, {"--poll-ms", "100"},
                         {"--target-per-worker", "1"}});
  std::string input = c_.dir().File("payloads.txt");
  {
    std::ofstream f(input);
    const int pattern[] = {10, 10, 1500, 10, 1200, 10, 10, 10, 2000, 10, 10, 1100};
    for (int i = 0; i < 96; ++i) f << pattern[i % 12] << "\n";
  }
  auto s = c_.Submit({"--input", input, "--inflight", "3"}, seconds(90));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output << ReadFile(c_.dir().File("autoscaler.log"))
                                << c_.BrokerLog();
  EXPECT_EQ(s.summary["ok"], "96");
  EXPECT_EQ(s.summary["failed"], "0");
  EXPECT_EQ(s.summary["lost"], "0");
  std::string page;
  ASSERT_TRUE(WaitFor([&] {
    page = HttpGet(c_.metrics());
    return PageValue(page, "fleet_workers_retired_total") >= 2;
  }, seconds(30))) << "the stream should have caused retirements:\n" << page;
  EXPECT_EQ(PageValue(page, "fleet_dispatched_to_retiring_total"), 0) << page;
  EXPECT_EQ(c_.StatValue("requeued"), 0);
  EXPECT_EQ(c_.StatValue("completed_failed"), 0);
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
  EXPECT_TRUE(WaitFor([&] { return CountWorkers(prefix_) == 0; }, seconds(20)));
}

// The broker's /metrics behind basic auth (--metrics-auth-file).
class AutoscalerAuthTest : public AutoscalerTest {
 protected:
  std::vector<std::string> ExtraBrokerFlags() override {
    auth_file_ = c_.dir().File("metrics.auth");
    std::ofstream(auth_file_) << "prom:s3cret pass\n";
    chmod(auth_file_.c_str(), 0600);
    return {"--metrics-auth-file", auth_file_};
  }
  std::string auth_file_;
};

TEST_F(AutoscalerAuthTest, ScrapesABrokerThatRequiresBasicAuthAndScalesBothWays) {
  auto scaler = StartAutoscaler("autoscaler.log", {{"--metrics-source-auth-file", auth_file_},
                                                   {"--idle-seconds", "1"},
                                                   {"--cooldown-seconds", "0"},
                                                   {"--stabilization-seconds", "1"}});
  auto s = c_.Submit({"--count", "100", "--payload", "20", "--inflight", "100"}, seconds(60));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  EXPECT_EQ(s.summary["ok"], "100");
  // Scale-down needs fresh metrics, which only an authenticated read gives.
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("workers_retired") >= 1; }, seconds(30)))
      << ReadFile(c_.dir().File("autoscaler.log"));
  std::string log = ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_NE(log.find("/metrics (basic auth)"), std::string::npos) << log;
  EXPECT_NE(log.find("decision scale_down"), std::string::npos) << log;
  EXPECT_EQ(log.find("HTTP status 401"), std::string::npos) << log;
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
  EXPECT_TRUE(WaitFor([&] { return CountWorkers(prefix_) == 0; }, seconds(20)));
}

TEST_F(AutoscalerAuthTest, WithoutCredentialsItReports401AndNamesTheFlag) {
  auto scaler = StartAutoscaler("autoscaler.log");
  ASSERT_TRUE(WaitFor([&] {
    return ReadFile(c_.dir().File("autoscaler.log"))
               .find("HTTP status 401 (check --metrics-source-auth-file)") != std::string::npos;
  })) << ReadFile(c_.dir().File("autoscaler.log"));
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
}

TEST_F(AutoscalerAuthTest, ScalesFromAPrometheusThatScrapesTheBrokerWithBasicAuth) {
  // The scrape job of the README: basic_auth with a password_file.
  std::string password = c_.dir().File("prom.password");
  std::ofstream(password) << "s3cret pass\n";
  chmod(password.c_str(), 0600);
  std::string listen;
  auto prometheus = StartPrometheus(
      "    basic_auth:\n      username: prom\n      password_file: " + password + "\n", &listen);
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto scaler = StartAutoscaler("autoscaler.log",
                                {{"--metrics-source", "prometheus:http://" + listen},
                                 {"--idle-seconds", "1"},
                                 {"--cooldown-seconds", "0"},
                                 {"--stabilization-seconds", "1"}});
  auto s = c_.Submit({"--count", "100", "--payload", "20", "--inflight", "100"}, seconds(60));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  // Fresh answers from Prometheus (it scraped the protected broker) let it
  // scale down.
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("workers_retired") >= 1; }, seconds(30)))
      << ReadFile(c_.dir().File("autoscaler.log"));
  scaler->Signal(SIGTERM);
  ASSERT_TRUE(scaler->Wait(seconds(30)).has_value());
  prometheus->Signal(SIGTERM);
  prometheus->Wait(seconds(20));
}

}  // namespace
}  // namespace fleet::testing

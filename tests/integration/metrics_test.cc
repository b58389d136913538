// The broker's /metrics page: every name DESIGN.md promises, values that
// follow the work, per-worker series that leave with their worker, and a
// page promtool accepts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "tests/support/cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

bool Has(const std::string& page, const std::string& needle) {
  return page.find(needle) != std::string::npos;
}

TEST(MetricsTest, BrokerServesEveryDesignMetricAndDropsSeriesOfWorkersThatLeave) {
  Cluster c;
  c.StartBroker({"--heartbeat-ms", "100"});
  ASSERT_FALSE(c.metrics().empty()) << c.BrokerLog();
  c.StartWorker("m1", {"--concurrency", "2"});
  c.StartWorker("m2", {"--concurrency", "2"});
  // Both registered first: the page follows the broker within tens of
  // milliseconds, and a late m2 would be missing from it.
  ASSERT_TRUE(WaitFor([&] { return c.Workers().size() == 2; })) << c.BrokerLog();
  auto s = c.Submit({"--count", "100"});
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  std::string page;
  ASSERT_TRUE(WaitFor([&] {
    page = HttpGet(c.metrics());
    return Has(page, "fleet_batches_completed_total{outcome=\"ok\"} 100");
  })) << page;
  for (const char* name :
       {"fleet_queue_depth{queue=\"default\"} 0", "fleet_batches_inflight 0",
        "fleet_batches_held_bytes 0",
        "fleet_workers{state=\"idle\"} 2", "fleet_workers{state=\"busy\"} 0",
        "fleet_workers{state=\"retiring\"} 0", "fleet_worker_idle_seconds{worker=\"m1\"}",
        "fleet_worker_idle_seconds{worker=\"m2\"}", "fleet_blacklisted_workers 0",
        "fleet_batches_submitted_total 100", "fleet_batches_completed_total{outcome=\"failed\"} 0",
        "fleet_batches_requeued_total 0", "fleet_batch_wait_seconds_count 100",
        "fleet_batch_processing_seconds_count 100", "fleet_batch_wait_seconds_bucket{le=\"+Inf\"}",
        "fleet_batches_rejected_total{reason=\"queue_full\"} 0",
        "fleet_messages_rejected_total{reason=\"malformed\"} 0",
        "fleet_dispatched_to_retiring_total 0", "fleet_metrics_updated_timestamp_seconds "}) {
    EXPECT_TRUE(Has(page, name)) << "missing " << name;
  }
  // Retire m2: the gauge shows it retiring, then its series go when it leaves.
  ASSERT_EQ(c.Ctl({"retire", "m2"}).exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return c.worker("m2").Wait(std::chrono::milliseconds(0)).has_value(); }));
  ASSERT_TRUE(WaitFor([&] {
    page = HttpGet(c.metrics());
    return !Has(page, "worker=\"m2\"") && Has(page, "fleet_blacklisted_workers 1");
  })) << page;
  EXPECT_TRUE(Has(page, "fleet_worker_idle_seconds{worker=\"m1\"}"));
  EXPECT_TRUE(Has(page, "fleet_workers_retired_total 1"));
}

TEST(MetricsTest, PromtoolAcceptsTheBrokerPage) {
  Cluster c;
  c.StartBroker();
  c.StartWorker("p1");
  auto s = c.Submit({"--count", "10"});
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  std::string page;
  ASSERT_TRUE(WaitFor([&] {
    page = HttpGet(c.metrics());
    return Has(page, "fleet_batches_submitted_total 10");
  }));
  std::string file = c.dir().File("metrics.txt");
  std::ofstream(file) << page;
  RunResult r = testing::Run({"/bin/sh", "-c", "promtool check metrics < " + file}, std::chrono::seconds(30),
                    c.dir().File("promtool.log"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace fleet::testing

namespace fleet::testing {
namespace {

TEST(MetricsTest, WorkerServesItsOwnMetricsThatPromtoolAccepts) {
  Cluster c;
  c.StartBroker();
  c.StartWorker("wm", {"--metrics", "127.0.0.1:0", "--concurrency", "3"});
  auto s = c.Submit({"--count", "20"});
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  // The worker logs where it serves.
  std::string url;
  ASSERT_TRUE(WaitFor([&] {
    std::string log = c.WorkerLog("wm");
    auto at = log.find("metrics on ");
    if (at == std::string::npos) return false;
    url = log.substr(at + 11, log.find('\n', at) - at - 11);
    return true;
  }));
  std::string page;
  ASSERT_TRUE(WaitFor([&] {
    page = HttpGet(url);
    return Has(page, "fleet_worker_batches_processed_total{outcome=\"ok\"} 20");
  })) << url << "\n" << page;
  EXPECT_TRUE(Has(page, "fleet_worker_slots 3"));
  EXPECT_TRUE(Has(page, "fleet_worker_busy_slots 0"));
  EXPECT_TRUE(Has(page, "fleet_worker_handler_seconds_count 20"));
  std::string file = c.dir().File("worker-metrics.txt");
  std::ofstream(file) << page;
  RunResult r = testing::Run({"/bin/sh", "-c", "promtool check metrics < " + file},
                             std::chrono::seconds(30), c.dir().File("promtool.log"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace fleet::testing

// /metrics behind basic auth (--metrics-auth-file), the bind address check,
// and nothing but /metrics served.
namespace fleet::testing {
namespace {

using std::chrono::seconds;

// The credentials file is "prom:s3cret pass"; these are base64 of
// "prom:s3cret pass", "prom:wrong" and "other:s3cret pass".
const std::string kRight = "Authorization: Basic cHJvbTpzM2NyZXQgcGFzcw==\r\n";
const std::string kWrongPassword = "Authorization: Basic cHJvbTp3cm9uZw==\r\n";
const std::string kWrongUser = "Authorization: Basic b3RoZXI6czNjcmV0IHBhc3M=\r\n";

std::string AuthFile(const TempDir& dir, const std::string& name, mode_t mode) {
  std::string path = dir.File(name);
  std::ofstream(path) << "prom:s3cret pass\n";
  chmod(path.c_str(), mode);
  return path;
}

// http://127.0.0.1:PORT + path, from a .../metrics URL.
std::string At(const std::string& metrics_url, const std::string& path) {
  return metrics_url.substr(0, metrics_url.rfind("/metrics")) + path;
}

TEST(MetricsAuthTest, BrokerServesMetricsOnlyToTheRightCredentialsAndLogsNoRequest) {
  Cluster c;
  c.StartBroker({"--metrics-auth-file", AuthFile(c.dir(), "metrics.auth", 0600)});
  ASSERT_FALSE(c.metrics().empty()) << c.BrokerLog();
  HttpReply none = HttpFetch(c.metrics());
  EXPECT_EQ(none.status, 401) << none.headers;
  EXPECT_THAT(none.headers, ::testing::HasSubstr("WWW-Authenticate: Basic"));
  EXPECT_EQ(none.body, "");
  EXPECT_EQ(HttpFetch(c.metrics(), kWrongPassword).status, 401);
  EXPECT_EQ(HttpFetch(c.metrics(), kWrongUser).status, 401);
  HttpReply right = HttpFetch(c.metrics(), kRight);
  EXPECT_EQ(right.status, 200) << right.headers;
  EXPECT_THAT(right.body, ::testing::HasSubstr("fleet_batches_inflight 0"));
  EXPECT_THAT(right.body, ::testing::HasSubstr("fleet_workers{state=\"idle\"} 0"));
  for (const char* path : {"/", "/metrics/", "/metrics/x", "/metricsx", "/favicon.ico"}) {
    EXPECT_EQ(HttpFetch(At(c.metrics(), path), kRight).status, 404) << path;
    EXPECT_EQ(HttpFetch(At(c.metrics(), path)).status, 404) << path;
  }
  // The start line says auth is on; no request, good or bad, is logged.
  std::string log = c.BrokerLog();
  EXPECT_THAT(log, ::testing::HasSubstr("/metrics (basic auth)"));
  // " 401" / "401 ": a status. The start line's ports may end in 401 (seen:
  // "backend tcp://127.0.0.1:46401 "), so the check skips that line.
  std::string after_start = log;
  const auto start_line = after_start.find("listening: ");
  if (start_line != std::string::npos) {
    after_start.erase(start_line, after_start.find('\n', start_line) - start_line);
  }
  EXPECT_THAT(after_start, ::testing::Not(::testing::HasSubstr(" 401")));
  EXPECT_THAT(after_start, ::testing::Not(::testing::HasSubstr("401 ")));
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("Unauthorized")));
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("prom")));
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("favicon")));
}

TEST(MetricsAuthTest, OpenBrokerServesMetricsAndAnswers404ToEveryOtherPath) {
  Cluster c;
  c.StartBroker();
  EXPECT_EQ(HttpFetch(c.metrics()).status, 200);
  for (const char* path : {"/", "/metrics/", "/metrics/x", "/metricsx", "/index.html"}) {
    EXPECT_EQ(HttpFetch(At(c.metrics(), path)).status, 404) << path;
  }
}

TEST(MetricsAuthTest, WorkerAndAutoscalerServeTheirOwnMetricsBehindAuthToo) {
  Cluster c;
  c.StartBroker();
  std::string auth = AuthFile(c.dir(), "metrics.auth", 0400);
  c.StartWorker("wa", {"--metrics", "127.0.0.1:0", "--metrics-auth-file", auth});
  Process scaler({Bin("fleet-autoscaler"), "--control", c.control(), "--metrics-source",
                  c.metrics(), "--min", "0", "--max", "1", "--id-prefix",
                  "auth-" + std::to_string(getpid()) + "-", "--metrics", "127.0.0.1:0",
                  "--metrics-auth-file", auth},
                 c.dir().File("autoscaler.log"));
  // Each logs where it serves: "metrics on URL" and "own metrics URL;".
  std::string worker_url, scaler_url;
  ASSERT_TRUE(WaitFor([&] {
    std::string log = c.WorkerLog("wa");
    auto at = log.find("metrics on ");
    if (at == std::string::npos) return false;
    worker_url = log.substr(at + 11, log.find('\n', at) - at - 11);
    return true;
  })) << c.WorkerLog("wa");
  ASSERT_TRUE(WaitFor([&] {
    std::string log = scaler.ReadLog();
    auto at = log.find("own metrics ");
    if (at == std::string::npos) return false;
    scaler_url = log.substr(at + 12, log.find(';', at) - at - 12);
    return true;
  })) << scaler.ReadLog();
  for (const std::string& url : {worker_url, scaler_url}) {
    EXPECT_EQ(HttpFetch(url).status, 401) << url;
    EXPECT_EQ(HttpFetch(url, kWrongPassword).status, 401) << url;
    EXPECT_EQ(HttpFetch(url, kRight).status, 200) << url;
    EXPECT_EQ(HttpFetch(At(url, "/"), kRight).status, 404) << url;
  }
  EXPECT_THAT(HttpFetch(worker_url, kRight).body, ::testing::HasSubstr("fleet_worker_slots 1"));
  EXPECT_THAT(HttpFetch(scaler_url, kRight).body,
              ::testing::HasSubstr("fleet_autoscaler_desired_workers"));
  scaler.Signal(SIGTERM);
  EXPECT_TRUE(scaler.Wait(seconds(30)).has_value());
}

// Each program refuses to start, with exit code 2 and a message naming the
// problem, on a bad --metrics value or credentials file.
TEST(MetricsAuthTest, ProgramsRefuseABadMetricsAddressOrAnAuthFileOthersCanRead) {
  TempDir dir;
  const std::string open_file = AuthFile(dir, "open.auth", 0644);
  const std::string good_file = AuthFile(dir, "good.auth", 0600);
  const std::string missing = dir.File("missing.auth");
  const std::vector<std::string> broker = {Bin("fleet-broker"), "--frontend", "tcp://127.0.0.1:*",
                                           "--backend", "tcp://127.0.0.1:*", "--control",
                                           "tcp://127.0.0.1:*"};
  const std::vector<std::string> worker = {Bin("fleet-worker"), "--broker", "tcp://127.0.0.1:1"};
  const std::vector<std::string> scaler = {Bin("fleet-autoscaler"), "--control",
                                           "tcp://127.0.0.1:1", "--metrics-source",
                                           "http://127.0.0.1:1/metrics"};
  struct Case {
    std::vector<std::string> program;
    std::vector<std::string> flags;
    std::vector<std::string> says;
  } cases[] = {
      {broker, {"--metrics", "127.0.0.1:0", "--metrics-auth-file", open_file},
       {open_file, "mode 0644", "chmod 600 " + open_file}},
      {broker, {"--metrics", "127.0.0.1:0", "--metrics-auth-file", missing}, {missing}},
      {broker, {"--metrics", "127.0.0.1"}, {"127.0.0.1", "ADDRESS:PORT"}},
      {broker, {"--metrics", "127.0.0.1:99999"}, {"not a port"}},
      {broker, {"--metrics", "", "--metrics-auth-file", good_file}, {"--metrics is off"}},
      {worker, {"--metrics", "127.0.0.1:0", "--metrics-auth-file", open_file},
       {open_file, "chmod 600"}},
      {worker, {"--metrics", "0.0.0.0"}, {"ADDRESS:PORT"}},
      {scaler, {"--metrics", "127.0.0.1:0", "--metrics-auth-file", open_file},
       {open_file, "chmod 600"}},
      {scaler, {"--metrics", "localhost"}, {"ADDRESS:PORT"}},
      {scaler, {"--metrics", "127.0.0.1:0", "--metrics-source-auth-file", open_file},
       {"--metrics-source-auth-file", open_file, "chmod 600"}},
  };
  int n = 0;
  for (const auto& c : cases) {
    std::vector<std::string> argv = c.program;
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    RunResult r = fleet::testing::Run(argv, seconds(20),
                                      dir.File("refused-" + std::to_string(n++) + ".log"));
    EXPECT_EQ(r.exit_code, 2) << argv[0] << " " << c.flags[1] << "\n" << r.output;
    for (const auto& s : c.says) {
      EXPECT_THAT(r.output, ::testing::HasSubstr(s)) << argv[0] << " " << c.flags[1];
    }
  }
}

}  // namespace
}  // namespace fleet::testing

// The broker's /metrics page: every name DESIGN.md promises, values that
// follow the work, per-worker series that leave with their worker, and a
// page promtool accepts.
#include <gtest/gtest.h>
#include <signal.h>

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

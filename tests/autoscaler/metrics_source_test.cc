#include "autoscaler/metrics_source.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "tests/support/http_server.h"

namespace fleet::autoscaler {
namespace {

const char* kBrokerPage = R"(# HELP fleet_queue_depth Batches waiting for a worker, per queue
# TYPE fleet_queue_depth gauge
fleet_queue_depth{queue="default"} 7
fleet_queue_depth{queue="images"} 3
# TYPE fleet_batches_inflight gauge
fleet_batches_inflight 5
# TYPE fleet_workers gauge
fleet_workers{state="retiring"} 1
fleet_workers{state="busy"} 1
fleet_workers{state="idle"} 1
# TYPE fleet_worker_idle_seconds gauge
fleet_worker_idle_seconds{worker="w1"} 0
fleet_worker_idle_seconds{worker="w2"} 12.5
fleet_worker_idle_seconds{worker="w3"} 3
# TYPE fleet_worker_held_batches gauge
fleet_worker_held_batches{worker="w1"} 2
fleet_worker_held_batches{worker="w2"} 0
fleet_worker_held_batches{worker="w3"} 0
# TYPE fleet_worker_retiring gauge
fleet_worker_retiring{worker="w1"} 0
fleet_worker_retiring{worker="w2"} 0
fleet_worker_retiring{worker="w3"} 1
# TYPE fleet_batches_submitted_total counter
fleet_batches_submitted_total 100
# TYPE fleet_batches_completed_total counter
fleet_batches_completed_total{outcome="ok"} 80
fleet_batches_completed_total{outcome="failed"} 5
# TYPE fleet_batch_processing_seconds histogram
fleet_batch_processing_seconds_bucket{le="+Inf"} 85
fleet_batch_processing_seconds_sum 42.5
fleet_batch_processing_seconds_count 85
)";

TEST(MetricsSourceTest, ObservationFromABrokerPage) {
  Observation obs = ObservationFromPage(prom::ParsePromText(kBrokerPage));
  ASSERT_TRUE(obs.fresh);
  EXPECT_EQ(obs.queued, 10);
  EXPECT_EQ(obs.inflight, 5);
  ASSERT_EQ(obs.workers.size(), 3u);
  EXPECT_EQ(obs.workers[0].id, "w1");
  EXPECT_EQ(obs.workers[0].state, BrokerWorkerState::kBusy);
  EXPECT_EQ(obs.workers[1].state, BrokerWorkerState::kIdle);
  EXPECT_DOUBLE_EQ(obs.workers[1].idle_seconds, 12.5);
  EXPECT_EQ(obs.workers[2].state, BrokerWorkerState::kRetiring);
  EXPECT_EQ(obs.submitted_total, 100);
  EXPECT_EQ(obs.completed_total, 85);
  EXPECT_DOUBLE_EQ(obs.processing_seconds_sum, 42.5);
  EXPECT_EQ(obs.processing_seconds_count, 85);
}

TEST(MetricsSourceTest, PageWithoutBrokerSeriesIsNotFresh) {
  EXPECT_FALSE(ObservationFromPage(prom::ParsePromText("up 1\n")).fresh);
  EXPECT_FALSE(ObservationFromPage(prom::ParsePromText("garbage{{{\n")).fresh);
}

TEST(MetricsSourceTest, UnreachableBrokerGivesAnErrorNotAnException) {
  ScrapeSource s("http://127.0.0.1:1/metrics", std::chrono::milliseconds(500));
  MetricsRead read = s.Read();
  EXPECT_FALSE(read.obs.fresh);
  EXPECT_FALSE(read.error.empty());
  EXPECT_FALSE(read.timed_out);  // refused at once: an error, not a timeout
}

TEST(MetricsSourceTest, SpecChoosesTheSource) {
  auto a = MakeMetricsSource("http://h:9750/metrics", std::chrono::milliseconds(1),
                             std::chrono::milliseconds(1));
  EXPECT_EQ(a->Describe(), "http://h:9750/metrics");
  auto b = MakeMetricsSource("prometheus:http://p:9090", std::chrono::milliseconds(1),
                             std::chrono::milliseconds(1));
  EXPECT_EQ(b->Describe(), "prometheus:http://p:9090");
  EXPECT_THROW(MakeMetricsSource("ftp://x", std::chrono::milliseconds(1),
                                 std::chrono::milliseconds(1)),
               std::invalid_argument);
}

}  // namespace
}  // namespace fleet::autoscaler

namespace fleet::autoscaler {
namespace {

TEST(MetricsSourceTest, PageLastRefreshedLongAgoIsStale) {
  std::string page = std::string(kBrokerPage) +
                     "# TYPE fleet_metrics_updated_timestamp_seconds gauge\n"
                     "fleet_metrics_updated_timestamp_seconds 1000\n";
  auto parsed = prom::ParsePromText(page);
  std::string error;
  // Refreshed 5 s before "now": fresh with a 10 s limit.
  EXPECT_TRUE(ObservationFromPage(parsed, 1005, std::chrono::milliseconds(10000), &error).fresh);
  // 60 s before: the broker's loop is stuck; not fresh, and it says why.
  Observation stale = ObservationFromPage(parsed, 1060, std::chrono::milliseconds(10000), &error);
  EXPECT_FALSE(stale.fresh);
  EXPECT_NE(error.find("60 s ago"), std::string::npos) << error;
}

}  // namespace
}  // namespace fleet::autoscaler

namespace fleet::autoscaler {
namespace {

using fleet::testing::Reply;
using fleet::testing::Request;
using fleet::testing::TestServer;

// base64("prom:s3cret pass")
const char* kRightAuth = "Basic cHJvbTpzM2NyZXQgcGFzcw==";

// Answers `body` to requests with the right credentials, 401 to the rest.
TestServer ProtectedServer(std::string body) {
  return TestServer([body](const Request& r) {
    auto it = r.headers.find("authorization");
    if (it == r.headers.end() || it->second != kRightAuth) {
      return Reply(401, "", "WWW-Authenticate: Basic realm=\"fleet metrics\"\r\n");
    }
    return Reply(200, body);
  });
}

TEST(MetricsSourceTest, ScrapeSourceSendsBasicAuthAndNamesTheFlagOn401) {
  TestServer server = ProtectedServer(kBrokerPage);
  ScrapeSource with(server.url() + "/metrics", std::chrono::milliseconds(5000),
                    std::chrono::milliseconds(10000), BasicAuth{"prom", "s3cret pass"});
  MetricsRead read = with.Read();
  EXPECT_TRUE(read.obs.fresh) << read.error;
  ScrapeSource wrong(server.url() + "/metrics", std::chrono::milliseconds(5000),
                     std::chrono::milliseconds(10000), BasicAuth{"prom", "wrong"});
  EXPECT_FALSE(wrong.Read().obs.fresh);
  ScrapeSource without(server.url() + "/metrics", std::chrono::milliseconds(5000));
  read = without.Read();
  EXPECT_FALSE(read.obs.fresh);
  EXPECT_NE(read.error.find("401"), std::string::npos) << read.error;
  EXPECT_NE(read.error.find("--metrics-source-auth-file"), std::string::npos) << read.error;
}

TEST(MetricsSourceTest, PrometheusSourceSendsBasicAuthWithEveryQuery) {
  // Every query gets one sample whose value is "now": fresh, and no workers.
  double now = std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
  std::string answer = R"({"status":"success","data":{"resultType":"vector","result":[)"
                       R"({"metric":{},"value":[)" + std::to_string(now) + R"(,")" +
                       std::to_string(now) + R"("]}]}})";
  TestServer server = ProtectedServer(answer);
  auto source = MakeMetricsSource("prometheus:" + server.url(), std::chrono::milliseconds(5000),
                                  std::chrono::milliseconds(60000),
                                  BasicAuth{"prom", "s3cret pass"});
  MetricsRead read = source->Read();
  EXPECT_TRUE(read.obs.fresh) << read.error;
  auto requests = server.requests();
  ASSERT_GT(requests.size(), 1u);
  for (const auto& r : requests) EXPECT_EQ(r.headers.at("authorization"), kRightAuth) << r.target;

  auto without = MakeMetricsSource("prometheus:" + server.url(), std::chrono::milliseconds(5000),
                                   std::chrono::milliseconds(60000));
  read = without->Read();
  EXPECT_FALSE(read.obs.fresh);
  EXPECT_NE(read.error.find("401"), std::string::npos) << read.error;
  EXPECT_NE(read.error.find("--metrics-source-auth-file"), std::string::npos) << read.error;
}

// A Prometheus answer to any query: one sample whose value is "now".
std::string NowAnswer() {
  double now = std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
  return R"({"status":"success","data":{"resultType":"vector","result":[)"
         R"({"metric":{},"value":[)" + std::to_string(now) + R"(,")" + std::to_string(now) +
         R"("]}]}})";
}

TEST(MetricsSourceTest, PrometheusQueriesShareOneDeadline) {
  // Each query is answered, but only after 40 % of the timeout: a timeout
  // per query would let the read's ten queries take four timeouts and
  // succeed. One deadline for the whole read cuts it at the third query.
  const auto timeout = std::chrono::milliseconds(500);
  TestServer server([timeout](const Request&) {
    std::this_thread::sleep_for(timeout * 2 / 5);  // the slow server, not a wait of the test
    return std::optional<std::string>(Reply(200, NowAnswer()));
  });
  PrometheusSource source(server.url(), timeout, std::chrono::milliseconds(60000));
  MetricsRead read = source.Read();
  EXPECT_FALSE(read.obs.fresh);
  EXPECT_TRUE(read.timed_out) << read.error;
  EXPECT_NE(read.error.find("--metrics-timeout"), std::string::npos) << read.error;
  EXPECT_LE(server.requests().size(), 3u);
}

TEST(MetricsSourceTest, ScrapeThatNeverAnswersTimesOutAndSaysSo) {
  TestServer server([](const Request&) { return std::optional<std::string>(); });
  ScrapeSource source(server.url() + "/metrics", std::chrono::milliseconds(200));
  MetricsRead read = source.Read();
  EXPECT_FALSE(read.obs.fresh);
  EXPECT_TRUE(read.timed_out);
  EXPECT_NE(read.error.find("--metrics-timeout"), std::string::npos) << read.error;
}

}  // namespace
}  // namespace fleet::autoscaler

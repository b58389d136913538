// The autoscaler's loop, turn by turn on a fake clock, against a slow
// world: a Docker engine that holds every container create (a busy engine
// takes 5-10 s per start; this one answers only when the test ends) and a
// metrics source that does not answer for the whole test (longer than the
// 12 s of the loop's time it runs). The loop must go on deciding once per
// poll, serve its own /metrics, count the one timed-out read, and start
// workers from the broker's control stats, all while both calls are still
// outstanding. Nothing here measures time: the fake clock jumps from one
// turn's due time to the next, and the slow calls are held, not slept.
#include "autoscaler/autoscaler.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <sstream>

#include "autoscaler/docker_launcher.h"
#include "tests/autoscaler/fake_docker_engine.h"
#include "tests/client/fake_router.h"
#include "tests/support/http_get.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace fleet::autoscaler {
namespace {

using client::testing::Received;
using client::testing::ThreadedRouter;

// A source whose reads answer only when released (at most 60 s later, so
// a loop that waits for one fails its test instead of hanging it).
class HeldSource : public MetricsSource {
 public:
  MetricsRead Read() override {
    std::unique_lock<std::mutex> lock(mu_);
    ++started_;
    cv_.wait_for(lock, std::chrono::seconds(60), [this] { return released_; });
    ++answered_;
    MetricsRead late;
    late.error = "answered late";
    return late;
  }
  std::string Describe() const override { return "held-source"; }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }
  int started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  int answered() {
    std::lock_guard<std::mutex> lock(mu_);
    return answered_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  int started_ = 0;
  int answered_ = 0;
};

// Sum of every series of `name` on a Prometheus text page.
double PageSum(const std::string& page, const std::string& name) {
  std::istringstream in(page);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

TEST(AutoscalerLoopTest, HeldStartsAndASilentMetricsSourceStopNeitherDecisionsNorItsMetrics) {
  fleet::testing::TempDir dir;
  testing::FakeDockerEngine engine(dir.path() + "/docker.sock");
  DockerOptions docker;
  docker.socket_path = dir.path() + "/docker.sock";
  docker.image = "fleet:test";
  docker.pool = "loop";
  docker.api_timeout = std::chrono::seconds(60);
  // The broker's control endpoint: 8 batches queued, every op accepted.
  zmq::context_t context(1);
  ThreadedRouter broker(context, [](const Received& r) {
    if (r.op == "stats") {
      proto::StatsReply stats;
      stats.request_id = r.request_id;
      stats.values = {{"queued", 8.0}};
      return std::vector<std::string>{proto::Encode(stats)};
    }
    proto::ControlReply ok{r.request_id, proto::ErrorCode::kOk, ""};
    return std::vector<std::string>{proto::Encode(ok)};
  });
  client::ControlClient::Options co;
  co.endpoint = broker.endpoint();
  client::ControlClient control(context, co);
  HeldSource source;
  AutoscalerMetrics metrics("127.0.0.1:0");
  ASSERT_FALSE(metrics.url().empty());

  AutoscalerOptions o;
  o.policy.poll = Seconds(1);
  o.metrics_timeout = Seconds(2);
  {
    DockerLauncher launcher(docker);
    engine.Hold("POST /v1.41/containers/create");
    Autoscaler scaler(o, "t", launcher, source, control, metrics);
    FakeClock clock;
    const TimePoint start = clock.Now();
    int turns = 0;
    while (clock.Now() - start < Seconds(12)) {
      const TimePoint due = scaler.Turn(clock.Now());
      ++turns;
      ASSERT_LT(turns, 1000) << "the loop does not move on";
      // Jump to the turn's due time (a finished read would wake it sooner;
      // none finishes here).
      clock.Advance(std::max<Duration>(due - clock.Now(), Millis(1)));
    }

    // Both slow calls went out (the threads that make them run on their
    // own schedule, hence the bounded wait) and are still unanswered: the
    // first create (held; the second waits behind it), the only read.
    ASSERT_TRUE(fleet::testing::WaitFor([&] {
      return engine.Matching("POST /v1.41/containers/create").size() == 1 &&
             source.started() == 1;
    }));
    EXPECT_EQ(engine.Answered("POST /v1.41/containers/create"), 0);
    EXPECT_EQ(source.answered(), 0);

    // Meanwhile: a decision every poll, on the page too.
    EXPECT_GE(scaler.decisions(), 11u);
    const std::string page = fleet::testing::HttpGet(metrics.url());
    ASSERT_FALSE(page.empty());
    EXPECT_EQ(PageSum(page, "fleet_autoscaler_decisions_total"),
              static_cast<double>(scaler.decisions()));
    // The read ran into its deadline once, and changed nothing.
    EXPECT_EQ(PageSum(page, "fleet_autoscaler_metric_source_timeouts_total"), 1);
    EXPECT_GE(PageSum(page, "fleet_autoscaler_metric_source_errors_total"), 1);
    EXPECT_FALSE(scaler.last_decision().trusted);
    // Scale-up from the broker's control stats: 8 queued / 4 per worker,
    // both launched (accepted by the launcher) and starting.
    EXPECT_EQ(PageSum(page, "fleet_autoscaler_workers_launched_total"), 2);
    EXPECT_EQ(scaler.pool().Counts().starting, 2);
    EXPECT_EQ(launcher.Alive().size(), 2u);
    EXPECT_TRUE(scaler.last_decision().retire.empty());

    // The world answers at last; the launcher and reader finish their calls.
    engine.Release();
    source.Release();
  }
  EXPECT_EQ(engine.Answered("POST /v1.41/containers/create"), 2);
  EXPECT_EQ(source.answered(), 1);
}

}  // namespace
}  // namespace fleet::autoscaler

#include "autoscaler/pool.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/clock.h"

namespace fleet::autoscaler {
namespace {

using std::chrono::milliseconds;

WorkerObs Idle(const std::string& id, double idle = 0) {
  return {id, BrokerWorkerState::kIdle, idle};
}

Observation Fresh(std::vector<WorkerObs> workers) {
  Observation obs;
  obs.fresh = true;
  obs.queued = 0;
  obs.inflight = 0;
  obs.workers = std::move(workers);
  return obs;
}

PoolOptions Opts() {
  PoolOptions o;
  o.id_prefix = "as-";
  return o;
}

TEST(PoolTrackerTest, LaunchGivesFreshIdsWithPrefixRunTagAndCounter) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r7");
  EXPECT_EQ(pool.Launch(clock.Now()), "as-r7-1");
  EXPECT_EQ(pool.Launch(clock.Now()), "as-r7-2");
  EXPECT_EQ(pool.Counts().starting, 2);
  EXPECT_EQ(pool.Counts().active(), 2);
  EXPECT_TRUE(pool.Owns("as-r7-1"));
  EXPECT_FALSE(pool.Owns("worker-1"));
}

TEST(PoolTrackerTest, StartingBecomesRunningWhenSeenAndMeasuresStartup) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  EXPECT_FALSE(pool.startup_measured());
  EXPECT_DOUBLE_EQ(pool.StartupSeconds(), 1.0);  // the default
  const std::string a = pool.Launch(clock.Now());
  clock.Advance(Seconds(2));
  ObserveResult r = pool.Observe(Fresh({Idle(a)}), clock.Now());
  EXPECT_EQ(r.registered, std::vector<std::string>{a});
  EXPECT_EQ(pool.Find(a)->state, PoolState::kRunning);
  EXPECT_DOUBLE_EQ(pool.StartupSeconds(), 2.0);
  // EWMA: 0.3 * 4 + 0.7 * 2.
  const std::string b = pool.Launch(clock.Now());
  clock.Advance(Seconds(4));
  pool.Observe(Fresh({Idle(a), Idle(b)}), clock.Now());
  EXPECT_NEAR(pool.StartupSeconds(), 2.6, 1e-9);
}

TEST(PoolTrackerTest, StartNotRegisteredWithinTimeoutIsReportedForKillAndCounted) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  clock.Advance(Seconds(29));
  EXPECT_TRUE(pool.Observe(Fresh({}), clock.Now()).timed_out.empty());
  clock.Advance(Seconds(1));
  ObserveResult r = pool.Observe(Fresh({}), clock.Now());
  EXPECT_EQ(r.timed_out, std::vector<std::string>{a});
  EXPECT_EQ(pool.Find(a)->state, PoolState::kStopping);
  EXPECT_EQ(pool.Counts().active(), 0);  // a stopping worker is not capacity
  EXPECT_EQ(pool.start_failures_total(), 1u);
  // Reaping it does not count it twice.
  EXPECT_TRUE(pool.Forget(a, clock.Now()));
  EXPECT_EQ(pool.start_failures_total(), 1u);
  EXPECT_EQ(pool.Find(a), nullptr);
}

TEST(PoolTrackerTest, StaleObservationNeitherRegistersNorTimesOut) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  clock.Advance(Seconds(60));
  Observation stale = Fresh({Idle(a)});
  stale.fresh = false;
  ObserveResult r = pool.Observe(stale, clock.Now());
  EXPECT_TRUE(r.timed_out.empty());
  EXPECT_TRUE(r.registered.empty());
  EXPECT_EQ(pool.Find(a)->state, PoolState::kStarting);
}

TEST(PoolTrackerTest, ConsecutiveStartFailuresBackOffExponentiallyUpToTheCap) {
  struct Case {
    int failures;
    double backoff_seconds;
  };
  const Case cases[] = {{1, 1}, {2, 2}, {3, 4}, {4, 8}, {6, 32}, {7, 60}, {20, 60}};
  for (const Case& c : cases) {
    FakeClock clock;
    PoolTracker pool(Opts(), "r");
    for (int i = 0; i < c.failures; ++i) pool.LaunchFailed(pool.Launch(clock.Now()), clock.Now());
    EXPECT_EQ(pool.consecutive_start_failures(), c.failures);
    EXPECT_DOUBLE_EQ(SecondsBetween(clock.Now(), pool.launch_allowed_at()), c.backoff_seconds)
        << c.failures << " failures";
    EXPECT_FALSE(pool.CanLaunch(clock.Now()));
    clock.Advance(
        std::chrono::duration_cast<Duration>(std::chrono::duration<double>(c.backoff_seconds)));
    EXPECT_TRUE(pool.CanLaunch(clock.Now()));
  }
}

TEST(PoolTrackerTest, SuccessfulRegistrationResetsTheBackoff) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  pool.LaunchFailed(pool.Launch(clock.Now()), clock.Now());
  pool.LaunchFailed(pool.Launch(clock.Now()), clock.Now());
  clock.Advance(Seconds(2));
  const std::string a = pool.Launch(clock.Now());
  clock.Advance(milliseconds(500));
  pool.Observe(Fresh({Idle(a)}), clock.Now());
  EXPECT_EQ(pool.consecutive_start_failures(), 0);
  EXPECT_TRUE(pool.CanLaunch(clock.Now()));
  EXPECT_EQ(pool.start_failures_total(), 2u);
}

TEST(PoolTrackerTest, WorkerThatExitsBeforeRegisteringCountsAsStartFailure) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  clock.Advance(milliseconds(100));
  EXPECT_TRUE(pool.Forget(a, clock.Now()));  // the launcher reaped a crash
  EXPECT_EQ(pool.start_failures_total(), 1u);
  EXPECT_FALSE(pool.CanLaunch(clock.Now()));
}

TEST(PoolTrackerTest, AdoptsWorkersWithItsPrefixAndCountsForeignOnes) {
  FakeClock clock;
  PoolTracker pool(Opts(), "new");
  ObserveResult r = pool.Observe(Fresh({Idle("as-old-1", 5),
                                        {"as-old-2", BrokerWorkerState::kRetiring, 9},
                                        {"manual-1", BrokerWorkerState::kBusy, 0},
                                        {"manual-2", BrokerWorkerState::kRetiring, 0}}),
                                 clock.Now());
  EXPECT_EQ(r.adopted, (std::vector<std::string>{"as-old-1", "as-old-2"}));
  ASSERT_NE(pool.Find("as-old-1"), nullptr);
  EXPECT_TRUE(pool.Find("as-old-1")->adopted);
  EXPECT_EQ(pool.Find("as-old-1")->state, PoolState::kRunning);
  EXPECT_EQ(pool.Find("as-old-2")->state, PoolState::kRetiring);
  const PoolCounts c = pool.Counts();
  EXPECT_EQ(c.running, 1);
  EXPECT_EQ(c.retiring, 1);
  EXPECT_EQ(c.foreign, 1);
  EXPECT_EQ(c.foreign_retiring, 1);
  EXPECT_EQ(c.active(), 2);  // as-old-1 + manual-1
  // Launches after adoption never collide with the adopted ids.
  EXPECT_EQ(pool.Launch(clock.Now()), "as-new-1");
}

TEST(PoolTrackerTest, WorkerGoneFromBrokerIsReportedAndForgotten) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  const std::string b = pool.Launch(clock.Now());
  pool.Observe(Fresh({Idle(a), Idle(b)}), clock.Now());
  pool.MarkRetiring(b, clock.Now());
  clock.Advance(Seconds(1));
  // Missing for less than vanish_after: a broker restart, perhaps; kept.
  ObserveResult r = pool.Observe(Fresh({}), clock.Now());
  EXPECT_TRUE(r.vanished.empty());
  EXPECT_EQ(pool.Counts().active(), 1);
  clock.Advance(Opts().vanish_after);
  r = pool.Observe(Fresh({}), clock.Now());
  EXPECT_EQ(r.vanished, (std::vector<std::string>{a, b}));
  EXPECT_EQ(pool.Counts().active(), 0);
  EXPECT_TRUE(pool.entries().empty());
}

TEST(PoolTrackerTest, WorkersBackAfterABrokerRestartAreKeptNotReplaced) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  pool.Observe(Fresh({Idle(a)}), clock.Now());
  clock.Advance(Seconds(2));
  ObserveResult r = pool.Observe(Fresh({}), clock.Now());  // new broker, nobody yet
  EXPECT_TRUE(r.vanished.empty());
  clock.Advance(Seconds(2));
  r = pool.Observe(Fresh({Idle(a)}), clock.Now());  // re-registered
  EXPECT_TRUE(r.vanished.empty());
  EXPECT_TRUE(r.adopted.empty());
  EXPECT_EQ(pool.Find(a)->state, PoolState::kRunning);
  clock.Advance(Opts().vanish_after);
  EXPECT_TRUE(pool.Observe(Fresh({Idle(a)}), clock.Now()).vanished.empty());
}

TEST(PoolTrackerTest, OwnRetireIsNotUndoneByLaggingMetricsButAnOperatorUnretireIsFollowed) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  pool.Observe(Fresh({Idle(a)}), clock.Now());
  pool.MarkRetiring(a, clock.Now());
  clock.Advance(Seconds(1));
  ObserveResult r = pool.Observe(Fresh({Idle(a)}), clock.Now());  // metrics a tick old
  EXPECT_EQ(pool.Find(a)->state, PoolState::kRetiring);
  EXPECT_TRUE(r.unretired.empty());
  clock.Advance(Opts().follow_holdoff);
  r = pool.Observe(Fresh({Idle(a)}), clock.Now());  // fleet-ctl unretired it
  EXPECT_EQ(pool.Find(a)->state, PoolState::kRunning);
  EXPECT_EQ(r.unretired, std::vector<std::string>{a});
}

TEST(PoolTrackerTest, ReapedIdIsNotReadoptedFromLaggingMetrics) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  pool.Observe(Fresh({Idle(a)}), clock.Now());
  pool.MarkRetiring(a, clock.Now());
  pool.Forget(a, clock.Now());  // drained, exited, reaped
  clock.Advance(Seconds(1));
  ObserveResult r = pool.Observe(Fresh({Idle(a)}), clock.Now());  // metrics a poll old
  EXPECT_TRUE(r.adopted.empty());
  EXPECT_EQ(pool.Counts().active(), 0);
  // After the memory expires the id would be adopted again.
  clock.Advance(Seconds(120));
  EXPECT_EQ(pool.Observe(Fresh({Idle(a)}), clock.Now()).adopted.size(), 1u);
}

TEST(PoolTrackerTest, FollowsRetireAndUnretireDoneByOthers) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  pool.Observe(Fresh({Idle(a)}), clock.Now());
  pool.Observe(Fresh({{a, BrokerWorkerState::kRetiring, 3}}), clock.Now());
  EXPECT_EQ(pool.Find(a)->state, PoolState::kRetiring);
  pool.Observe(Fresh({Idle(a)}), clock.Now());
  EXPECT_EQ(pool.Find(a)->state, PoolState::kRunning);
}

TEST(PoolTrackerTest, ListsRetiringWorkersPastTheirGrace) {
  FakeClock clock;
  PoolTracker pool(Opts(), "r");
  const std::string a = pool.Launch(clock.Now());
  const std::string b = pool.Launch(clock.Now());
  pool.Observe(Fresh({Idle(a), Idle(b)}), clock.Now());
  pool.MarkRetiring(a, clock.Now());
  clock.Advance(Seconds(5));
  pool.MarkRetiring(b, clock.Now());
  clock.Advance(Seconds(6));
  EXPECT_EQ(pool.RetiringLongerThan(Seconds(10), clock.Now()), std::vector<std::string>{a});
  EXPECT_TRUE(pool.MarkStopping(a));
  EXPECT_TRUE(pool.MarkUnretired(b, clock.Now()));
  EXPECT_TRUE(pool.RetiringLongerThan(Seconds(0), clock.Now()).empty());
  EXPECT_FALSE(pool.MarkRetiring("nope", clock.Now()));
}

}  // namespace
}  // namespace fleet::autoscaler

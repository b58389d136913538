#include "autoscaler/policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "autoscaler/pool.h"
#include "common/clock.h"

namespace fleet::autoscaler {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A broker as the policy sees it, a pool tracker and a fake clock, with the
// loop's bookkeeping (launch -> starting, retire -> retiring) applied.
class Harness {
 public:
  explicit Harness(PolicyOptions o = {}) : policy(o), pool(PoolOpts(), "t") {}

  static PoolOptions PoolOpts() {
    PoolOptions p;
    p.id_prefix = "as-";
    p.start_timeout = Seconds(1000);
    p.startup_ewma_alpha = 1.0;  // the start-up estimate is the last sample
    return p;
  }

  // Launches n workers and has them register idle for `idle` seconds.
  std::vector<std::string> AddRunning(int n, double idle = 0) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      ids.push_back(pool.Launch(clock.Now()));
      broker[ids.back()] = {ids.back(), BrokerWorkerState::kIdle, idle};
    }
    pool.Observe(Obs(), clock.Now());
    return ids;
  }

  Observation Obs() const {
    Observation o;
    o.fresh = fresh;
    o.queued = queued;
    o.inflight = inflight;
    if (fresh) {
      for (const auto& [id, w] : broker) o.workers.push_back(w);
    }
    o.submitted_total = submitted;
    o.processing_seconds_sum = psum;
    o.processing_seconds_count = pcount;
    o.control_queued = control;
    o.demand_queued = demand;
    return o;
  }

  // One poll: observe, decide, and apply the decision as the loop would
  // (launches stay starting until registered by hand).
  Decision Poll() {
    const Observation o = Obs();
    pool.Observe(o, clock.Now());
    Decision d = policy.Decide(o, pool, clock.Now());
    for (const std::string& id : d.unretire) {
      pool.MarkUnretired(id, clock.Now());
      broker[id].state = BrokerWorkerState::kIdle;
    }
    for (int i = 0; i < d.launch; ++i) pool.Launch(clock.Now());
    for (const std::string& id : d.retire) {
      pool.MarkRetiring(id, clock.Now());
      broker[id].state = BrokerWorkerState::kRetiring;
    }
    return d;
  }

  // Advances the clock; idle workers get that much idler.
  void Advance(double seconds) {
    clock.Advance(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds)));
    for (auto& [id, w] : broker) {
      if (w.state == BrokerWorkerState::kIdle) w.idle_seconds += seconds;
    }
  }

  // Polls once a second for `seconds`, returning the last decision.
  Decision PollFor(int seconds) {
    Decision d = Poll();
    for (int i = 1; i < seconds; ++i) {
      Advance(1);
      d = Poll();
    }
    return d;
  }

  FakeClock clock;
  Policy policy;
  PoolTracker pool;
  std::map<std::string, WorkerObs> broker;
  bool fresh = true;
  double queued = 0;
  double inflight = 0;
  double submitted = kNaN;
  double psum = kNaN;
  double pcount = kNaN;
  std::optional<double> control;
  std::optional<double> demand;  // the broker's wait-demand answer woke this poll
};

PolicyOptions Fast() {
  PolicyOptions o;
  o.idle = Seconds(10);
  o.cooldown = Seconds(5);
  o.stabilization = Seconds(20);
  return o;
}

TEST(PolicyTest, DesiredIsCeilOfLoadOverTargetClampedToMinMax) {
  struct Case {
    double queued, inflight;
    int min, max;
    double target;
    int desired;
  };
  const Case cases[] = {
      {0, 0, 0, 8, 4, 0},  {1, 0, 0, 8, 4, 1},    {4, 0, 0, 8, 4, 1}, {5, 0, 0, 8, 4, 2},
      {30, 7, 0, 8, 4, 8}, {30, 7, 0, 20, 4, 10}, {0, 0, 2, 8, 4, 2}, {1000, 0, 0, 3, 4, 3},
      {3, 3, 0, 8, 1, 6},  {0.5, 0, 0, 8, 4, 1},  {8, 0, 0, 8, 4, 2}, {1e6, 1e6, 1, 5, 4, 5},
  };
  for (const Case& c : cases) {
    PolicyOptions o;
    o.min_workers = c.min;
    o.initial_workers = c.min;
    o.max_workers = c.max;
    o.max_step = std::min(4, c.max);
    o.target_per_worker = c.target;
    Harness h(o);
    h.queued = c.queued;
    h.inflight = c.inflight;
    EXPECT_EQ(h.Poll().desired, c.desired) << c.queued << "+" << c.inflight << " in [" << c.min
                                           << "," << c.max << "] target " << c.target;
  }
}

TEST(PolicyTest, FromZeroAnyQueuedBatchStartsOneWorkerAtOnce) {
  Harness h;
  h.queued = 1;
  Decision d = h.Poll();
  EXPECT_EQ(d.action, "scale_up");
  EXPECT_EQ(d.launch, 1);
  EXPECT_EQ(d.desired, 1);
}

TEST(PolicyTest, TheBrokersDemandAnswerRaisesAStaleQueueDepthButNeverLowersIt) {
  {
    // The scrape predates the burst (or Prometheus has not scraped it yet).
    Harness h;
    h.queued = 0;
    h.demand = 9;
    Decision d = h.Poll();
    EXPECT_EQ(d.action, "scale_up");
    EXPECT_EQ(d.desired, 3);  // 9 queued, 4 per worker
    EXPECT_NE(d.reason.find("woken by the broker: 9 queued"), std::string::npos) << d.reason;
  }
  {
    // Metrics unreadable and no control depth: the answer alone sizes it.
    Harness h;
    h.fresh = false;
    h.queued = kNaN;
    h.demand = 2;
    EXPECT_EQ(h.Poll().launch, 1);
  }
  {
    // A fresher, larger read wins.
    Harness h;
    h.queued = 20;
    h.demand = 1;
    EXPECT_EQ(h.Poll().desired, 5);
  }
  {
    // Implausible answers are ignored.
    Harness h;
    h.demand = kInf;
    EXPECT_EQ(h.Poll().action, "hold");
  }
}

TEST(PolicyTest, ScalesUpAtMostMaxStepPerPollCountingStartingWorkers) {
  Harness h;  // max 8, step 4
  h.queued = 100;
  Decision d = h.Poll();
  EXPECT_EQ(d.launch, 4);
  EXPECT_NE(d.reason.find("max step 4"), std::string::npos) << d.reason;
  h.Advance(1);
  d = h.Poll();  // 4 still starting: they count
  EXPECT_EQ(d.pool, 4);
  EXPECT_EQ(d.starting, 4);
  EXPECT_EQ(d.launch, 4);
  h.Advance(1);
  d = h.Poll();  // 8 starting = max: nothing more, no overshoot
  EXPECT_EQ(d.pool, 8);
  EXPECT_EQ(d.launch, 0);
  EXPECT_EQ(d.action, "hold");
}

TEST(PolicyTest, SlowStartsAreNotLaunchedAgain) {
  Harness h;
  h.queued = 8;  // 2 workers
  EXPECT_EQ(h.Poll().launch, 2);
  for (int i = 0; i < 10; ++i) {
    h.Advance(1);
    EXPECT_EQ(h.Poll().launch, 0) << "poll " << i;
  }
}

TEST(PolicyTest, TakesBackRetiringWorkersBeforeLaunching) {
  Harness h(Fast());
  std::vector<std::string> ids = h.AddRunning(3, 100);
  for (const std::string& id : {ids[0], ids[1]}) {
    h.pool.MarkRetiring(id, h.clock.Now());
    h.broker[id].state = BrokerWorkerState::kRetiring;
  }
  h.queued = 4 * 6;  // 6 workers; the pool has 1 + 2 retiring
  Decision d = h.Poll();
  EXPECT_EQ(d.action, "scale_up");
  EXPECT_EQ(d.unretire.size(), 2u);
  EXPECT_EQ(d.launch, 3);
  EXPECT_EQ(d.reason_code, "demand");
}

TEST(PolicyTest, UnretireDoesNotCountAgainstMaxStepButIsBoundedByDesired) {
  PolicyOptions o = Fast();
  o.max_step = 1;
  Harness h(o);
  std::vector<std::string> ids = h.AddRunning(5, 100);
  for (const std::string& id : ids) {
    h.pool.MarkRetiring(id, h.clock.Now());
    h.broker[id].state = BrokerWorkerState::kRetiring;
  }
  h.queued = 4 * 3;
  Decision d = h.Poll();
  EXPECT_EQ(d.unretire.size(), 3u);
  EXPECT_EQ(d.launch, 0);
  EXPECT_EQ(d.reason_code, "unretire");
}

TEST(PolicyTest, DoesNotUnretireWorkersThatLeftTheBroker) {
  Harness h(Fast());
  std::vector<std::string> ids = h.AddRunning(1, 100);
  h.pool.MarkRetiring(ids[0], h.clock.Now());
  h.broker.clear();  // exited, not reaped yet
  Observation o = h.Obs();
  o.queued = 4;
  Decision d = h.policy.Decide(o, h.pool, h.clock.Now());
  EXPECT_TRUE(d.unretire.empty());
  EXPECT_EQ(d.launch, 1);
}

TEST(PolicyTest, StartFailureBackoffHoldsLaunches) {
  Harness h;
  h.pool.LaunchFailed(h.pool.Launch(h.clock.Now()), h.clock.Now());
  h.pool.LaunchFailed(h.pool.Launch(h.clock.Now()), h.clock.Now());  // 2 s backoff
  h.queued = 10;
  Decision d = h.Poll();
  EXPECT_EQ(d.launch, 0);
  EXPECT_EQ(d.action, "hold");
  EXPECT_EQ(d.reason_code, "start_backoff");
  h.Advance(2);
  EXPECT_EQ(h.Poll().launch, 3);
}

TEST(PolicyTest, ScaleDownWaitsForAWholeStabilizationWindow) {
  Harness h(Fast());  // idle 10, stabilization 20
  h.AddRunning(2, 100);
  Decision d = h.PollFor(20);  // t = 0 .. 19
  EXPECT_EQ(d.action, "hold");
  EXPECT_EQ(d.reason_code, "stabilizing");
  h.Advance(1);
  d = h.Poll();  // t = 20: a whole window of desired 0
  EXPECT_EQ(d.action, "scale_down");
  EXPECT_EQ(d.retire.size(), 2u);
}

TEST(PolicyTest, ScaleDownUsesTheHighestDesiredInTheWindow) {
  Harness h(Fast());
  h.AddRunning(4, 100);
  h.inflight = 0;
  h.queued = 12;  // desired 3 at t = 0
  h.Poll();
  h.queued = 0;
  h.Advance(1);
  Decision d = h.PollFor(20);  // t = 1 .. 20: window [0, 20] still holds the 3
  EXPECT_EQ(d.action, "scale_down");
  EXPECT_EQ(d.retire.size(), 1u) << d.reason;
  EXPECT_NE(d.reason.find("max desired in the last 20 s is 3"), std::string::npos) << d.reason;
}

TEST(PolicyTest, HoldsWhileDesiredWasAtThePoolWithinTheWindow) {
  Harness h(Fast());
  h.AddRunning(3, 100);
  h.PollFor(21);
  // Everything is retirable now; a spike to 3 then back resets the window.
  h.queued = 12;
  h.Advance(1);
  h.Poll();
  h.queued = 0;
  for (int i = 0; i < 20; ++i) {
    h.Advance(1);
    Decision d = h.Poll();
    ASSERT_TRUE(d.retire.empty()) << "t+" << i << ": " << d.reason;
    EXPECT_EQ(d.reason_code, "stabilizing");
  }
}

TEST(PolicyTest, CooldownSpacesScaleDowns) {
  PolicyOptions o = Fast();
  o.max_step_down = 1;
  Harness h(o);
  h.AddRunning(3, 100);
  h.Advance(0);
  Decision d = h.PollFor(21);
  ASSERT_EQ(d.retire.size(), 1u);
  for (int i = 1; i < 5; ++i) {
    h.Advance(1);
    d = h.Poll();
    EXPECT_EQ(d.reason_code, "cooldown") << i;
  }
  h.Advance(1);
  EXPECT_EQ(h.Poll().retire.size(), 1u);  // 5 s after the last one
}

// A pool that finished a burst goes idle over a few polls: the workers the
// scale-down meant to shed follow as they pass the idle threshold, within
// its cooldown, and never more than one step's worth.
TEST(PolicyTest, StragglersOfAScaleDownFollowWithinItsCooldownUpToTheStep) {
  PolicyOptions o = Fast();  // idle 10 s, cooldown 5 s, window 20 s
  o.max_step_down = 3;
  Harness h(o);
  std::vector<std::string> ids = h.AddRunning(5);
  for (auto& id : ids) h.broker[id].state = BrokerWorkerState::kBusy;
  h.PollFor(21);  // a whole window at desired 0, everyone busy
  // They finish 0.5 s apart: w0 first.
  for (std::size_t i = 0; i < ids.size(); ++i) {
    h.broker[ids[i]].state = BrokerWorkerState::kIdle;
    h.broker[ids[i]].idle_seconds = 10.0 - 0.5 * static_cast<double>(i);
  }
  Decision d = h.Poll();
  ASSERT_EQ(d.retire, std::vector<std::string>{ids[0]}) << d.reason;
  h.Advance(0.5);
  d = h.Poll();
  ASSERT_EQ(d.retire, std::vector<std::string>{ids[1]}) << d.reason;
  EXPECT_NE(d.reason.find("completing the scale-down"), std::string::npos) << d.reason;
  h.Advance(0.5);
  d = h.Poll();
  ASSERT_EQ(d.retire, std::vector<std::string>{ids[2]}) << d.reason;
  // The step of 3 is done: w3 and w4 wait for a whole cooldown after the
  // step's last retirement.
  for (int i = 0; i < 9; ++i) {
    h.Advance(0.5);
    d = h.Poll();
    EXPECT_TRUE(d.retire.empty()) << i << ": " << d.reason;
    EXPECT_EQ(d.reason_code, "cooldown") << i;
  }
  h.Advance(0.5);  // 5 s after the last retirement
  d = h.Poll();
  EXPECT_EQ(d.retire.size(), 2u) << d.reason;
}

// Stragglers retired late in the cooldown push the next step back: never
// more than one step's worth of retirements within one cooldown.
TEST(PolicyTest, ALateStragglerPushesTheNextScaleDownBack) {
  PolicyOptions o = Fast();  // cooldown 5 s
  o.stabilization = Seconds(0);
  o.max_step_down = 2;
  Harness h(o);
  std::vector<std::string> ids = h.AddRunning(4);
  h.broker[ids[0]].idle_seconds = 10;
  h.broker[ids[1]].idle_seconds = 5.2;
  h.broker[ids[2]].idle_seconds = 0.5;
  h.broker[ids[3]].idle_seconds = 0.5;
  ASSERT_EQ(h.Poll().retire, std::vector<std::string>{ids[0]});
  h.Advance(4.8);  // w1 passes 10 s just inside the cooldown
  ASSERT_EQ(h.Poll().retire, std::vector<std::string>{ids[1]});
  h.Advance(4.9);  // w2 and w3 idle long enough now, the step's window long over
  Decision d = h.Poll();
  EXPECT_TRUE(d.retire.empty()) << d.reason;
  EXPECT_EQ(d.reason_code, "cooldown");
  h.Advance(0.1);
  EXPECT_EQ(h.Poll().retire.size(), 2u);
}

// A scale-up in between cancels what was left of the scale-down.
TEST(PolicyTest, AScaleUpCancelsTheRestOfAScaleDown) {
  PolicyOptions o = Fast();
  o.stabilization = Seconds(0);
  Harness h(o);
  std::vector<std::string> ids = h.AddRunning(3);
  h.broker[ids[0]].idle_seconds = 10;
  h.broker[ids[1]].idle_seconds = 9;
  h.broker[ids[2]].idle_seconds = 9;
  ASSERT_EQ(h.Poll().retire.size(), 1u);
  h.queued = 30;  // a burst: back up
  h.Advance(0.5);
  ASSERT_EQ(h.Poll().action, "scale_up");
  h.queued = 0;
  h.Advance(1);
  Decision d = h.Poll();
  EXPECT_TRUE(d.retire.empty()) << d.reason;
  EXPECT_EQ(d.reason_code, "cooldown") << d.reason;
}

TEST(PolicyTest, RetiresOnlyWorkersIdlePastTheThresholdLongestIdleFirst) {
  Harness h(Fast());  // idle 10 s
  std::vector<std::string> ids = h.AddRunning(5);
  for (int i = 0; i < 21; ++i) {  // a whole window; nobody idle long enough
    ASSERT_TRUE(h.Poll().retire.empty());
    h.clock.Advance(Seconds(1));
  }
  const double idle[] = {15, 9.9, 40, 0, 10};
  for (int i = 0; i < 5; ++i) h.broker[ids[i]].idle_seconds = idle[i];
  h.broker[ids[3]].state = BrokerWorkerState::kBusy;
  h.inflight = 1;  // desired 1
  Observation o = h.Obs();
  h.pool.Observe(o, h.clock.Now());
  Decision d = h.policy.Decide(o, h.pool, h.clock.Now());
  EXPECT_EQ(d.retire, (std::vector<std::string>{ids[2], ids[0], ids[4]}));
}

TEST(PolicyTest, RetiresAtMostMaxStepDownPerPoll) {
  PolicyOptions o = Fast();
  o.max_step_down = 2;
  Harness h(o);
  h.AddRunning(6, 100);
  EXPECT_EQ(h.PollFor(21).retire.size(), 2u);
}

TEST(PolicyTest, NeverRetiresBelowMinOrMinSurvivors) {
  struct Case {
    int min, survivors, pool, left;
  };
  const Case cases[] = {{0, 0, 4, 0}, {2, 0, 4, 2}, {0, 1, 4, 1},
                        {1, 3, 4, 3}, {3, 1, 4, 3}, {0, 5, 4, 4}};
  for (const Case& c : cases) {
    PolicyOptions o = Fast();
    o.min_workers = c.min;
    o.min_survivors = c.survivors;
    o.initial_workers = c.min;
    Harness h(o);
    h.AddRunning(c.pool, 100);
    int left = c.pool;
    for (int i = 0; i < 100; ++i) {
      left -= static_cast<int>(h.Poll().retire.size());
      h.Advance(1);
    }
    EXPECT_EQ(left, c.left) << "min " << c.min << " survivors " << c.survivors;
  }
}

TEST(PolicyTest, StaleMetricsFreezeScaleDownButScaleUpWorksFromControlQueue) {
  Harness h(Fast());
  h.AddRunning(2, 100);
  h.PollFor(10);
  h.fresh = false;
  h.control = 0;
  for (int i = 0; i < 60; ++i) {
    h.Advance(1);
    Decision d = h.Poll();
    ASSERT_TRUE(d.retire.empty());
    EXPECT_EQ(d.reason_code, "stale_metrics");
    EXPECT_FALSE(d.trusted);
  }
  h.control = 20;  // 5 workers
  h.Advance(1);
  Decision d = h.Poll();
  EXPECT_EQ(d.action, "scale_up");
  EXPECT_EQ(d.launch, 3);
  // Fresh again and empty: a whole window must pass before any retire.
  h.fresh = true;
  h.control.reset();
  h.queued = 0;
  for (int i = 0; i < 19; ++i) {
    h.Advance(1);
    ASSERT_TRUE(h.Poll().retire.empty()) << i;
  }
}

TEST(PolicyTest, StaleMetricsWithoutControlQueueHold) {
  Harness h;
  h.fresh = false;
  Decision d = h.Poll();
  EXPECT_EQ(d.action, "hold");
  EXPECT_EQ(d.desired, 0);
  EXPECT_EQ(d.launch, 0);
}

TEST(PolicyTest, GarbageValuesStayWithinBoundsAndNeverRetire) {
  const double garbage[] = {kNaN, -1, -kInf, kInf, 1e300, 2e7};
  for (double g : garbage) {
    for (int which = 0; which < 2; ++which) {
      PolicyOptions o = Fast();
      o.min_workers = 1;
      o.max_workers = 5;
      o.initial_workers = 1;
      // Every worker is retirable; trusted inputs would retire down to 1.
      Harness g2(o);
      g2.AddRunning(3, 100);
      (which == 0 ? g2.queued : g2.inflight) = g;
      for (int i = 0; i < 40; ++i) {
        Decision d = g2.Poll();
        ASSERT_GE(d.desired, 1) << g;
        ASSERT_LE(d.desired, 5) << g;
        ASSERT_TRUE(d.retire.empty()) << g;
        ASSERT_EQ(d.launch, 0) << g;
        ASSERT_FALSE(d.trusted);
        g2.Advance(1);
      }
    }
  }
}

TEST(PolicyTest, GarbageControlQueueIsIgnored) {
  const double garbage[] = {kNaN, -3, kInf, 1e300};
  for (double g : garbage) {
    Harness h;
    h.fresh = false;
    h.control = g;
    Decision d = h.Poll();
    EXPECT_EQ(d.launch, 0) << g;
    EXPECT_EQ(d.desired, 0) << g;
  }
}

TEST(PolicyTest, WorkersWithGarbageIdleSecondsAreNeverRetired) {
  Harness h(Fast());
  std::vector<std::string> ids = h.AddRunning(3, 100);
  h.broker[ids[0]].idle_seconds = kNaN;
  h.broker[ids[1]].idle_seconds = -50;
  h.broker[ids[2]].idle_seconds = kInf;
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(h.Poll().retire.empty());
    h.clock.Advance(Seconds(1));  // idle values stay garbage
  }
}

TEST(PolicyTest, ForeignWorkersCountAsCapacityButAreNeverRetired) {
  Harness h(Fast());
  h.broker["manual-1"] = {"manual-1", BrokerWorkerState::kIdle, 1000};
  h.queued = 4;  // 1 worker: the foreign one covers it
  Decision d = h.Poll();
  EXPECT_EQ(d.pool, 1);
  EXPECT_EQ(d.launch, 0);
  h.queued = 0;
  for (int i = 0; i < 40; ++i) {
    h.Advance(1);
    ASSERT_TRUE(h.Poll().retire.empty());
  }
}

TEST(PolicyTest, AdoptedWorkersAreCountedAndRetirable) {
  Harness h(Fast());
  h.broker["as-old-1"] = {"as-old-1", BrokerWorkerState::kIdle, 1000};
  h.broker["as-old-2"] = {"as-old-2", BrokerWorkerState::kIdle, 1000};
  h.queued = 8;
  Decision d = h.Poll();
  EXPECT_EQ(d.pool, 2);  // no doubling after a restart
  EXPECT_EQ(d.launch, 0);
  h.queued = 0;
  h.Advance(1);
  d = h.PollFor(21);
  EXPECT_EQ(d.retire.size(), 2u);
}

TEST(PolicyTest, LaunchesInitialWorkersAtStartAndKeepsThemAWindow) {
  PolicyOptions o = Fast();
  o.initial_workers = 2;
  Harness h(o);
  Decision d = h.Poll();
  EXPECT_EQ(d.desired, 2);
  EXPECT_EQ(d.launch, 2);
}

TEST(PolicyTest, DecisionsCarryActionReasonAndInputs) {
  Harness h;
  h.AddRunning(4);
  h.queued = 35;
  h.inflight = 2;
  Decision d = h.Poll();
  EXPECT_EQ(d.action, "scale_up");
  EXPECT_DOUBLE_EQ(d.load, 37);
  EXPECT_NE(d.reason.find("backlog 37 queued+inflight needs 9.2 workers (target 4 per worker)"),
            std::string::npos)
      << d.reason;
  EXPECT_NE(d.reason.find("pool 4 (0 starting)"), std::string::npos) << d.reason;
}

// --- throughput policy ---------------------------------------------------

PolicyOptions Throughput() {
  PolicyOptions o = Fast();
  o.kind = PolicyKind::kThroughput;
  o.max_workers = 20;
  o.rate_window = Seconds(10);
  return o;
}

// Feeds counters for `seconds` polls: `rate` arrivals/s, each `s` seconds.
void Feed(Harness& h, double rate, double s, int seconds) {
  for (int i = 0; i < seconds; ++i) {
    h.submitted = (std::isnan(h.submitted) ? 0 : h.submitted) + rate;
    h.pcount = (std::isnan(h.pcount) ? 0 : h.pcount) + rate;
    h.psum = (std::isnan(h.psum) ? 0 : h.psum) + rate * s;
    h.Advance(1);
    h.Poll();
  }
}

TEST(ThroughputPolicyTest, SizesThePoolByLittlesLawPlusTheBacklogToDrain) {
  struct Case {
    double rate, s, queued;
    int desired;
  };
  // ceil(rate * s + queued * s / 10)
  const Case cases[] = {{4, 0.5, 0, 2}, {4, 0.5, 40, 4}, {10, 1, 0, 10},
                        {1, 0.2, 0, 1}, {0, 1, 30, 3},   {100, 1, 0, 20}};
  for (const Case& c : cases) {
    Harness h(Throughput());
    h.AddRunning(20, 0);  // large enough that no launch is needed
    h.queued = c.queued;
    Feed(h, c.rate, c.s, 10);
    EXPECT_EQ(h.Poll().desired, c.desired) << c.rate << "/s x " << c.s << " s + " << c.queued;
  }
}

TEST(ThroughputPolicyTest, WithoutARateTakesTheMoreOfDefaultProcessingAndBacklogSizing) {
  struct Case {
    double target_per_worker;
    int desired;
  };
  // 30 queued: default 1 s -> 30 * 1 / 10 = 3; backlog 30 / target.
  const Case cases[] = {{4, 8}, {20, 3}, {5, 6}};
  for (const Case& c : cases) {
    PolicyOptions o = Throughput();
    o.target_per_worker = c.target_per_worker;
    Harness h(o);
    h.queued = 30;
    Decision d = h.Poll();
    EXPECT_DOUBLE_EQ(d.processing_seconds, 1.0);
    EXPECT_EQ(d.desired, c.desired) << c.target_per_worker;
  }
}

TEST(ThroughputPolicyTest, CounterResetRestartsTheRateWindow) {
  Harness h(Throughput());
  h.AddRunning(20);
  Feed(h, 10, 1, 10);
  EXPECT_EQ(h.Poll().desired, 10);
  h.submitted = 3;  // the broker restarted
  h.pcount = 3;
  h.psum = 3;
  h.Advance(1);
  Decision d = h.Poll();
  EXPECT_DOUBLE_EQ(d.arrival_rate, 0);  // no rate until the window refills
}

// A burst ends: the window's average still says 10/s, but no arrival for
// lambda * t >= 3 means the stream stopped, and the pool is sized without it.
TEST(ThroughputPolicyTest, AStreamThatStoppedNoLongerHoldsWorkers) {
  Harness h(Throughput());
  h.AddRunning(20);
  Feed(h, 10, 1, 10);
  ASSERT_EQ(h.Poll().desired, 10);
  // 0.2 s later, 2 arrivals are expected and none came: not yet conclusive.
  h.Advance(0.2);
  Decision d = h.Poll();
  EXPECT_EQ(d.desired, 10) << d.reason;
  EXPECT_GT(d.arrival_rate, 0);
  // 0.4 s without one (4 expected): stopped.
  h.Advance(0.2);
  d = h.Poll();
  EXPECT_EQ(d.desired, 0) << d.reason;
  EXPECT_DOUBLE_EQ(d.arrival_rate, 0);
  EXPECT_NE(d.reason.find("stream stopped"), std::string::npos) << d.reason;
  // Arrivals again: the rate counts at once.
  Feed(h, 10, 1, 1);
  EXPECT_EQ(h.Poll().desired, 10);
}

TEST(ThroughputPolicyTest, DoesNotLaunchAWorkerThatWouldArriveAfterTheBacklogDrained) {
  Harness h(Throughput());
  h.AddRunning(2);
  // Measured start-up: 5 s.
  const std::string slow = h.pool.Launch(h.clock.Now());
  h.Advance(5);
  h.broker[slow] = {slow, BrokerWorkerState::kIdle, 0};
  h.pool.Observe(h.Obs(), h.clock.Now());
  ASSERT_DOUBLE_EQ(h.pool.StartupSeconds(), 5);
  Feed(h, 1, 1, 10);  // 1/s x 1 s: the pool of 3 gains 2 batches/s on the queue
  h.inflight = 3;
  h.queued = 9;  // need max(1, 3) + 9 * 1 / 10 = 3.9 -> 4; drains in 9 / 2 = 4.5 s < 5 s
  Decision d = h.Poll();
  EXPECT_EQ(d.desired, 4);
  EXPECT_EQ(d.launch, 0);
  EXPECT_EQ(d.reason_code, "drains_before_start") << d.reason;
  h.queued = 40;  // 20 s to drain: worth a start
  EXPECT_GT(h.Poll().launch, 0);
}

TEST(ThroughputPolicyTest, LaunchesFromZeroEvenWithALongStartup) {
  Harness h(Throughput());
  h.pool.LaunchFailed(h.pool.Launch(h.clock.Now()), h.clock.Now());
  h.Advance(1);  // backoff over; no start-up measured: the 1 s default
  h.queued = 1;
  EXPECT_EQ(h.Poll().launch, 1);
}

TEST(ThroughputPolicyTest, KeepsWorkersWhoseIdleGapIsShorterThanTheirStartup) {
  Harness h(Throughput());
  std::vector<std::string> ids = h.AddRunning(4, 100);
  // Start-up measured at 10 s.
  const std::string slow = h.pool.Launch(h.clock.Now());
  h.Advance(10);
  h.broker[slow] = {slow, BrokerWorkerState::kIdle, 100};
  h.pool.Observe(h.Obs(), h.clock.Now());
  // 1 arrival/s of 10 ms: needs 1 worker, but a worker of 5 gets one every
  // 5 s < 10 s start-up.
  Feed(h, 1, 0.01, 30);
  Decision d = h.Poll();
  EXPECT_EQ(d.desired, 1);
  EXPECT_TRUE(d.retire.empty());
  EXPECT_EQ(d.reason_code, "gap_below_startup") << d.reason;
  // Arrivals stop: the gap is unbounded, retiring goes ahead.
  Decision last;
  for (int i = 0; i < 30 && last.retire.empty(); ++i) {
    h.Advance(1);
    last = h.Poll();
  }
  EXPECT_FALSE(last.retire.empty());
}

// --- options -------------------------------------------------------------

TEST(PolicyOptionsTest, RejectsOutOfRangeValues) {
  struct Case {
    const char* name;
    void (*set)(PolicyOptions&);
  };
  const Case cases[] = {
      {"max 0", [](PolicyOptions& o) { o.max_workers = 0; }},
      {"min > max", [](PolicyOptions& o) { o.min_workers = 9; }},
      {"initial < min", [](PolicyOptions& o) { o.min_workers = 2; }},
      {"target 0", [](PolicyOptions& o) { o.target_per_worker = 0; }},
      {"target NaN", [](PolicyOptions& o) { o.target_per_worker = kNaN; }},
      {"step 0", [](PolicyOptions& o) { o.max_step = 0; }},
      {"step > max", [](PolicyOptions& o) { o.max_step = 9; }},
      {"step down 0", [](PolicyOptions& o) { o.max_step_down = 0; }},
      {"idle 0", [](PolicyOptions& o) { o.idle = Seconds(0); }},
      {"cooldown < 0", [](PolicyOptions& o) { o.cooldown = Seconds(-1); }},
      {"survivors > max", [](PolicyOptions& o) { o.min_survivors = 9; }},
      {"poll 10 ms", [](PolicyOptions& o) { o.poll = Millis(10); }},
      {"rate window < 2 polls", [](PolicyOptions& o) { o.rate_window = Millis(1500); }},
  };
  for (const Case& c : cases) {
    PolicyOptions o;
    c.set(o);
    EXPECT_THROW(o.Validate(), std::invalid_argument) << c.name;
    EXPECT_THROW(Policy{o}, std::invalid_argument) << c.name;
  }
  EXPECT_NO_THROW(PolicyOptions{}.Validate());
}

TEST(PolicyOptionsTest, ParsesPolicyKinds) {
  EXPECT_EQ(ParsePolicyKind("backlog"), PolicyKind::kBacklog);
  EXPECT_EQ(ParsePolicyKind("throughput"), PolicyKind::kThroughput);
  EXPECT_FALSE(ParsePolicyKind("fast").has_value());
  EXPECT_STREQ(PolicyKindName(PolicyKind::kThroughput), "throughput");
}

}  // namespace
}  // namespace fleet::autoscaler

#include "autoscaler/simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fleet::autoscaler {
namespace {

double Secs(Duration d) { return std::chrono::duration<double>(d).count(); }

SimOptions Options(PolicyKind kind) {
  SimOptions o;
  o.policy.kind = kind;
  return o;  // defaults: max 8, step 4, idle 60, cooldown 30, stabilization 60, poll 1 s
}

struct TraceCase {
  const char* trace;
  int max_flaps;
};

// Every built-in trace under both policies: the figures the issue asks for.
class SimulatorTraceTest : public testing::TestWithParam<std::tuple<TraceCase, PolicyKind>> {};

TEST_P(SimulatorTraceTest, HoldsThePolicyToItsFigures) {
  const auto& [c, kind] = GetParam();
  const SimOptions o = Options(kind);
  const SimReport r = Simulate(BuiltinTrace(c.trace), o);
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.completed, r.batches);
  EXPECT_EQ(r.retired_while_holding, 0);
  EXPECT_LE(r.flaps, c.max_flaps);
  EXPECT_LE(r.overshoot, o.policy.max_step);
  EXPECT_LE(r.peak_pool, o.policy.max_workers);
  // Back at min within idle + cooldown + stabilization + a few polls.
  ASSERT_FALSE(std::isnan(r.scale_down_seconds));
  EXPECT_LE(r.scale_down_seconds,
            Secs(o.policy.idle) + Secs(o.policy.cooldown) + Secs(o.policy.stabilization) + 5);
  // Reaction: a start-up plus at most a poll and a tick.
  ASSERT_GE(r.reactions, 1);
  EXPECT_LE(r.reaction_seconds, o.startup_seconds + Secs(o.policy.poll) + 0.02);
}

INSTANTIATE_TEST_SUITE_P(
    Traces, SimulatorTraceTest,
    testing::Combine(testing::Values(TraceCase{"burst", 1}, TraceCase{"steady", 2},
                                     TraceCase{"sawtooth", 6},
                                     TraceCase{"burst-after-scale-down", 3},
                                     TraceCase{"step-down", 3}),
                     testing::Values(PolicyKind::kBacklog, PolicyKind::kThroughput)),
    [](const auto& info) {
      std::string name = std::string(std::get<0>(info.param).trace) + "_" +
                         PolicyKindName(std::get<1>(info.param));
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name;
    });

TEST(SimulatorTest, BurstScalesUpInStepsWithoutOvershootAndReactsInOneStartup) {
  const SimReport r = Simulate(BurstTrace(200, 5, 0.5), Options(PolicyKind::kBacklog));
  EXPECT_EQ(r.launches, 8);  // 4 + 4, never more than max
  EXPECT_EQ(r.peak_pool, 8);
  EXPECT_EQ(r.overshoot, 0);
  EXPECT_DOUBLE_EQ(r.reaction_seconds, 2.0);  // burst at a poll; start-up 2 s
  // 100 worker-seconds of work on 8 workers: 12.5 s + start-up + ramp.
  EXPECT_LE(r.makespan_seconds, 16);
}

TEST(SimulatorTest, SteadyTraceKeepsQueueWaitLow) {
  for (PolicyKind kind : {PolicyKind::kBacklog, PolicyKind::kThroughput}) {
    const SimReport r = Simulate(SteadyTrace(4, 180, 0.5), Options(kind));
    SCOPED_TRACE(r.ToKeyValues());
    EXPECT_LE(r.p95_wait_seconds, 0.5);
    EXPECT_LE(r.peak_pool, 6);  // lambda * S = 2; noise and the cold start
  }
}

TEST(SimulatorTest, BurstRightAfterScaleDownTakesRetiringWorkersBack) {
  const SimReport r =
      Simulate(BurstAfterScaleDownTrace(100, 0.5, 0.5), Options(PolicyKind::kBacklog));
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.completed, 200);
  EXPECT_GE(r.unretires, 1);
  EXPECT_EQ(r.launches, 8);  // the second burst cold-started nobody
  EXPECT_EQ(r.retired_while_holding, 0);
  EXPECT_LE(r.reaction_max_seconds, 2.0 + 1.02);
}

// The pool size each decision saw (starting + running), by time.
struct PoolSeries {
  std::vector<std::pair<double, int>> points;
  // First time >= `from` at which the pool was <= `most`; NaN if never.
  double FirstAtMost(double from, int most) const {
    for (const auto& [t, pool] : points) {
      if (t >= from && pool <= most) return t;
    }
    return std::nan("");
  }
  // Largest and smallest pool seen in [from, to).
  int Max(double from, double to) const {
    int m = -1;
    for (const auto& [t, pool] : points) {
      if (t >= from && t < to) m = std::max(m, pool);
    }
    return m;
  }
  int Min(double from, double to) const {
    int m = 1 << 30;
    for (const auto& [t, pool] : points) {
      if (t >= from && t < to) m = std::min(m, pool);
    }
    return m;
  }
};

SimOptions Recording(SimOptions o, PoolSeries* series) {
  o.on_decision = [series](double t, const Decision& d) { series->points.emplace_back(t, d.pool); };
  return o;
}

constexpr double kHigh = 6;       // workers' worth of load before the step
constexpr int kLow = 2;           // ... and after it
constexpr double kStepAt = 120;   // seconds
constexpr double kLowFor = 180;   // seconds of low load

TEST(SimulatorTest, PackedDispatchFollowsAStepDownWithinIdlePlusStabilizationPlusAPoll) {
  const SimOptions base = Options(PolicyKind::kBacklog);
  ASSERT_EQ(base.dispatch, DispatchOrder::kMostRecent);  // the default: the broker packs
  PoolSeries pool;
  const SimReport r =
      Simulate(StepDownTrace(kHigh, kLow, kStepAt, kLowFor, 0.5), Recording(base, &pool));
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.completed, r.batches);
  EXPECT_EQ(r.retired_while_holding, 0);
  EXPECT_EQ(r.retire_refused, 0);  // packed: the idle ones really are idle
  // Before the step the pool carries the high load.
  EXPECT_GE(pool.Max(kStepAt - 10, kStepAt), static_cast<int>(kHigh));
  const double bound =
      Secs(base.policy.idle) + Secs(base.policy.stabilization) + Secs(base.policy.poll);
  const double reached = pool.FirstAtMost(kStepAt, kLow + 1);
  ASSERT_FALSE(std::isnan(reached)) << "the pool never followed the load down";
  EXPECT_LE(reached - kStepAt, bound);
  // And it stays there while the low load lasts, without starving it.
  EXPECT_LE(pool.Max(reached, kStepAt + kLowFor), kLow + 1);
  EXPECT_GE(pool.Min(reached, kStepAt + kLowFor), kLow);
}

TEST(SimulatorTest, RoundRobinDispatchKeepsEveryWorkerBusyEnoughNeverToShrinkOnAStepDown) {
  // The contrast: the older broker's order hands the low load to every
  // worker in turn, so none is ever idle for --idle-seconds.
  SimOptions o = Options(PolicyKind::kBacklog);
  o.dispatch = DispatchOrder::kRoundRobin;
  PoolSeries pool;
  const SimReport r =
      Simulate(StepDownTrace(kHigh, kLow, kStepAt, kLowFor, 0.5), Recording(o, &pool));
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.completed, r.batches);
  EXPECT_EQ(r.retired_while_holding, 0);
  EXPECT_GT(pool.Min(kStepAt, kStepAt + kLowFor), static_cast<int>(kHigh) - 1);
}

TEST(SimulatorTest, SteadyLoadAtHalfThePoolsCapacitySettlesAtNeededPlusOne) {
  SimOptions o = Options(PolicyKind::kBacklog);
  o.policy.initial_workers = o.policy.max_workers;  // 8 workers ...
  const double needed = o.policy.max_workers / 2.0;  // ... for 4 workers' worth
  const double seconds = 300;
  PoolSeries pool;
  const SimReport r = Simulate(EvenTrace(needed, seconds, 0.5), Recording(o, &pool));
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.completed, r.batches);
  EXPECT_EQ(r.retired_while_holding, 0);
  // Settled: from idle + stabilization + a start-up and a poll on (the
  // initial pool registers after a start-up) to the end of the load.
  const double settled = Secs(o.policy.idle) + Secs(o.policy.stabilization) +
                         o.startup_seconds + Secs(o.policy.poll);
  EXPECT_LE(pool.Max(settled, seconds), static_cast<int>(needed) + 1);
  EXPECT_GE(pool.Min(settled, seconds), static_cast<int>(needed));
  EXPECT_LE(r.p95_wait_seconds, 0.5);
}

TEST(SimulatorTest, StartFailuresBackOffAndTheTraceStillCompletes) {
  SimOptions o = Options(PolicyKind::kBacklog);
  o.pool.start_timeout = Seconds(5);
  o.failing_starts = 6;
  const SimReport r = Simulate(BurstTrace(100, 5, 0.5), o);
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.start_failures, 6);
  EXPECT_EQ(r.completed, 100);
  EXPECT_EQ(r.retired_while_holding, 0);
  // 6 hung starts are bounded by max: never more than max live at once.
  EXPECT_LE(r.peak_pool, o.policy.max_workers);
}

TEST(SimulatorTest, LaggingMetricsNeverRetireABusyWorker) {
  SimOptions o = Options(PolicyKind::kBacklog);
  o.metrics_lag_polls = 3;
  o.policy.idle = Seconds(2);
  o.policy.cooldown = Seconds(1);
  o.policy.stabilization = Seconds(2);
  const SimReport r = Simulate(SawtoothTrace(3, 12, 30, 6, 0.5), o);
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.completed, r.batches);
  EXPECT_EQ(r.retired_while_holding, 0);
}

TEST(SimulatorTest, MetricsOutageFreezesScaleDownButNotScaleUp) {
  SimOptions o = Options(PolicyKind::kBacklog);
  o.outage_from = 0;
  o.outage_to = 100;  // the whole burst happens while metrics are down
  int retires_while_stale = 0;
  int launches_while_stale = 0;
  o.on_decision = [&](double, const Decision& d) {
    if (d.trusted) return;
    retires_while_stale += static_cast<int>(d.retire.size());
    launches_while_stale += d.launch;
  };
  const SimReport r = Simulate(BurstTrace(100, 5, 0.5), o);
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(retires_while_stale, 0);
  EXPECT_GT(launches_while_stale, 0);  // from the control API's queue depth
  EXPECT_EQ(r.completed, 100);
  EXPECT_FALSE(std::isnan(r.scale_down_seconds));
}

TEST(SimulatorTest, IsDeterministic) {
  for (const char* trace : {"steady", "sawtooth"}) {
    const SimOptions o = Options(PolicyKind::kThroughput);
    EXPECT_EQ(Simulate(BuiltinTrace(trace), o).ToKeyValues(),
              Simulate(BuiltinTrace(trace), o).ToKeyValues());
  }
}

TEST(SimulatorTest, MinWorkersAreKeptAndNeverRetired) {
  SimOptions o = Options(PolicyKind::kBacklog);
  o.policy.min_workers = 2;
  o.policy.initial_workers = 2;
  const SimReport r = Simulate(BurstTrace(100, 5, 0.5), o);
  SCOPED_TRACE(r.ToKeyValues());
  EXPECT_EQ(r.retires, r.launches - 2);
  EXPECT_FALSE(std::isnan(r.scale_down_seconds));
}

TEST(SimulatorTest, ParsesCsvTraces) {
  std::istringstream in(
      "arrival_seconds,processing_seconds\n"
      "# a comment\n"
      "2.5,0.25\n"
      "1\n"
      "\n"
      "3, 1.5  # trailing comment\n");
  const Trace t = ParseCsvTrace(in, 0.75);
  ASSERT_EQ(t.arrivals.size(), 3u);
  EXPECT_DOUBLE_EQ(t.arrivals[0].at, 1);
  EXPECT_DOUBLE_EQ(t.arrivals[0].processing, 0.75);
  EXPECT_DOUBLE_EQ(t.arrivals[1].at, 2.5);
  EXPECT_DOUBLE_EQ(t.arrivals[1].processing, 0.25);
  EXPECT_DOUBLE_EQ(t.arrivals[2].processing, 1.5);
  const SimReport r = Simulate(t, Options(PolicyKind::kBacklog));
  EXPECT_EQ(r.completed, 3);
}

TEST(SimulatorTest, RejectsBadCsvLinesAndUnknownTraces) {
  const char* bad[] = {"1\nabc\n", "-1,0.5\n", "1,nan\n", "1,-2\n"};
  for (const char* text : bad) {
    std::istringstream in(text);
    EXPECT_THROW(ParseCsvTrace(in, 0.5), std::runtime_error) << text;
  }
  EXPECT_THROW(BuiltinTrace("tsunami"), std::invalid_argument);
  EXPECT_EQ(BuiltinTrace("step-down").name, "step-down");
}

TEST(SimulatorTest, RejectsATickThatDoesNotDivideThePoll) {
  SimOptions o = Options(PolicyKind::kBacklog);
  o.tick = Millis(300);
  EXPECT_THROW(Simulate(BurstTrace(1), o), std::invalid_argument);
}

}  // namespace
}  // namespace fleet::autoscaler

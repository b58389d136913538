// Simulator: a deterministic discrete-time simulation that drives the real
// PoolTracker and Policy on a fake clock against a simulated broker, to
// hold policies to figures (flaps, worker-seconds, queue wait, reaction and
// scale-down times) on synthetic or recorded traces.
//
// The simulated broker mirrors fleet-broker's semantics: a FIFO queue;
// workers pull with `concurrency` slots; dispatch packs (DispatchOrder::
// kMostRecent, the default): a batch goes to the worker that most recently
// had work and still has a free slot, so under partial load the surplus
// workers stay idle and can be retired (kRoundRobin, the slot ready longest
// first, is the older broker's order, kept as the contrast); idle seconds count from the last finish (or registration); retire-if-idle
// is refused while the worker holds a batch; a retired idle worker exits
// after `drain_seconds`, and can be unretired until then. The loop around
// the policy mirrors the autoscaler's: observe, kill timed-out starts,
// decide, unretire, launch, retire.
//
// Pure: no threads, no real clock, no randomness beyond seeded traces.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "autoscaler/policy.h"
#include "autoscaler/pool.h"

namespace fleet::autoscaler {

struct Arrival {
  double at = 0;          // seconds from the start of the simulation
  double processing = 0;  // seconds one worker slot spends on it
};

struct Trace {
  std::string name;
  std::vector<Arrival> arrivals;  // sorted by `at`
  // Arrivals whose `at` counts from the first retire the broker accepts
  // (a burst that lands while workers are draining). Never arrive if no
  // retire happens.
  std::vector<Arrival> after_first_retire;
};

// Built-in traces. Deterministic: the same arguments give the same trace.
// `count` batches at `at` seconds.
Trace BurstTrace(int count = 200, double at = 5, double processing = 0.5);
// Poisson arrivals at `rate` per second for `seconds`, from a seeded
// generator (its own arithmetic, not <random>'s distributions, so the trace
// is the same on every standard library).
Trace SteadyTrace(double rate = 4, double seconds = 180, double processing = 0.5,
                  unsigned seed = 1);
// `cycles` of: the rate ramps linearly from 0 to `peak_rate` over
// `ramp_seconds`, then nothing for `gap_seconds`.
Trace SawtoothTrace(int cycles = 3, double peak_rate = 12, double ramp_seconds = 60,
                    double gap_seconds = 30, double processing = 0.5);
// A burst; then, `offset` seconds after the first retire, a second burst.
Trace BurstAfterScaleDownTrace(int count = 100, double processing = 0.5, double offset = 0.5);
// `workers` workers' worth of load (evenly spaced arrivals at
// workers / processing per second, so exactly that many batches are in
// flight once the pool has caught up) from `from` for `seconds`.
Trace EvenTrace(double workers, double seconds, double processing = 0.5, double from = 0);
// Evenly spaced load of `high_workers` workers' worth for `high_seconds`,
// then a step down to `low_workers` workers' worth for `low_seconds`: the
// pool must follow the load down (with packed dispatch) to about
// `low_workers`. Evenly spaced so that "k workers' worth" means exactly k
// batches in flight, not a Poisson mean whose peaks touch more workers.
Trace StepDownTrace(double high_workers = 6, double low_workers = 2, double high_seconds = 120,
                    double low_seconds = 180, double processing = 0.5);
// "burst", "steady", "sawtooth", "burst-after-scale-down" or "step-down".
// Throws std::invalid_argument for other names.
Trace BuiltinTrace(std::string_view name);
// CSV lines "arrival_seconds[,processing_seconds]"; '#' starts a comment, a
// non-numeric first line is a header; a missing processing time is
// `default_processing`. Throws std::runtime_error naming the bad line.
Trace ParseCsvTrace(std::istream& in, double default_processing, std::string name = "csv");
Trace LoadCsvTrace(const std::string& path, double default_processing);

enum class DispatchOrder {
  // The slot that has been ready longest first: the older fleet-broker's
  // order. Spreads partial load over every worker, so none stays idle long
  // enough to be retired.
  kRoundRobin,
  // Packing, the broker's order: the worker that most recently had work
  // (holding a batch now counts as most recent) and still has a free slot;
  // workers that never had work come last. Ties go to the lower id.
  kMostRecent,
};

struct SimOptions {
  PolicyOptions policy;
  PoolOptions pool;
  // Simulation step. 1 ms .. poll; smaller is finer, slower.
  Duration tick = Millis(10);
  double startup_seconds = 2.0;  // launch -> registered at the broker
  int concurrency = 1;           // slots per worker, [1, 1024]
  double drain_seconds = 2.0;    // retired idle worker -> exited
  int failing_starts = 0;        // the first N launches never register
  // The policy sees the broker as it was this many polls ago (metrics are
  // seconds old); >= 0.
  int metrics_lag_polls = 0;
  DispatchOrder dispatch = DispatchOrder::kMostRecent;
  // Metrics reads fail in [outage_from, outage_to) seconds (fresh = false;
  // the control API's queue depth is still available).
  double outage_from = -1;
  double outage_to = -1;
  // Hard stop, seconds of simulated time.
  double max_seconds = 3600;
  // Called with every decision (seconds since start).
  std::function<void(double, const Decision&)> on_decision;
};

struct SimReport {
  std::string trace;
  std::string policy;
  int batches = 0;
  int completed = 0;
  int flaps = 0;                   // direction changes of the pool size
  double worker_seconds = 0;       // launched, not yet exited (starting included)
  double idle_worker_seconds = 0;  // registered and holding nothing
  double p50_wait_seconds = 0;     // queue wait: arrival -> dispatch
  double p95_wait_seconds = 0;
  double max_wait_seconds = 0;
  int retired_while_holding = 0;  // retires accepted for a worker holding a batch (must be 0)
  int retire_refused = 0;         // retire-if-idle refused: it had become busy
  int peak_pool = 0;              // max of starting + running (not retiring)
  // Ideal pool at a poll: clamp(ceil(max((queued + inflight) / target,
  // processing seconds that arrived in the last 10 s / 10 s))).
  int peak_ideal = 0;
  // Max over polls of pool - the ideal's peak so far (>= 0): capacity the
  // trace never called for.
  int overshoot = 0;
  int launches = 0;
  int unretires = 0;
  int retires = 0;
  int start_failures = 0;
  // Backlog appears (queue non-empty after dispatch) -> a worker added since
  // (launched or unretired) takes its first batch. First episode and worst.
  double reaction_seconds = kUnknown;
  double reaction_max_seconds = kUnknown;
  int reactions = 0;
  // Last result -> live workers (retiring included) back at max(min,
  // survivors). NaN when it never got there.
  double scale_down_seconds = kUnknown;
  double makespan_seconds = 0;  // first arrival -> last result
  double end_seconds = 0;       // when the simulation stopped

  // "key=value" lines in a fixed order.
  std::string ToKeyValues() const;
};

// Runs `trace` under `options` until every batch has a result and the pool
// is back at its floor, or until max_seconds. Throws std::invalid_argument
// for invalid options.
SimReport Simulate(const Trace& trace, const SimOptions& options);

}  // namespace fleet::autoscaler

// PoolTracker: the autoscaler's own book of the workers it launched, and of
// the workers it finds at the broker, reconciled on every poll with what the
// broker reports (the Observation).
//
// Also defines the Observation the policy and the tracker consume: one poll's
// worth of broker metrics, built by the loop from a /metrics scrape or a
// Prometheus query. Values in it may be garbage (NaN, negative, huge); the
// consumers sanitize them.
//
// Pure state: every method takes `now`; no clock, no sockets, no randomness
// (the run tag that makes ids unique across restarts is passed in). Not
// thread-safe; the autoscaler loop owns it.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"

namespace fleet::autoscaler {

inline constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

// A worker's state as the broker reports it (fleet_workers{state}).
enum class BrokerWorkerState { kIdle, kBusy, kRetiring };

struct WorkerObs {
  std::string id;
  BrokerWorkerState state = BrokerWorkerState::kIdle;
  // fleet_worker_idle_seconds: seconds since its last batch finished (or
  // since it registered); 0 while it holds a batch. May be garbage.
  double idle_seconds = 0;
};

struct Observation {
  // False when the metrics read failed, timed out or is older than the
  // maximum staleness. Then only control_queued may be trusted.
  bool fresh = false;
  double queued = kUnknown;    // fleet_queue_depth summed over queues
  double inflight = kUnknown;  // fleet_batches_inflight
  std::vector<WorkerObs> workers;
  // Cumulative counters for the throughput policy; NaN when absent.
  double submitted_total = kUnknown;           // fleet_batches_submitted_total
  double completed_total = kUnknown;           // fleet_batches_completed_total
  double processing_seconds_sum = kUnknown;    // fleet_batch_processing_seconds_sum
  double processing_seconds_count = kUnknown;  // fleet_batch_processing_seconds_count
  // Queue depth from the broker's control API (stats), read when the metrics
  // are stale. Used for scale-up only.
  std::optional<double> control_queued;
  // Queue depth from the broker's answer to wait-demand, when that answer
  // is what woke this poll. Raises the queue depth (a scrape may predate
  // the burst); never lowers it.
  std::optional<double> demand_queued;
};

// True when `v` is a plausible count: finite, >= 0 and <= `cap`.
bool Plausible(double v, double cap);

enum class PoolState {
  kStarting,  // launched, not yet seen registered at the broker
  kRunning,   // registered, takes work
  kRetiring,  // the broker accepted retire-if-idle; it drains and exits
  kStopping,  // the launcher was told to stop it (start timeout, grace over)
};
const char* PoolStateName(PoolState state);

struct PoolEntry {
  std::string id;
  PoolState state = PoolState::kStarting;
  bool adopted = false;                    // found at the broker, not launched by this tracker
  std::optional<TimePoint> launched_at;    // empty for adopted workers
  std::optional<TimePoint> registered_at;  // first seen at the broker
  std::optional<TimePoint> retired_at;
  std::optional<TimePoint> missing_since;  // first fresh poll it was not at the broker
  std::optional<TimePoint> own_change_at;  // our last MarkRetiring / MarkUnretired
};

struct PoolOptions {
  // Ids are <id_prefix><run_tag>-<counter>. Workers at the broker whose id
  // starts with id_prefix are adopted (e.g. after an autoscaler restart);
  // others are counted as foreign capacity and never retired.
  std::string id_prefix = "fleet-as-";
  // A launched worker not registered within this is reported for kill and
  // counted as a start failure. Range 1 s .. 10 min.
  Duration start_timeout = Seconds(30);
  // Launch backoff after consecutive start failures: initial, doubling, up
  // to max; reset by the next successful registration. 100 ms .. 10 min.
  Duration backoff_initial = Seconds(1);
  Duration backoff_max = Seconds(60);
  // Start-up time (launch -> registered) estimate: EWMA weight of the newest
  // sample (0, 1], and the value assumed before any measurement, in seconds.
  double startup_ewma_alpha = 0.3;
  double startup_default_seconds = 1.0;
  // Ids this tracker forgot (reaped) are not adopted again for this long:
  // metrics a poll old still list a worker that just exited. The broker's
  // blacklist TTL (120 s) bounds how long such an id can matter.
  Duration forget_memory = Seconds(120);
  // A running worker missing from the broker's view is counted (and left
  // alone) this long before it is taken as gone: after a broker restart, or
  // a pause past the broker's liveness, workers re-register within a few
  // heartbeats, and replacing them all would churn the fleet. A worker whose
  // process exits is forgotten at once (Forget). 0 .. 10 min.
  Duration vanish_after = Seconds(10);
  // After the autoscaler itself retires or takes back a worker, the
  // broker's metrics (a tick and a scrape old) still show the old state for
  // a while; the book does not follow them for this long. 0 .. 1 min.
  Duration follow_holdoff = Seconds(3);
};

// What Observe() found; the loop acts on it (kill, reap, log).
struct ObserveResult {
  std::vector<std::string> registered;  // starting -> running
  std::vector<std::string> timed_out;   // starting too long: now kStopping, kill it
  std::vector<std::string> vanished;    // gone from the broker: forgotten; make sure it is stopped
  std::vector<std::string> adopted;     // found at the broker with our prefix
  std::vector<std::string> unretired;   // retiring -> running by someone else: cancel its stop
};

struct PoolCounts {
  int starting = 0;
  int running = 0;
  int retiring = 0;
  int stopping = 0;
  int foreign = 0;           // at the broker, not ours, not retiring
  int foreign_retiring = 0;  // at the broker, not ours, retiring
  // Capacity the policy counts: starting + running + foreign.
  int active() const { return starting + running + foreign; }
};

class PoolTracker {
 public:
  // `run_tag`: a short random string chosen once per autoscaler run, so ids
  // never repeat a previous run's (still blacklisted) ids.
  PoolTracker(PoolOptions options, std::string run_tag);

  // Records a launch at `now` and returns the fresh id to start the worker
  // with (state kStarting). Does not check CanLaunch; the policy does.
  std::string Launch(TimePoint now);
  // The launcher found `id` already running (a container left by an earlier
  // autoscaler run). It is booked as starting, without a launch sample, so
  // it registers (or times out and is killed) like a worker of ours. False
  // if the id is already in the book.
  bool AdoptLaunched(std::string_view id, TimePoint now);
  // The launcher could not start `id`: forgets it, counts a start failure.
  void LaunchFailed(std::string_view id, TimePoint now);
  // The broker accepted retire-if-idle for `id`. False if unknown.
  bool MarkRetiring(std::string_view id, TimePoint now);
  // The broker accepted unretire for `id`. False if unknown.
  bool MarkUnretired(std::string_view id, TimePoint now);
  // The launcher was told to stop `id`. False if unknown.
  bool MarkStopping(std::string_view id);
  // The launcher reaped `id` (its process or container is gone). A worker
  // that exits before it ever registered counts as a start failure.
  // False if unknown.
  bool Forget(std::string_view id, TimePoint now);

  // Reconciles the book with the broker. A stale observation (fresh ==
  // false) changes nothing: neither registrations nor timeouts nor
  // vanishing can be told from it, and a metrics outage must not turn into
  // a kill storm.
  ObserveResult Observe(const Observation& obs, TimePoint now);

  // False while launches are backed off after start failures.
  bool CanLaunch(TimePoint now) const { return now >= launch_allowed_at_; }
  TimePoint launch_allowed_at() const { return launch_allowed_at_; }
  int consecutive_start_failures() const { return consecutive_failures_; }
  std::uint64_t start_failures_total() const { return failures_total_; }

  // Start-up time estimate in seconds (EWMA of launch -> registered), or
  // the default before any measurement.
  double StartupSeconds() const;
  bool startup_measured() const { return startup_ewma_.has_value(); }

  PoolCounts Counts() const;
  const PoolEntry* Find(std::string_view id) const;
  // Every entry, ordered by id (deterministic).
  const std::map<std::string, PoolEntry, std::less<>>& entries() const { return entries_; }
  // Ids in kRetiring whose retire is older than `grace` (for the loop's
  // grace -> SIGTERM -> SIGKILL escalation).
  std::vector<std::string> RetiringLongerThan(Duration grace, TimePoint now) const;
  // Whether `id` carries this tracker's prefix.
  bool Owns(std::string_view id) const;
  const PoolOptions& options() const { return options_; }

 private:
  void StartFailure(TimePoint now);

  PoolOptions options_;
  std::string run_tag_;
  std::uint64_t next_ = 1;
  std::map<std::string, PoolEntry, std::less<>> entries_;
  int foreign_ = 0;
  int foreign_retiring_ = 0;
  int consecutive_failures_ = 0;
  std::uint64_t failures_total_ = 0;
  TimePoint launch_allowed_at_{};
  std::optional<double> startup_ewma_;
  std::map<std::string, TimePoint, std::less<>> forgotten_;  // id -> when
};

}  // namespace fleet::autoscaler

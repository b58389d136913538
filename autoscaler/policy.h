// Policy: decides, once per poll, how many workers the pool should have and
// what to do about it (take back retiring workers, launch, retire idle ones).
//
// Two kinds share every safety rule (clamps, scale-up step, stabilization
// window, cooldown, per-worker idle threshold, survivors, stale-metrics
// freeze) and differ only in how they size the pool:
//  - backlog:    desired = ceil((queued + inflight) / target_per_worker)
//  - throughput: desired = ceil(max(lambda*S, inflight) + queued*S/drain)
//    (Little's law from the broker's counters), and it weighs the measured
//    worker start-up time before launching or retiring.
//
// Owns: the window of recent desired values, the time of the last
// scale-down, and (throughput) a window of counter samples. Pure state: takes
// `now`; no clock, no sockets. Not thread-safe; the autoscaler loop owns it.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autoscaler/pool.h"
#include "common/clock.h"

namespace fleet::autoscaler {

enum class PolicyKind { kBacklog, kThroughput };
const char* PolicyKindName(PolicyKind kind);
// "backlog" or "throughput"; empty for anything else.
std::optional<PolicyKind> ParsePolicyKind(std::string_view name);

struct PolicyOptions {
  PolicyKind kind = PolicyKind::kBacklog;
  // Pool bounds, workers. 0 <= min <= max <= 10000, max >= 1.
  int min_workers = 0;
  int max_workers = 8;
  // Workers wanted at start (kept at least one stabilization window).
  // Range [min, max].
  int initial_workers = 0;
  // Backlog policy: batches (queued + in flight) one worker should have.
  // 4: with concurrency 1 a backlog waits at most ~4 processing times, and a
  // worker we cold-start finds several batches waiting, so a start is not
  // wasted on a queue that drains before it registers. Range (0, 1e6].
  double target_per_worker = 4;
  // Most workers launched per poll. Retiring workers taken back (unretire)
  // do not count: they cost no start and are bounded by desired.
  // Range [1, max].
  int max_step = 4;
  // Most workers retired per poll. 8 (= the default max): each candidate has
  // already passed the idle threshold and the stabilization window, and the
  // cooldown applies between scale-downs, so retiring one per cooldown would
  // stretch 8 -> 0 to minutes for no safety gain. Range [1, 10000].
  int max_step_down = 8;
  // A worker may be retired only after this long without a batch.
  // 1 s .. 1 h.
  Duration idle = Seconds(60);
  // No scale-down sooner than this after the previous scale-down. 0 .. 1 h.
  Duration cooldown = Seconds(30);
  // Scale down only to the highest desired of this trailing window, and
  // only once the policy has seen a whole window. 0 .. 1 h.
  Duration stabilization = Seconds(60);
  // Never retire below max(min, min_survivors). 0 so that --min 0 really
  // reaches zero (idle cost, and the e2e contract); set 1 to keep a warm
  // worker as Daft does. Range [0, max].
  int min_survivors = 0;
  // Throughput policy: drain the queue within this. 1 s .. 1 h.
  Duration target_drain = Seconds(10);
  // Throughput policy: counters are differenced over this trailing window;
  // no rate is trusted before a third of it has been seen. Longer is
  // steadier, shorter forgets a burst sooner. 15 s: +-15 % on 4 batches/s,
  // and a burst keeps the rate up for 15 s only. 2 polls .. 10 min.
  Duration rate_window = Seconds(15);
  // Throughput policy: mean processing time assumed until one is measured,
  // seconds. Measured means are clamped to [1 ms, 1 h].
  double default_processing_seconds = 1.0;
  // The loop's poll interval (the policy assumes it is called about this
  // often). 50 ms .. 10 min: at 50 ms a burst is seen within about 50 ms,
  // for one scrape of the broker per poll.
  Duration poll = Millis(1000);
  // Queue depths or in-flight counts above this are treated as garbage
  // (far above any broker's --max-queue). Range [1, 1e12].
  double max_plausible_load = 1e7;

  // Throws std::invalid_argument naming the first option out of range.
  void Validate() const;
};

struct Decision {
  int desired = 0;  // pool size the policy wants, in [min, max]
  int pool = 0;     // capacity counted: starting + running + foreign
  int starting = 0;
  int retiring = 0;
  std::vector<std::string> unretire;  // take these back first
  int launch = 0;                     // then start this many new workers
  std::vector<std::string> retire;    // retire-if-idle these, longest idle first
  std::string action;                 // "scale_up", "scale_down" or "hold"
  std::string reason_code;            // short, bounded label for metrics
  std::string reason;                 // a sentence with the inputs, for the log
  // Inputs as used (NaN when unknown), for logs and gauges.
  double load = kUnknown;  // queued + inflight (or control_queued when stale)
  double arrival_rate = kUnknown;
  double processing_seconds = kUnknown;
  bool trusted = false;  // fresh metrics with plausible values
};

// Arrival rate and mean processing time from cumulative counters sampled
// over a trailing window. Counter resets (a broker restart) and garbage
// samples restart the window.
class RateEstimator {
 public:
  explicit RateEstimator(Duration window) : window_(window) {}
  void Add(const Observation& obs, TimePoint now);
  // Batches per second; empty until the samples span a third of the
  // window.
  std::optional<double> ArrivalRate() const;
  // Mean seconds per batch over the window; empty when none finished in it
  // (callers keep the last value).
  std::optional<double> ProcessingSeconds() const;
  // Seconds from the last sample that saw the submitted counter grow (or
  // the window's first sample) to the newest one.
  double QuietSeconds() const;

 private:
  struct Sample {
    TimePoint t;
    double submitted;
    double psum;
    double pcount;
  };
  Duration window_;
  std::deque<Sample> samples_;
  TimePoint last_arrival_{};  // valid while samples_ is not empty
};

class Policy {
 public:
  // Requires options.Validate() to pass (the constructor calls it).
  explicit Policy(PolicyOptions options);

  // One poll's decision. Call once per poll, after pool.Observe(obs, now).
  // Never throws on bad observations: garbage freezes scale-down and leaves
  // scale-up to control_queued.
  Decision Decide(const Observation& obs, const PoolTracker& pool, TimePoint now);

  const PolicyOptions& options() const { return options_; }
  std::optional<TimePoint> last_scale_down() const { return last_scale_down_; }

 private:
  struct Demand {
    int desired = 0;
    std::string why;  // "backlog 37 queued+inflight needs 10 workers ..."
  };
  Demand Size(const Observation& obs, bool trusted, double queued, double inflight, Decision& d);
  void Record(TimePoint now, int desired);
  int WindowMax(TimePoint now) const;
  void ScaleUp(const Observation& obs, const PoolTracker& pool, TimePoint now, double queued,
               Decision& d, const std::string& why);
  void ScaleDown(const Observation& obs, const PoolTracker& pool, TimePoint now, Decision& d,
                 const std::string& why);

  PolicyOptions options_;
  bool first_ = true;
  std::deque<std::pair<TimePoint, int>> window_;
  std::optional<TimePoint> history_start_;
  std::optional<TimePoint> last_scale_down_;
  // Workers the last scale-down meant to retire but could not yet (they
  // were not idle long enough); they may follow within its cooldown, and
  // the next scale-down waits a cooldown after the last of them.
  int unfinished_down_ = 0;
  std::optional<TimePoint> last_retirement_;
  RateEstimator rates_;
  double processing_seconds_;  // last measured (or the default)
};

}  // namespace fleet::autoscaler

#include "autoscaler/policy.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

// Invariants and choices:
//  - Scale-up is never delayed: no window, no cooldown. Its only brakes are
//    max_step, counting starting workers (so a slow start cannot make the
//    next poll launch again), the start-failure backoff, and (throughput)
//    the start-up time check.
//  - Scale-down needs all of: trusted inputs this poll, a whole
//    stabilization window of history, the window's maximum below the pool,
//    the cooldown, and workers idle past the threshold. Each is a separate
//    hold reason so the log says which one held.
//  - A poll whose inputs are not trusted records the current pool in the
//    window (not its own desired): after a metrics outage the policy must see
//    a whole window of good data before it shrinks anything. Rejected: leave
//    the window untouched, which would let an outage longer than the window
//    be followed by an immediate scale-down on the first good read.
//  - Cooldown starts when a retire is requested, not when the broker accepts
//    it: a refusal means the worker became busy, a reason to wait anyway.

namespace fleet::autoscaler {
namespace {

double Secs(Duration d) { return std::chrono::duration<double>(d).count(); }

int ClampInt(int v, int lo, int hi) { return std::max(lo, std::min(v, hi)); }

// ceil(need) for a plausible need, saturating at `max` without overflowing.
int CeilWorkers(double need, int max) {
  if (!(need > 0)) return 0;
  if (need >= max) return max;
  return static_cast<int>(std::ceil(need - 1e-9));
}

}  // namespace

const char* PolicyKindName(PolicyKind kind) {
  return kind == PolicyKind::kThroughput ? "throughput" : "backlog";
}

std::optional<PolicyKind> ParsePolicyKind(std::string_view name) {
  if (name == "backlog") return PolicyKind::kBacklog;
  if (name == "throughput") return PolicyKind::kThroughput;
  return std::nullopt;
}

void PolicyOptions::Validate() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (max_workers < 1 || max_workers > 10000) fail("max must be in [1, 10000]");
  if (min_workers < 0 || min_workers > max_workers) fail("min must be in [0, max]");
  if (initial_workers < min_workers || initial_workers > max_workers) {
    fail("initial must be in [min, max]");
  }
  if (!(target_per_worker > 0 && target_per_worker <= 1e6)) {
    fail("target per worker must be in (0, 1e6]");
  }
  if (max_step < 1 || max_step > max_workers) fail("max step must be in [1, max]");
  if (max_step_down < 1 || max_step_down > 10000) fail("max step down must be in [1, 10000]");
  if (idle < Seconds(1) || idle > Seconds(3600)) fail("idle seconds must be in [1, 3600]");
  if (cooldown < Duration::zero() || cooldown > Seconds(3600)) {
    fail("cooldown seconds must be in [0, 3600]");
  }
  if (stabilization < Duration::zero() || stabilization > Seconds(3600)) {
    fail("stabilization seconds must be in [0, 3600]");
  }
  if (min_survivors < 0 || min_survivors > max_workers) fail("min survivors must be in [0, max]");
  if (target_drain < Seconds(1) || target_drain > Seconds(3600)) {
    fail("target drain seconds must be in [1, 3600]");
  }
  if (poll < Millis(50) || poll > Seconds(600)) fail("poll ms must be in [50, 600000]");
  if (rate_window < 2 * poll || rate_window > std::max<Duration>(Seconds(600), 2 * poll)) {
    fail("rate window must be in [2 polls, max(600 s, 2 polls)]");
  }
  if (!(default_processing_seconds >= 1e-3 && default_processing_seconds <= 3600)) {
    fail("default processing seconds must be in [0.001, 3600]");
  }
  if (!(max_plausible_load >= 1 && max_plausible_load <= 1e12)) {
    fail("max plausible load must be in [1, 1e12]");
  }
}

// --- RateEstimator ---------------------------------------------------------

void RateEstimator::Add(const Observation& obs, TimePoint now) {
  constexpr double kCap = 1e15;
  if (!Plausible(obs.submitted_total, kCap)) {
    samples_.clear();
    return;
  }
  Sample s{now, obs.submitted_total, kUnknown, kUnknown};
  if (Plausible(obs.processing_seconds_sum, kCap) &&
      Plausible(obs.processing_seconds_count, kCap)) {
    s.psum = obs.processing_seconds_sum;
    s.pcount = obs.processing_seconds_count;
  }
  if (!samples_.empty()) {
    const Sample& last = samples_.back();
    // A counter that went down was reset (broker restart): old deltas lie.
    // So does a clock that went back.
    if (s.submitted < last.submitted || s.pcount < last.pcount || s.psum < last.psum ||
        s.t < last.t) {
      samples_.clear();
    } else if (s.t == last.t) {
      samples_.pop_back();  // a second read at the same instant replaces the first
    }
  }
  if (samples_.empty() || s.submitted > samples_.back().submitted) last_arrival_ = now;
  samples_.push_back(s);
  // Keep one baseline sample at or before the window's start.
  while (samples_.size() >= 2 && samples_[1].t <= now - window_) samples_.pop_front();
}

std::optional<double> RateEstimator::ArrivalRate() const {
  if (samples_.size() < 2) return std::nullopt;
  const double dt = SecondsBetween(samples_.front().t, samples_.back().t);
  // A rate from a second or two of a fresh window is mostly noise (a cold
  // start saw 8/s where the truth was 4/s): wait for a third of the window.
  if (!(dt > 0) || dt < std::chrono::duration<double>(window_).count() / 3) return std::nullopt;
  return (samples_.back().submitted - samples_.front().submitted) / dt;
}

double RateEstimator::QuietSeconds() const {
  return samples_.empty() ? 0.0 : SecondsBetween(last_arrival_, samples_.back().t);
}

std::optional<double> RateEstimator::ProcessingSeconds() const {
  if (samples_.size() < 2) return std::nullopt;
  const Sample& a = samples_.front();
  const Sample& b = samples_.back();
  // NaN propagates and fails the comparisons below.
  const double count = b.pcount - a.pcount;
  const double sum = b.psum - a.psum;
  if (!(count >= 1) || !(sum >= 0)) return std::nullopt;
  return sum / count;
}

// --- Policy ----------------------------------------------------------------

Policy::Policy(PolicyOptions options)
    : options_(options),
      rates_(options.rate_window),
      processing_seconds_(options.default_processing_seconds) {
  options_.Validate();
}

Policy::Demand Policy::Size(const Observation& obs, bool trusted, double queued, double inflight,
                            Decision& d) {
  const int lo = options_.min_workers;
  const int hi = options_.max_workers;
  const double load = queued + inflight;
  d.load = load;
  Demand dem;
  double need = 0;
  if (options_.kind == PolicyKind::kBacklog) {
    need = load / options_.target_per_worker;
    dem.why = fmt::format("{}{:g} queued+inflight needs {:.1f} workers (target {:g} per worker)",
                          trusted ? "backlog " : "metrics stale, control queue ", load, need,
                          options_.target_per_worker);
  } else {
    if (obs.fresh) {
      if (auto s = rates_.ProcessingSeconds()) processing_seconds_ = std::clamp(*s, 1e-3, 3600.0);
    }
    const double s = processing_seconds_;
    const std::optional<double> rate = trusted ? rates_.ArrivalRate() : std::nullopt;
    double lambda = std::max(rate.value_or(0.0), 0.0);
    // The window's average outlives a stream that stopped: a burst leaves
    // "223/s" for a whole window after its last batch, holding workers for
    // nothing. Arriving at lambda, no arrival for t seconds has probability
    // exp(-lambda t); at lambda t >= 3 (5%) the stream is taken as stopped.
    const double quiet = rates_.QuietSeconds();
    const bool stopped = lambda > 0 && lambda * quiet >= 3;
    if (stopped) lambda = 0;
    d.arrival_rate = lambda;
    d.processing_seconds = s;
    // In flight is what is busy now; lambda * S what is busy on average.
    const double busy = std::max(lambda * s, inflight);
    need = busy + queued * s / Secs(options_.target_drain);
    dem.why = fmt::format(
        "{}arrivals {:.2f}/s x {:.3f} s (in flight {:g}) + {:g} queued drained in {:g} s needs "
        "{:.1f} workers",
        trusted ? "" : "metrics stale, control queue: ", lambda, s, inflight, queued,
        Secs(options_.target_drain), need);
    if (stopped) dem.why += fmt::format(" (no arrival for {:.1f} s: stream stopped)", quiet);
    if (!rate) {
      // No rate yet (cold start, counter reset, no counters): the default
      // processing time is a guess, so take the backlog sizing if it is more.
      const double backlog = load / options_.target_per_worker;
      if (backlog > need) {
        need = backlog;
        dem.why += fmt::format(" (no rate yet: backlog sizing, {:.1f})", backlog);
      }
    }
  }
  int desired = CeilWorkers(need, hi);
  if (load > 0 && desired < 1) desired = 1;  // from zero, any batch starts one
  dem.desired = ClampInt(desired, lo, hi);
  if (dem.desired != desired) dem.why += fmt::format(", clamped to [{}, {}]", lo, hi);
  return dem;
}

void Policy::Record(TimePoint now, int desired) {
  if (!history_start_) history_start_ = now;
  window_.emplace_back(now, desired);
  while (!window_.empty() && window_.front().first < now - options_.stabilization) {
    window_.pop_front();
  }
}

int Policy::WindowMax(TimePoint now) const {
  int m = 0;
  for (const auto& [t, v] : window_) {
    if (t >= now - options_.stabilization) m = std::max(m, v);
  }
  return m;
}

Decision Policy::Decide(const Observation& obs, const PoolTracker& pool, TimePoint now) {
  Decision d;
  const PoolCounts c = pool.Counts();
  d.pool = c.active();
  d.starting = c.starting;
  d.retiring = c.retiring;

  const double cap = options_.max_plausible_load;
  d.trusted = obs.fresh && Plausible(obs.queued, cap) && Plausible(obs.inflight, cap);
  double queued = kUnknown;
  double inflight = 0;
  if (d.trusted) {
    queued = obs.queued;
    inflight = obs.inflight;
  } else if (obs.control_queued && Plausible(*obs.control_queued, cap)) {
    queued = *obs.control_queued;
  }
  // Woken by the broker's wait-demand answer: work waits, whatever a read
  // that predates it says.
  const bool woken = obs.demand_queued && Plausible(*obs.demand_queued, cap);
  if (woken && (std::isnan(queued) || *obs.demand_queued > queued)) queued = *obs.demand_queued;
  if (obs.fresh) rates_.Add(obs, now);

  const int clamped_pool = ClampInt(d.pool, options_.min_workers, options_.max_workers);
  Demand dem;
  if (std::isnan(queued)) {
    dem.desired = clamped_pool;
    dem.why = obs.fresh ? "metrics implausible and no control queue depth"
                        : "metrics stale and no control queue depth";
  } else {
    dem = Size(obs, d.trusted, queued, inflight, d);
  }
  if (woken) {
    dem.why = fmt::format("woken by the broker: {:g} queued; {}", *obs.demand_queued, dem.why);
  }
  if (first_) {
    first_ = false;
    if (options_.initial_workers > dem.desired) {
      dem.desired = options_.initial_workers;
      dem.why += fmt::format(", initial {}", options_.initial_workers);
    }
  }
  d.desired = dem.desired;
  Record(now, d.trusted ? d.desired : std::max(d.desired, clamped_pool));

  if (d.desired > d.pool) {
    ScaleUp(obs, pool, now, std::isnan(queued) ? 0.0 : queued, d, dem.why);
  } else if (d.desired < d.pool) {
    ScaleDown(obs, pool, now, d, dem.why);
  } else {
    d.action = "hold";
    d.reason_code = "steady";
    d.reason = fmt::format("{}; pool {} ({} starting) matches", dem.why, d.pool, d.starting);
  }
  return d;
}

void Policy::ScaleUp(const Observation& obs, const PoolTracker& pool, TimePoint now, double queued,
                     Decision& d, const std::string& why) {
  const int want = d.desired - d.pool;

  // Retiring-but-alive workers come back first: no cold start, and the
  // broker refuses an unretire of one that already left. Most recently
  // retired first: furthest from having exited.
  std::unordered_map<std::string_view, bool> present;
  for (const WorkerObs& w : obs.workers) present.emplace(w.id, true);
  std::vector<const PoolEntry*> back;
  for (const auto& [id, e] : pool.entries()) {
    if (e.state != PoolState::kRetiring) continue;
    if (obs.fresh && !present.contains(id)) continue;
    back.push_back(&e);
  }
  std::sort(back.begin(), back.end(), [](const PoolEntry* a, const PoolEntry* b) {
    if (a->retired_at != b->retired_at) return a->retired_at > b->retired_at;
    return a->id < b->id;
  });
  for (const PoolEntry* e : back) {
    if (static_cast<int>(d.unretire.size()) >= want) break;
    d.unretire.push_back(e->id);
  }

  // max_step bounds cold starts only: a storm or an overshoot is made of
  // launches. Taking back a draining worker costs nothing, is bounded by
  // desired, and is exactly what a burst right after a scale-down needs.
  const int step = std::min(want - static_cast<int>(d.unretire.size()), options_.max_step);
  const int rest = step;
  std::string held;
  std::string held_code;
  if (rest > 0) {
    if (!pool.CanLaunch(now)) {
      held_code = "start_backoff";
      held = fmt::format("; launches backed off after {} start failures for {:.1f} s more",
                         pool.consecutive_start_failures(),
                         SecondsBetween(now, pool.launch_allowed_at()));
    } else if (options_.kind == PolicyKind::kThroughput && d.pool > 0) {
      // Would a new worker arrive after the backlog is gone anyway?
      const double s = processing_seconds_;
      const double lambda = std::isnan(d.arrival_rate) ? 0.0 : d.arrival_rate;
      const double net = d.pool / s - lambda;  // batches/s the pool gains on the queue
      const double startup = pool.StartupSeconds();
      if (net > 0 && queued / net < startup) {
        held_code = "drains_before_start";
        held = fmt::format(
            "; not launching: the backlog drains in {:.2f} s with the pool of {}, before a new "
            "worker could start ({:.2f} s)",
            queued / net, d.pool, startup);
      }
    }
    if (held_code.empty()) d.launch = rest;
  }

  const bool acted = d.launch > 0 || !d.unretire.empty();
  if (acted) unfinished_down_ = 0;  // the last scale-down is not to be completed now
  d.action = acted ? "scale_up" : "hold";
  d.reason_code = acted ? (d.launch > 0 ? "demand" : "unretire") : held_code;
  d.reason = fmt::format("{}; pool {} ({} starting)", why, d.pool, d.starting);
  if (acted) {
    d.reason += fmt::format("; unretire {}, launch {}", d.unretire.size(), d.launch);
    if (static_cast<int>(d.unretire.size()) + step < want) {
      d.reason += fmt::format(" (max step {})", options_.max_step);
    }
  }
  d.reason += held;
}

void Policy::ScaleDown(const Observation& obs, const PoolTracker& pool, TimePoint now, Decision& d,
                       const std::string& why) {
  auto hold = [&](const char* code, const std::string& text) {
    d.action = "hold";
    d.reason_code = code;
    d.reason = fmt::format("{}; pool {}: {}", why, d.pool, text);
  };
  const int floor =
      std::min(std::max(options_.min_workers, options_.min_survivors), options_.max_workers);
  if (!d.trusted) {
    return hold("stale_metrics", "scale-down frozen while metrics are stale or implausible");
  }
  const double stab = Secs(options_.stabilization);
  const double seen = SecondsBetween(*history_start_, now);
  if (seen < stab) {
    return hold("stabilizing",
                fmt::format("stabilizing: seen {:.0f} s of the {:g} s window", seen, stab));
  }
  const int wmax = WindowMax(now);
  const int target = std::max(wmax, floor);
  if (target >= d.pool) {
    if (wmax >= d.pool) {
      return hold("stabilizing",
                  fmt::format("stabilizing: max desired in the last {:g} s is {}", stab, wmax));
    }
    return hold("at_floor", fmt::format("at the floor max(min, min survivors) = {}", floor));
  }
  // Within the cooldown only the rest of the last step may follow: workers
  // it chose to shed that had not been idle long enough yet (a pool that
  // finished a burst goes idle over a few polls, not in one).
  const bool completing = last_scale_down_ && now - *last_scale_down_ < options_.cooldown &&
                          unfinished_down_ > 0;
  if (!completing && last_retirement_ && now - *last_retirement_ < options_.cooldown) {
    return hold("cooldown",
                fmt::format("cooldown: last scale-down {:.0f} s ago (< {:g} s)",
                            SecondsBetween(*last_retirement_, now), Secs(options_.cooldown)));
  }
  if (options_.kind == PolicyKind::kThroughput && d.arrival_rate > 0) {
    const double gap = d.pool / d.arrival_rate;
    const double startup = pool.StartupSeconds();
    if (gap < startup) {
      return hold("gap_below_startup",
                  fmt::format("a worker's expected idle gap {:.2f} s is shorter than its "
                              "start-up time {:.2f} s",
                              gap, startup));
    }
  }

  const double idle = Secs(options_.idle);
  std::vector<const WorkerObs*> candidates;
  for (const WorkerObs& w : obs.workers) {
    if (w.state != BrokerWorkerState::kIdle) continue;
    if (!Plausible(w.idle_seconds, 1e9) || w.idle_seconds < idle) continue;
    const PoolEntry* e = pool.Find(w.id);
    if (e == nullptr || e->state != PoolState::kRunning) continue;  // not ours to retire
    candidates.push_back(&w);
  }
  std::sort(candidates.begin(), candidates.end(), [](const WorkerObs* a, const WorkerObs* b) {
    if (a->idle_seconds != b->idle_seconds) return a->idle_seconds > b->idle_seconds;
    return a->id < b->id;
  });
  const int step = std::min(d.pool - target, completing ? unfinished_down_ : options_.max_step_down);
  const int n = std::min(step, static_cast<int>(candidates.size()));
  if (n <= 0) {
    if (completing) {
      return hold("cooldown",
                  fmt::format("cooldown: last scale-down {:.0f} s ago (< {:g} s); {} more of it "
                              "once idle >= {:g} s",
                              SecondsBetween(*last_scale_down_, now), Secs(options_.cooldown),
                              unfinished_down_, idle));
    }
    return hold("not_idle",
                fmt::format("target {} but no worker of ours idle >= {:g} s", target, idle));
  }
  for (int i = 0; i < n; ++i) d.retire.push_back(candidates[i]->id);
  if (completing) {
    unfinished_down_ -= n;  // the window to complete it runs from the step's start
  } else {
    last_scale_down_ = now;
    unfinished_down_ = step - n;
  }
  last_retirement_ = now;
  d.action = "scale_down";
  d.reason_code = "idle";
  d.reason = fmt::format(
      "{}; max desired in the last {:g} s is {} (floor {}), pool {}: retire {} idle (longest "
      "{:.0f} s){}",
      why, stab, wmax, floor, d.pool, n, candidates[0]->idle_seconds,
      completing ? ", completing the scale-down of " +
                       fmt::format("{:.1f} s ago", SecondsBetween(*last_scale_down_, now))
                 : std::string());
}

}  // namespace fleet::autoscaler

#include "autoscaler/simulator.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <queue>
#include <stdexcept>
#include <tuple>

// Time runs in integer milliseconds so that ticks, polls and arrivals line
// up exactly and two runs give the same figures bit for bit. Rejected: an
// event queue with double times: exact, but the poll/arrival/finish ties it
// must order are where simulators silently disagree with the real loop;
// a fixed tick makes the order explicit (arrivals, finishes, registrations,
// exits, dispatch, then the poll).

namespace fleet::autoscaler {
namespace {

using Ms = std::int64_t;
Ms ToMs(double s) { return static_cast<Ms>(std::llround(s * 1000.0)); }
double ToS(Ms ms) { return static_cast<double>(ms) / 1000.0; }

struct SimBatch {
  Ms arrive = 0;
  Ms processing = 0;
  Ms dispatched = -1;
  Ms done = -1;
};

struct SimWorker {
  std::string id;
  Ms ready_at = -1;  // registers then; -1 never
  bool registered = false;
  bool retiring = false;
  bool held_while_retiring = false;
  Ms exit_at = -1;
  int held = 0;
  Ms idle_since = 0;
  Ms added_at = 0;  // launched or unretired
  bool took_since_added = false;
  Ms last_work = -1;  // its last batch finished then (its result); -1 never
};

class Sim {
 public:
  Sim(const Trace& trace, const SimOptions& o)
      : o_(o),
        trace_(trace),
        policy_(o.policy),
        pool_(o.pool, "sim"),
        tick_(std::chrono::duration_cast<Millis>(o.tick).count()),
        poll_(std::chrono::duration_cast<Millis>(o.policy.poll).count()) {
    if (tick_ < 1 || tick_ > poll_ || poll_ % tick_ != 0) {
      throw std::invalid_argument("tick must be >= 1 ms and divide the poll interval");
    }
    if (o.concurrency < 1 || o.concurrency > 1024) {
      throw std::invalid_argument("concurrency must be in [1, 1024]");
    }
    if (o.metrics_lag_polls < 0) throw std::invalid_argument("metrics lag must be >= 0");
    for (const Arrival& a : trace.arrivals) AddBatch(0, a);
    floor_ = std::min(std::max(o.policy.min_workers, o.policy.min_survivors), o.policy.max_workers);
  }

  SimReport Run();

 private:
  TimePoint At(Ms t) const { return base_ + Millis(t); }
  void AddBatch(Ms offset, const Arrival& a) {
    batches_.push_back({offset + ToMs(a.at), std::max<Ms>(ToMs(a.processing), 0)});
    pending_.push_back(static_cast<int>(batches_.size()) - 1);
  }
  void SortPending() {
    std::stable_sort(pending_.begin() + static_cast<std::ptrdiff_t>(next_pending_), pending_.end(),
                     [&](int a, int b) { return batches_[a].arrive < batches_[b].arrive; });
  }
  void AddSlots(SimWorker& w) {
    for (int i = w.held; i < o_.concurrency; ++i) ready_.push_back(w.id);
  }
  void DropSlots(const std::string& id) { std::erase(ready_, id); }
  // Whether packed dispatch prefers `a` to `b`: holding work now beats
  // idle, then the later last work, then the lower id.
  // The broker's order (broker/dispatch_rule.cc): the worker whose result
  // came last first; workers that never reported come after all others, in
  // the order they registered.
  static bool MoreRecent(const SimWorker& a, const SimWorker& b) {
    if (a.last_work != b.last_work) return a.last_work > b.last_work;
    if (a.added_at != b.added_at) return a.added_at < b.added_at;
    return a.id < b.id;
  }
  void Dispatch(Ms t);
  void Poll(Ms t);
  Observation Snapshot(Ms t) const;
  int Inflight() const { return static_cast<int>(running_.size()); }

  const SimOptions& o_;
  const Trace& trace_;
  Policy policy_;
  PoolTracker pool_;
  Ms tick_;
  Ms poll_;
  int floor_ = 0;
  TimePoint base_ = TimePoint() + std::chrono::hours(1);

  std::vector<SimBatch> batches_;
  std::vector<int> pending_;  // batch indices by arrival
  std::size_t next_pending_ = 0;
  bool anchored_ = false;
  std::deque<int> queue_;
  std::map<std::string, SimWorker> workers_;
  std::deque<std::string> ready_;  // one entry per free slot
  // (finish, batch, worker), earliest first.
  std::priority_queue<std::tuple<Ms, int, std::string>,
                      std::vector<std::tuple<Ms, int, std::string>>, std::greater<>>
      running_;
  int failing_left_ = 0;
  double submitted_ = 0;
  double completed_ = 0;
  double psum_ = 0;
  std::deque<Observation> lagged_;
  static constexpr Ms kOfferedWindow = 10000;
  std::deque<std::pair<Ms, Ms>> recent_;  // (arrival, processing) in the last window
  Ms recent_work_ = 0;

  // Episode of backlog, for the reaction time.
  bool episode_ = false;
  Ms episode_start_ = 0;

  std::vector<int> pool_series_;
  int peak_ideal_ = 0;
  Ms last_result_ = -1;
  SimReport r_;
};

void Sim::Dispatch(Ms t) {
  while (!queue_.empty() && !ready_.empty()) {
    std::string id;
    if (o_.dispatch == DispatchOrder::kRoundRobin) {
      id = ready_.front();
      ready_.pop_front();
    } else {
      // Packing: the free slot of the worker that most recently had work.
      // Rejected: the most recently freed slot (ready_.back()), which sends
      // work to a worker that just registered before a busy one with a
      // free slot, spreading partial load again.
      auto best = ready_.end();
      for (auto it = ready_.begin(); it != ready_.end(); ++it) {
        if (best == ready_.end() || MoreRecent(workers_.at(*it), workers_.at(*best))) best = it;
      }
      id = *best;
      ready_.erase(best);
    }
    SimWorker& w = workers_.at(id);
    const int b = queue_.front();
    queue_.pop_front();
    batches_[b].dispatched = t;
    ++w.held;
    if (w.retiring) w.held_while_retiring = true;
    running_.emplace(t + batches_[b].processing, b, id);
    if (!w.took_since_added) {
      w.took_since_added = true;
      if (episode_ && w.added_at >= episode_start_) {
        const double reaction = ToS(t - episode_start_);
        if (r_.reactions == 0) r_.reaction_seconds = reaction;
        r_.reaction_max_seconds =
            r_.reactions == 0 ? reaction : std::max(r_.reaction_max_seconds, reaction);
        ++r_.reactions;
        episode_ = false;
      }
    }
  }
  if (queue_.empty()) {
    episode_ = false;
  } else if (!episode_) {
    episode_ = true;
    episode_start_ = t;
  }
}

Observation Sim::Snapshot(Ms t) const {
  Observation obs;
  const double s = ToS(t);
  obs.fresh = !(s >= o_.outage_from && s < o_.outage_to);
  if (!obs.fresh) return obs;
  obs.queued = static_cast<double>(queue_.size());
  obs.inflight = Inflight();
  for (const auto& [id, w] : workers_) {
    if (!w.registered) continue;
    WorkerObs wo;
    wo.id = id;
    wo.state = w.retiring ? BrokerWorkerState::kRetiring
                          : (w.held > 0 ? BrokerWorkerState::kBusy : BrokerWorkerState::kIdle);
    wo.idle_seconds = w.held > 0 ? 0.0 : ToS(t - w.idle_since);
    obs.workers.push_back(std::move(wo));
  }
  obs.submitted_total = submitted_;
  obs.completed_total = completed_;
  obs.processing_seconds_sum = psum_;
  obs.processing_seconds_count = completed_;
  return obs;
}

void Sim::Poll(Ms t) {
  const TimePoint now = At(t);
  lagged_.push_back(Snapshot(t));
  while (static_cast<int>(lagged_.size()) > o_.metrics_lag_polls + 1) lagged_.pop_front();
  Observation obs = lagged_.front();
  obs.control_queued = static_cast<double>(queue_.size());  // the control API is live

  const ObserveResult seen = pool_.Observe(obs, now);
  for (const std::string& id : seen.timed_out) {
    auto it = workers_.find(id);
    if (it != workers_.end()) {
      // A late registration may hold batches the broker would requeue.
      DropSlots(id);
      workers_.erase(it);
    }
    pool_.Forget(id, now);
  }

  const Decision d = policy_.Decide(obs, pool_, now);
  if (o_.on_decision) o_.on_decision(ToS(t), d);

  for (const std::string& id : d.unretire) {
    auto it = workers_.find(id);
    if (it == workers_.end() || !it->second.retiring) continue;  // refused: gone
    SimWorker& w = it->second;
    w.retiring = false;
    w.exit_at = -1;
    w.added_at = t;
    w.took_since_added = false;
    AddSlots(w);
    pool_.MarkUnretired(id, now);
    ++r_.unretires;
  }
  for (int i = 0; i < d.launch; ++i) {
    SimWorker w;
    w.id = pool_.Launch(now);
    w.ready_at = failing_left_ > 0 ? -1 : t + ToMs(o_.startup_seconds);
    if (failing_left_ > 0) --failing_left_;
    w.added_at = t;
    workers_.emplace(w.id, w);
    ++r_.launches;
  }
  for (const std::string& id : d.retire) {
    auto it = workers_.find(id);
    if (it == workers_.end() || !it->second.registered || it->second.retiring) continue;
    SimWorker& w = it->second;
    if (w.held > 0) {  // retire-if-idle: the broker refuses
      ++r_.retire_refused;
      continue;
    }
    w.retiring = true;
    w.exit_at = t + ToMs(o_.drain_seconds);
    DropSlots(id);
    pool_.MarkRetiring(id, now);
    ++r_.retires;
    if (!anchored_ && !trace_.after_first_retire.empty()) {
      anchored_ = true;
      for (const Arrival& a : trace_.after_first_retire) AddBatch(t, a);
      SortPending();
    }
  }

  const int pool = pool_.Counts().active();
  pool_series_.push_back(pool);
  r_.peak_pool = std::max(r_.peak_pool, pool);
  // The ideal pool: what the backlog calls for, or the work that arrived in
  // the last kOfferedWindow spread over it (the concurrency the trace
  // really offers), whichever is more.
  while (!recent_.empty() && recent_.front().first <= t - kOfferedWindow) {
    recent_work_ -= recent_.front().second;
    recent_.pop_front();
  }
  const double load = static_cast<double>(queue_.size()) + Inflight();
  const double offered = static_cast<double>(recent_work_) / static_cast<double>(kOfferedWindow);
  const double need = std::max(load / o_.policy.target_per_worker, offered);
  const int ideal = std::clamp(static_cast<int>(std::ceil(std::min(need, 1e6) - 1e-9)),
                               o_.policy.min_workers, o_.policy.max_workers);
  peak_ideal_ = std::max(peak_ideal_, ideal);
  r_.overshoot = std::max(r_.overshoot, pool - peak_ideal_);
}

SimReport Sim::Run() {
  failing_left_ = o_.failing_starts;
  r_.trace = trace_.name;
  r_.policy = PolicyKindName(o_.policy.kind);
  const Ms end = ToMs(o_.max_seconds);
  const double dt = ToS(tick_);
  Ms t = 0;
  for (; t <= end; t += tick_) {
    // Arrivals.
    while (next_pending_ < pending_.size() && batches_[pending_[next_pending_]].arrive <= t) {
      const int b = pending_[next_pending_++];
      queue_.push_back(b);
      ++submitted_;
      recent_.emplace_back(batches_[b].arrive, batches_[b].processing);
      recent_work_ += batches_[b].processing;
    }
    // Finishes.
    while (!running_.empty() && std::get<0>(running_.top()) <= t) {
      auto [finish, b, id] = running_.top();
      running_.pop();
      batches_[b].done = finish;
      completed_ += 1;
      psum_ += ToS(batches_[b].processing);
      last_result_ = std::max(last_result_, finish);
      auto wit = workers_.find(id);
      if (wit == workers_.end()) {
        // Its worker was killed (a start that timed out but had registered
        // unseen): the broker requeues the batch.
        batches_[b].dispatched = -1;
        queue_.push_front(b);
        continue;
      }
      SimWorker& w = wit->second;
      --w.held;
      w.last_work = finish;
      if (w.held == 0) w.idle_since = finish;
      if (!w.retiring) ready_.push_back(id);
    }
    // Registrations and exits; the launcher reaps exited workers.
    for (auto it = workers_.begin(); it != workers_.end();) {
      SimWorker& w = it->second;
      if (!w.registered && w.ready_at >= 0 && w.ready_at <= t) {
        w.registered = true;
        w.idle_since = t;
        AddSlots(w);
      }
      if (w.retiring && w.held == 0 && w.exit_at >= 0 && w.exit_at <= t) {
        if (w.held_while_retiring) ++r_.retired_while_holding;
        pool_.Forget(it->first, At(t));
        it = workers_.erase(it);
        continue;
      }
      ++it;
    }
    Dispatch(t);
    if (t % poll_ == 0) Poll(t);

    int live = 0;
    int idle = 0;
    for (const auto& [id, w] : workers_) {
      ++live;
      if (w.registered && w.held == 0) ++idle;
    }
    const bool all_done = next_pending_ == pending_.size() && queue_.empty() && running_.empty();
    if (all_done && live <= floor_) {
      if (last_result_ >= 0) r_.scale_down_seconds = ToS(t - last_result_);
      break;
    }
    r_.worker_seconds += live * dt;
    r_.idle_worker_seconds += idle * dt;
  }
  r_.end_seconds = ToS(std::min(t, end));

  for (const auto& [id, w] : workers_) {
    if (w.held_while_retiring) ++r_.retired_while_holding;
  }
  r_.batches = static_cast<int>(batches_.size());
  std::vector<double> waits;
  Ms first = -1;
  for (const SimBatch& b : batches_) {
    if (b.done >= 0) ++r_.completed;
    if (b.dispatched >= 0) waits.push_back(ToS(b.dispatched - b.arrive));
    if (b.dispatched >= 0 && (first < 0 || b.arrive < first)) first = b.arrive;
  }
  std::sort(waits.begin(), waits.end());
  auto rank = [&](double q) {
    if (waits.empty()) return 0.0;
    const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(waits.size())));
    return waits[std::min(waits.size() - 1, i == 0 ? 0 : i - 1)];
  };
  r_.p50_wait_seconds = rank(0.50);
  r_.p95_wait_seconds = rank(0.95);
  r_.max_wait_seconds = waits.empty() ? 0.0 : waits.back();
  r_.makespan_seconds = (first >= 0 && last_result_ >= 0) ? ToS(last_result_ - first) : 0.0;
  r_.peak_ideal = peak_ideal_;
  r_.start_failures = static_cast<int>(pool_.start_failures_total());

  int direction = 0;
  for (std::size_t i = 1; i < pool_series_.size(); ++i) {
    const int delta = pool_series_[i] - pool_series_[i - 1];
    if (delta == 0) continue;
    const int dir = delta > 0 ? 1 : -1;
    if (direction != 0 && dir != direction) ++r_.flaps;
    direction = dir;
  }
  return r_;
}

}  // namespace

std::string SimReport::ToKeyValues() const {
  std::string s;
  auto kv = [&](std::string_view key, auto value) { s += fmt::format("{}={}\n", key, value); };
  auto kvs = [&](std::string_view key, double value) {
    s += std::isnan(value) ? fmt::format("{}=nan\n", key) : fmt::format("{}={:.3f}\n", key, value);
  };
  kv("trace", trace);
  kv("policy", policy);
  kv("batches", batches);
  kv("completed", completed);
  kv("flaps", flaps);
  kvs("worker_seconds", worker_seconds);
  kvs("idle_worker_seconds", idle_worker_seconds);
  kvs("p50_wait_seconds", p50_wait_seconds);
  kvs("p95_wait_seconds", p95_wait_seconds);
  kvs("max_wait_seconds", max_wait_seconds);
  kv("retired_while_holding", retired_while_holding);
  kv("retire_refused", retire_refused);
  kv("peak_pool", peak_pool);
  kv("peak_ideal", peak_ideal);
  kv("overshoot", overshoot);
  kv("launches", launches);
  kv("unretires", unretires);
  kv("retires", retires);
  kv("start_failures", start_failures);
  kvs("reaction_seconds", reaction_seconds);
  kvs("reaction_max_seconds", reaction_max_seconds);
  kv("reactions", reactions);
  kvs("scale_down_seconds", scale_down_seconds);
  kvs("makespan_seconds", makespan_seconds);
  kvs("end_seconds", end_seconds);
  return s;
}

SimReport Simulate(const Trace& trace, const SimOptions& options) {
  Sim sim(trace, options);
  return sim.Run();
}

}  // namespace fleet::autoscaler

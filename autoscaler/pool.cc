#include "autoscaler/pool.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

namespace fleet::autoscaler {

bool Plausible(double v, double cap) { return std::isfinite(v) && v >= 0 && v <= cap; }

const char* PoolStateName(PoolState state) {
  switch (state) {
    case PoolState::kStarting:
      return "starting";
    case PoolState::kRunning:
      return "running";
    case PoolState::kRetiring:
      return "retiring";
    case PoolState::kStopping:
      return "stopping";
  }
  return "unknown";
}

PoolTracker::PoolTracker(PoolOptions options, std::string run_tag)
    : options_(std::move(options)), run_tag_(std::move(run_tag)) {}

bool PoolTracker::Owns(std::string_view id) const {
  return !options_.id_prefix.empty() && id.starts_with(options_.id_prefix);
}

std::string PoolTracker::Launch(TimePoint now) {
  std::string id = options_.id_prefix + run_tag_ + "-" + std::to_string(next_++);
  PoolEntry& e = entries_[id];
  e.id = id;
  e.state = PoolState::kStarting;
  e.launched_at = now;
  return id;
}

bool PoolTracker::AdoptLaunched(std::string_view id, TimePoint now) {
  if (entries_.find(id) != entries_.end()) return false;
  std::string key(id);
  forgotten_.erase(key);
  PoolEntry& e = entries_[key];
  e.id = std::move(key);
  e.state = PoolState::kStarting;
  e.adopted = true;
  e.launched_at = now;
  return true;
}

void PoolTracker::LaunchFailed(std::string_view id, TimePoint now) {
  auto it = entries_.find(id);
  if (it != entries_.end()) entries_.erase(it);
  StartFailure(now);
}

bool PoolTracker::MarkRetiring(std::string_view id, TimePoint now) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  it->second.state = PoolState::kRetiring;
  it->second.retired_at = now;
  it->second.own_change_at = now;
  return true;
}

bool PoolTracker::MarkUnretired(std::string_view id, TimePoint now) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  it->second.state = PoolState::kRunning;
  it->second.retired_at.reset();
  it->second.own_change_at = now;
  return true;
}

bool PoolTracker::MarkStopping(std::string_view id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  it->second.state = PoolState::kStopping;
  return true;
}

bool PoolTracker::Forget(std::string_view id, TimePoint now) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  // A start that timed out was already counted when it was reported.
  const bool crashed_before_registering =
      it->second.state == PoolState::kStarting && !it->second.registered_at;
  forgotten_[it->first] = now;
  entries_.erase(it);
  if (crashed_before_registering) StartFailure(now);
  return true;
}

void PoolTracker::StartFailure(TimePoint now) {
  ++failures_total_;
  ++consecutive_failures_;
  // initial * 2^(n-1), capped; computed in doubles so a long failure streak
  // cannot overflow the shift.
  const double initial = std::chrono::duration<double>(options_.backoff_initial).count();
  const double cap = std::chrono::duration<double>(options_.backoff_max).count();
  const double delay =
      std::min(cap, initial * std::pow(2.0, std::min(consecutive_failures_ - 1, 30)));
  launch_allowed_at_ =
      std::max(launch_allowed_at_,
               now + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(delay)));
}

ObserveResult PoolTracker::Observe(const Observation& obs, TimePoint now) {
  ObserveResult r;
  if (!obs.fresh) return r;

  std::unordered_map<std::string_view, BrokerWorkerState> at_broker;
  at_broker.reserve(obs.workers.size());
  for (const WorkerObs& w : obs.workers) at_broker.emplace(w.id, w.state);

  for (auto it = entries_.begin(); it != entries_.end();) {
    PoolEntry& e = it->second;
    auto seen = at_broker.find(e.id);
    const bool present = seen != at_broker.end();
    const bool retiring_there = present && seen->second == BrokerWorkerState::kRetiring;
    switch (e.state) {
      case PoolState::kStarting:
        if (present) {
          e.state = retiring_there ? PoolState::kRetiring : PoolState::kRunning;
          e.registered_at = now;
          if (e.launched_at && !e.adopted) {
            const double sample = SecondsBetween(*e.launched_at, now);
            startup_ewma_ = startup_ewma_ ? options_.startup_ewma_alpha * sample +
                                                (1 - options_.startup_ewma_alpha) * *startup_ewma_
                                          : sample;
          }
          consecutive_failures_ = 0;
          launch_allowed_at_ = TimePoint{};
          r.registered.push_back(e.id);
        } else if (e.launched_at && now - *e.launched_at >= options_.start_timeout) {
          e.state = PoolState::kStopping;
          StartFailure(now);
          r.timed_out.push_back(e.id);
        }
        break;
      case PoolState::kRunning:
      case PoolState::kRetiring:
        if (!present) {
          if (!e.missing_since) e.missing_since = now;
          if (now - *e.missing_since < options_.vanish_after) break;  // may come back
          forgotten_[e.id] = now;
          // Exited (drained after retire, crashed, or declared dead by the
          // broker). The loop makes sure the process is gone.
          r.vanished.push_back(e.id);
          it = entries_.erase(it);
          continue;
        }
        e.missing_since.reset();
        // Someone else (fleet-ctl) retired or unretired it: follow the
        // broker, but not the lagging echo of our own change.
        if (e.own_change_at && now - *e.own_change_at < options_.follow_holdoff) break;
        if (retiring_there && e.state == PoolState::kRunning) {
          e.state = PoolState::kRetiring;
          e.retired_at = now;
        } else if (!retiring_there && e.state == PoolState::kRetiring) {
          e.state = PoolState::kRunning;
          e.retired_at.reset();
          r.unretired.push_back(e.id);
        }
        break;
      case PoolState::kStopping:
        break;  // the launcher reports when it is gone (Forget)
    }
    if (present) at_broker.erase(seen);
    ++it;
  }

  std::erase_if(forgotten_,
                [&](const auto& kv) { return now - kv.second >= options_.forget_memory; });
  foreign_ = 0;
  foreign_retiring_ = 0;
  for (const WorkerObs& w : obs.workers) {
    if (!at_broker.contains(w.id)) continue;  // ours, handled above
    at_broker.erase(w.id);                    // a duplicate id counts once
    if (forgotten_.contains(w.id)) continue;  // reaped; the metrics lag behind
    const bool retiring = w.state == BrokerWorkerState::kRetiring;
    if (Owns(w.id)) {
      PoolEntry& e = entries_[w.id];
      e.id = w.id;
      e.adopted = true;
      e.registered_at = now;
      e.state = retiring ? PoolState::kRetiring : PoolState::kRunning;
      if (retiring) e.retired_at = now;
      r.adopted.push_back(w.id);
    } else if (retiring) {
      ++foreign_retiring_;
    } else {
      ++foreign_;
    }
  }
  return r;
}

double PoolTracker::StartupSeconds() const {
  return startup_ewma_.value_or(options_.startup_default_seconds);
}

PoolCounts PoolTracker::Counts() const {
  PoolCounts c;
  for (const auto& [id, e] : entries_) {
    switch (e.state) {
      case PoolState::kStarting:
        ++c.starting;
        break;
      case PoolState::kRunning:
        ++c.running;
        break;
      case PoolState::kRetiring:
        ++c.retiring;
        break;
      case PoolState::kStopping:
        ++c.stopping;
        break;
    }
  }
  c.foreign = foreign_;
  c.foreign_retiring = foreign_retiring_;
  return c;
}

const PoolEntry* PoolTracker::Find(std::string_view id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> PoolTracker::RetiringLongerThan(Duration grace, TimePoint now) const {
  std::vector<std::string> out;
  for (const auto& [id, e] : entries_) {
    if (e.state == PoolState::kRetiring && e.retired_at && now - *e.retired_at >= grace) {
      out.push_back(id);
    }
  }
  return out;
}

}  // namespace fleet::autoscaler

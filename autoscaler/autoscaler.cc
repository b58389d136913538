#include "autoscaler/autoscaler.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "common/zmq_util.h"

namespace fleet::autoscaler {

Autoscaler::Autoscaler(AutoscalerOptions options, std::string run_tag, Launcher& launcher,
                       MetricsSource& source, client::ControlClient& control,
                       AutoscalerMetrics& metrics)
    : options_(options),
      pool_(options.pool, std::move(run_tag)),
      policy_(options.policy),
      launcher_(launcher),
      source_(source),
      control_(control),
      metrics_(metrics) {}

std::optional<double> Autoscaler::ControlQueued() {
  auto r = control_.Call(proto::Control{0, "stats", {}}, options_.control_timeout);
  if (!r) return std::nullopt;
  auto* stats = std::get_if<proto::StatsReply>(&r->message);
  if (stats == nullptr) return std::nullopt;
  for (const auto& [name, value] : stats->values) {
    if (name == "queued") return value;
  }
  return std::nullopt;
}

bool Autoscaler::ControlOp(const char* op, const std::string& id, std::string* message,
                           bool* answered) {
  auto r = control_.Call(proto::Control{0, op, {id}}, options_.control_timeout);
  *answered = r.has_value();
  if (!r) {
    *message = "no answer from the broker";
    return false;
  }
  if (auto* reply = std::get_if<proto::ControlReply>(&r->message)) {
    *message = std::string(proto::ErrorCodeName(reply->code)) + ": " + std::string(reply->message);
    return reply->code == proto::ErrorCode::kOk;
  }
  if (auto* err = std::get_if<proto::Error>(&r->message)) {
    *message = std::string(proto::ErrorCodeName(err->code)) + ": " + std::string(err->message);
  }
  return false;
}

void Autoscaler::Step(TimePoint now, std::optional<double> demand) {
  for (const Exited& e : launcher_.Poll(now)) {
    spdlog::info("worker {} exited (status {})", e.id, e.status);
    const PoolEntry* entry = pool_.Find(e.id);
    if (entry != nullptr && entry->state == PoolState::kStarting) metrics_.StartFailure();
    pool_.Forget(e.id, now);
  }
  for (const std::string& id : launcher_.TakeAdopted()) {
    if (pool_.AdoptLaunched(id, now)) {
      spdlog::info("adopted worker {} from the {} launcher (left by an earlier run)", id,
                   launcher_.name());
    }
  }

  std::string error;
  Observation obs = source_.Read(&error);
  obs.demand_queued = demand;
  if (!obs.fresh) {
    metrics_.SourceError();
    obs.control_queued = ControlQueued();
    if (!source_failing_) {
      spdlog::warn("metrics from {} unusable ({}): scale-down frozen; scale-up from the "
                   "broker's stats (queued {})",
                   source_.Describe(), error,
                   obs.control_queued ? std::to_string(*obs.control_queued) : "unknown");
    }
    source_failing_ = true;
  } else if (source_failing_) {
    spdlog::info("metrics from {} readable again", source_.Describe());
    source_failing_ = false;
  }

  ObserveResult seen = pool_.Observe(obs, now);
  for (const auto& id : seen.registered) spdlog::info("worker {} registered", id);
  for (const auto& id : seen.adopted) spdlog::info("adopted worker {} found at the broker", id);
  for (const auto& id : seen.timed_out) {
    metrics_.StartFailure();
    spdlog::warn("worker {} did not register within {:.0f} s: killing it (launches back off "
                 "after {} consecutive failures)",
                 id, std::chrono::duration<double>(options_.pool.start_timeout).count(),
                 pool_.consecutive_start_failures());
    launcher_.Stop(id, Duration(0), now);
    pool_.MarkStopping(id);
  }
  for (const auto& id : seen.unretired) {
    spdlog::info("worker {} was taken back at the broker; it stays", id);
    launcher_.CancelStop(id);
  }
  for (const auto& id : seen.vanished) {
    // Gone from the broker (drained, or died): make sure the process is too.
    launcher_.Stop(id, options_.grace, now);
  }

  Decision d = policy_.Decide(obs, pool_, now);
  for (const auto& id : d.unretire) {
    std::string msg;
    bool answered = false;
    if (ControlOp("unretire", id, &msg, &answered)) {
      pool_.MarkUnretired(id, now);
      launcher_.CancelStop(id);
      spdlog::info("took back retiring worker {}", id);
    } else {
      spdlog::info("could not take back worker {} ({})", id, msg);
    }
  }
  for (int i = 0; i < d.launch; ++i) {
    std::string id = pool_.Launch(now);
    std::string err;
    if (launcher_.Start(id, now, &err)) {
      metrics_.Launched();
    } else {
      metrics_.StartFailure();
      pool_.LaunchFailed(id, now);
      spdlog::error("could not start worker {} with the {} launcher: {}", id, launcher_.name(),
                    err);
    }
  }
  for (const auto& id : d.retire) {
    std::string msg;
    bool answered = false;
    if (ControlOp("retire-if-idle", id, &msg, &answered)) {
      pool_.MarkRetiring(id, now);
      launcher_.Stop(id, options_.grace, now);
      metrics_.Retired();
    } else if (answered) {
      metrics_.RetireRefused();
      spdlog::info("broker refused to retire worker {} ({}); it stays", id, msg);
    } else {
      // It may have been retired all the same; the next fresh read says.
      spdlog::warn("no answer to retire-if-idle {} within {} ms; the next poll will tell", id,
                   options_.control_timeout.count());
    }
  }

  LogDecision(d, obs);
  metrics_.SetDesired(d.desired);
  PoolCounts c = pool_.Counts();
  metrics_.SetPool(c.starting, c.running + c.foreign, c.retiring + c.stopping);
  metrics_.Decision(d.action, d.reason_code);
  last_ = std::move(d);
}

void Autoscaler::LogDecision(const Decision& d, const Observation& obs) {
  // Every change is logged with its inputs; an unchanged hold only once.
  if (d.action == "hold" && d.reason_code == last_logged_) return;
  last_logged_ = d.action == "hold" ? d.reason_code : "";
  auto fmt = [](double v) { return std::isnan(v) ? std::string("?") : fmt::format("{:g}", v); };
  std::string ids;
  for (const auto& id : d.retire) ids += (ids.empty() ? "" : ",") + id;
  spdlog::info("decision {} ({}): desired {} pool {} (starting {}, retiring {}); load {} "
               "queued {} inflight {}{}{}{}; {}",
               d.action, d.reason_code, d.desired, d.pool, d.starting, d.retiring, fmt(d.load),
               fmt(obs.queued), fmt(obs.inflight),
               d.launch > 0 ? fmt::format("; launch {}", d.launch) : std::string(),
               d.unretire.empty() ? std::string() : fmt::format("; unretire {}", d.unretire.size()),
               ids.empty() ? std::string() : "; retire " + ids, d.reason);
}

int Autoscaler::Run(const Clock& clock, const std::function<bool()>& stop) {
  TimePoint next = clock.Now();
  std::optional<double> demand;
  bool watching = false;  // the pool is empty and idle: keep a wait-demand request out
  while (!stop()) {
    TimePoint now = clock.Now();
    if (now >= next || demand) {
      const bool woken = demand.has_value() && now < next;
      if (woken) spdlog::debug("woken by the broker: {:g} batches queued", *demand);
      Step(now, demand);
      demand.reset();
      next = now + options_.policy.poll;
      // Armed after a scheduled poll only, so the broker wakes us at most
      // once per interval whatever happens to the workers we start; and
      // not when this poll saw work it could not start a worker for (a
      // start backoff): the broker would answer at once.
      watching = watch_ != nullptr && !woken && pool_.Counts().active() == 0 &&
                 !(last_.load > 0);
      if (watching) watch_->Arm(now);
      continue;
    }
    // zmq_poll sleeps until the next poll, a reply on the watch, or a
    // signal (so SIGTERM is seen at once). A request that is due (none
    // could go out without a connection, or the one out is overdue) goes
    // when the socket is writable.
    TimePoint wake = next;
    short events = ZMQ_POLLIN;
    if (watching) {
      if (watch_->due(now)) {
        events |= ZMQ_POLLOUT;
      } else {
        wake = std::min(wake, watch_->overdue_at());
      }
    }
    zmq::pollitem_t item{watch_ != nullptr ? watch_->socket().handle() : nullptr, 0, events, 0};
    const int n = watch_ != nullptr ? 1 : 0;
    PollNoThrow(n > 0 ? &item : nullptr, n,
                std::chrono::duration_cast<Millis>(wake - now) + Millis(1));
    if (n == 0) continue;
    if (item.revents & ZMQ_POLLIN) {
      demand = watch_->Receive();
      // Workers of ours appeared since the request went out: the scheduled
      // poll sees to them.
      if (demand && pool_.Counts().active() > 0) demand.reset();
    }
    if (demand) {
      watching = false;
    } else if (watching && (item.revents & ZMQ_POLLOUT)) {
      watch_->Arm(clock.Now());
    }
  }
  std::vector<std::string> alive = launcher_.Alive();
  spdlog::info("stopping: draining {} workers (SIGTERM, then SIGKILL after {:.0f} s)",
               alive.size(), std::chrono::duration<double>(options_.grace).count());
  launcher_.StopAll(options_.grace);
  return 0;
}

}  // namespace fleet::autoscaler

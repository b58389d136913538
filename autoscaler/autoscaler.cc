#include "autoscaler/autoscaler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/zmq_util.h"
#include "fleet/errors.h"

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
      metrics_(metrics),
      reader_(source, options.metrics_timeout) {}

namespace {

std::chrono::milliseconds Left(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                               std::chrono::steady_clock::now());
}

}  // namespace

std::optional<double> Autoscaler::ControlQueued(ControlBudget& budget) {
  const auto left = std::min(options_.control_timeout, Left(budget.deadline));
  if (left.count() <= 0) {
    ++budget.skipped;
    return std::nullopt;
  }
  auto r = control_.Call(proto::Control{0, "stats", {}}, left);
  if (!r) return std::nullopt;
  auto* stats = std::get_if<proto::StatsReply>(&r->message);
  if (stats == nullptr) return std::nullopt;
  for (const auto& [name, value] : stats->values) {
    if (name == "queued") return value;
  }
  return std::nullopt;
}

bool Autoscaler::ControlOp(const char* op, const std::string& id, ControlBudget& budget,
                           std::string* message, bool* answered) {
  const auto left = std::min(options_.control_timeout, Left(budget.deadline));
  if (left.count() <= 0) {
    ++budget.skipped;
    *answered = false;
    *message = "not sent: this poll's time for control calls is spent";
    return false;
  }
  auto r = control_.Call(proto::Control{0, op, {id}}, left);
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

std::chrono::milliseconds Autoscaler::ControlTime() const {
  // Half a poll: a broker that does not answer must not take the whole
  // interval (a healthy one answers in well under a millisecond).
  return std::min(options_.control_timeout,
                  std::chrono::duration_cast<std::chrono::milliseconds>(options_.policy.poll) / 2);
}

TimePoint Autoscaler::Turn(TimePoint now, std::optional<double> demand) {
  if (demand) demand_ = demand;
  if (!poll_open_ && (now >= next_poll_ || demand_)) {
    poll_open_ = true;
    poll_woken_ = demand_.has_value() && now < next_poll_;
    if (poll_woken_) spdlog::debug("woken by the broker: {:g} batches queued", *demand_);
    next_poll_ = now + options_.policy.poll;
    // Wait for this poll's read at most a poll (a slow read must not stop
    // the decisions) and at most the read's deadline.
    decide_by_ = now + std::min<Duration>(options_.metrics_timeout, options_.policy.poll);
    // A read still running (slower than a poll, within its deadline) is
    // this poll's read; otherwise a new one starts, and whatever finished
    // before it is older than what it will bring.
    if (reader_.Start(now)) latest_.reset();
  }
  if (std::optional<MetricsRead> read = reader_.Take(now)) {
    NoteRead(*read);
    latest_ = std::move(read);
  }
  if (poll_open_ && (latest_ || now >= decide_by_)) {
    poll_open_ = false;
    last_woken_ = poll_woken_;
    std::optional<MetricsRead> read;
    read.swap(latest_);
    Decide(now, read ? &*read : nullptr, std::exchange(demand_, std::nullopt));
  }
  const TimePoint due = poll_open_ ? decide_by_ : next_poll_;
  return std::min(due, reader_.deadline());
}

void Autoscaler::NoteRead(const MetricsRead& read) {
  if (read.obs.fresh) {
    if (timeouts_in_a_row_ > 0) {
      spdlog::info("metrics from {} answer in time again (after {} timed-out reads)",
                   source_.Describe(), timeouts_in_a_row_);
    }
    timeouts_in_a_row_ = 0;
    return;
  }
  metrics_.SourceError();
  if (!read.timed_out) return;
  metrics_.SourceTimeout();
  // One line per outage; the counter has every one.
  if (timeouts_in_a_row_++ == 0) {
    spdlog::warn("metrics read from {} timed out: {}; it changes nothing (scale-down frozen, "
                 "scale-up from the broker's control stats) and the loop goes on",
                 source_.Describe(), read.error);
  }
}

void Autoscaler::Decide(TimePoint now, const MetricsRead* read, std::optional<double> demand) {
  ++decisions_;
  ControlBudget budget{std::chrono::steady_clock::now() + ControlTime()};
  for (const Exited& e : launcher_.Poll(now)) {
    if (e.error.empty()) {
      spdlog::info("worker {} exited (status {})", e.id, e.status);
    } else {
      spdlog::error("could not start worker {} with the {} launcher: {}", e.id, launcher_.name(),
                    e.error);
    }
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

  Observation obs = read != nullptr ? read->obs : Observation{};
  obs.demand_queued = demand;
  if (read == nullptr) {
    // The read is slower than a poll (within its deadline): decide without
    // it, as on a stale read.
    obs.control_queued = ControlQueued(budget);
    // After a timeout the warning said it all; the abandoned read may
    // still be running, and no new one starts until it returns.
    if (!waiting_logged_ && timeouts_in_a_row_ == 0) {
      spdlog::info("metrics read from {} still running after {:.0f} ms: deciding without it "
                   "(scale-down frozen) until one is in",
                   source_.Describe(), SecondsBetween(reader_.started(), now) * 1000);
    }
    waiting_logged_ = true;
  } else {
    waiting_logged_ = false;
    if (!obs.fresh) {
      obs.control_queued = ControlQueued(budget);
      if (!source_failing_ && !read->timed_out) {
        spdlog::warn("metrics from {} unusable ({}): scale-down frozen; scale-up from the "
                     "broker's stats (queued {})",
                     source_.Describe(), read->error,
                     obs.control_queued ? std::to_string(*obs.control_queued) : "unknown");
      }
      source_failing_ = true;
    } else if (source_failing_) {
      spdlog::info("metrics from {} readable again", source_.Describe());
      source_failing_ = false;
    }
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
    if (ControlOp("unretire", id, budget, &msg, &answered)) {
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
    // Accepted is enough: a start that fails later (the Docker launcher's
    // run off the loop) comes back from Poll as an exit, and the book
    // counts a start failure for it then.
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
    if (ControlOp("retire-if-idle", id, budget, &msg, &answered)) {
      pool_.MarkRetiring(id, now);
      launcher_.Stop(id, options_.grace, now);
      metrics_.Retired();
    } else if (answered) {
      metrics_.RetireRefused();
      spdlog::info("broker refused to retire worker {} ({}); it stays", id, msg);
    } else if (budget.skipped == 0) {
      // It may have been retired all the same; the next fresh read says.
      spdlog::warn("no answer to retire-if-idle {} within {} ms; the next poll will tell", id,
                   options_.control_timeout.count());
    }
  }
  if (budget.skipped > 0) {
    spdlog::warn("{} control calls not made: this poll's {} ms for them were spent (the broker "
                 "answers slowly or not at all); the next poll decides again",
                 budget.skipped, ControlTime().count());
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
  try {
    return Loop(clock, stop);
  } catch (const AuthenticationError&) {
    // The workers it started cannot be retired through the broker either.
    std::vector<std::string> alive = launcher_.Alive();
    spdlog::info("stopping: the broker refused us; stopping {} workers", alive.size());
    launcher_.StopAll(options_.grace);
    throw;
  }
}

int Autoscaler::Loop(const Clock& clock, const std::function<bool()>& stop) {
  std::optional<double> demand;
  bool watching = false;  // the pool is empty and idle: keep a wait-demand request out
  while (!stop()) {
    // A broker that refused our handshake never answers: stop, saying why,
    // rather than scale blind (throws fleet::AuthenticationError, and so
    // may any control call of Turn).
    control_.CheckHandshake();
    TimePoint now = clock.Now();
    const std::uint64_t before = decisions_;
    TimePoint wake = Turn(now, std::exchange(demand, std::nullopt));
    if (decisions_ != before) {
      // Armed after a scheduled poll only, so the broker wakes us at most
      // once per interval whatever happens to the workers we start; and
      // not when this poll saw work it could not start a worker for (a
      // start backoff): the broker would answer at once.
      watching = watch_ != nullptr && !last_woken_ && pool_.Counts().active() == 0 &&
                 !(last_.load > 0);
      if (watching) watch_->Arm(now);
    }
    if (wake <= now) continue;  // due again at once (a decision, then the next poll)
    // zmq_poll sleeps until the next deadline, a finished metrics read, a
    // reply on the watch, or a signal (so SIGTERM is seen at once). A
    // request that is due (none could go out without a connection, or the
    // one out is overdue) goes when the socket is writable.
    zmq::pollitem_t items[3] = {{nullptr, reader_.fd(), ZMQ_POLLIN, 0},
                                {control_.monitor().handle(), 0, ZMQ_POLLIN, 0},
                                {}};
    std::size_t n = 2;
    if (watch_ != nullptr) {
      short events = ZMQ_POLLIN;
      if (watching) {
        if (watch_->due(now)) {
          events |= ZMQ_POLLOUT;
        } else {
          wake = std::min(wake, watch_->overdue_at());
        }
      }
      items[n++] = {watch_->socket().handle(), 0, events, 0};
    }
    PollNoThrow(items, n, std::chrono::duration_cast<Millis>(wake - now) + Millis(1));
    if (n < 3) continue;
    const zmq::pollitem_t& item = items[2];
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

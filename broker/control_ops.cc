// The broker's control operations (the control socket, docs/protocol.md
// section 6): workers, stats, retire, retire-if-idle, unretire and
// wait-demand. Part of BrokerCore; see broker_core.h.
#include <spdlog/spdlog.h>

#include "broker/broker_core.h"
#include "broker/stats_table.h"

namespace fleet::broker {

using proto::ErrorCode;

void BrokerCore::OnControl(std::string_view identity, const proto::Control& m,
                           TimePoint now) {
  if (m.op == "workers" && m.args.empty()) return ReplyWorkers(identity, m.request_id, now);
  if (m.op == "stats" && m.args.empty()) return ReplyStats(identity, m.request_id);
  if (m.op == "retire") return OnRetire(identity, m, /*if_idle=*/false, now);
  if (m.op == "retire-if-idle") return OnRetire(identity, m, /*if_idle=*/true, now);
  if (m.op == "unretire") return OnUnretire(identity, m);
  if (m.op == "wait-demand") return OnWaitDemand(identity, m, now);
  Reply(identity, m.request_id, ErrorCode::kInvalidArgument,
        "unknown operation '" + std::string(m.op) +
            "' or wrong arguments (workers, stats, retire ID, retire-if-idle ID, unretire ID, "
            "wait-demand MS)");
}

void BrokerCore::OnWaitDemand(std::string_view identity, const proto::Control& m,
                              TimePoint now) {
  // One waiting request per peer and a few dozen in all: the autoscalers of
  // a deployment, not a flood of held replies.
  constexpr std::size_t kMaxDemandWaiters = 64;
  constexpr std::uint64_t kMaxWaitMs = 600'000;
  std::uint64_t ms = 0;
  bool valid = m.args.size() == 1 && !m.args[0].empty() && m.args[0].size() <= 7;
  for (char c : valid ? m.args[0] : std::string_view()) {
    if (c < '0' || c > '9') {
      valid = false;
      break;
    }
    ms = ms * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (!valid || ms == 0 || ms > kMaxWaitMs) {
    return Reply(identity, m.request_id, ErrorCode::kInvalidArgument,
                 "wait-demand takes the longest wait in milliseconds, 1 to 600000");
  }
  if (batches_.queued() > 0) {
    return Reply(identity, m.request_id, ErrorCode::kOk,
                 "demand queued=" + std::to_string(batches_.queued()));
  }
  const TimePoint deadline = now + Millis(ms);
  for (DemandWaiter& d : demand_waiters_) {
    if (d.identity == identity) {  // asked again: the newer request replaces it
      d.request_id = m.request_id;
      d.deadline = deadline;
      return;
    }
  }
  if (demand_waiters_.size() >= kMaxDemandWaiters) {
    return Reply(identity, m.request_id, ErrorCode::kTooLarge,
                 "more than " + std::to_string(kMaxDemandWaiters) +
                     " wait-demand requests pending");
  }
  demand_waiters_.push_back({std::string(identity), m.request_id, deadline});
}

void BrokerCore::AnswerDemand() {
  const std::string message = "demand queued=" + std::to_string(batches_.queued());
  for (const DemandWaiter& d : demand_waiters_) {
    Reply(d.identity, d.request_id, ErrorCode::kOk, message);
  }
  demand_waiters_.clear();
}

void BrokerCore::OnRetire(std::string_view identity, const proto::Control& m,
                          bool if_idle, TimePoint now) {
  if (m.args.size() != 1) {
    return Reply(identity, m.request_id, ErrorCode::kInvalidArgument,
                 std::string(m.op) + " takes one worker id");
  }
  Worker* w = workers_.Find(m.args[0]);
  if (w == nullptr) {
    return Reply(identity, m.request_id, ErrorCode::kUnknownWorker,
                 "no worker " + std::string(m.args[0]));
  }
  if (w->retiring) {
    return Reply(identity, m.request_id, ErrorCode::kOk,
                 "worker " + w->id + " is already retiring");
  }
  // The check and the state change are one step of the loop: no batch can
  // be dispatched to the worker between them.
  if (if_idle && !w->held.empty()) {
    ++counters_.retire_refused;
    return Reply(identity, m.request_id, ErrorCode::kBusy,
                 "worker " + w->id + " holds " + std::to_string(w->held.size()) +
                     " batches; not retired");
  }
  w->retiring = true;
  w->retired_at = now;
  w->credit = 0;
  blacklist_.Add(w->id, now);
  ++counters_.workers_retired;
  spdlog::info("worker {} retiring ({}; holds {} batches): blacklisted for {} s", w->id,
               if_idle ? "retire-if-idle" : "retire", w->held.size(),
               std::chrono::duration_cast<std::chrono::seconds>(blacklist_.ttl()).count());
  std::size_t held = w->held.size();
  StopIfDrained(*w, now);
  Reply(identity, m.request_id, ErrorCode::kOk,
        "worker " + w->id + " retiring; " +
            (held == 0 ? (w->stop_sent ? std::string("told to stop")
                                       : "stops in " +
                                             std::to_string(std::chrono::duration_cast<Millis>(
                                                                options_.retire_linger)
                                                                .count()) +
                                             " ms unless taken back")
                       : "stops after its " + std::to_string(held) + " batches"));
}

void BrokerCore::OnUnretire(std::string_view identity, const proto::Control& m) {
  if (m.args.size() != 1) {
    return Reply(identity, m.request_id, ErrorCode::kInvalidArgument,
                 "unretire takes one worker id");
  }
  Worker* w = workers_.Find(m.args[0]);
  if (w == nullptr) {
    return Reply(identity, m.request_id, ErrorCode::kUnknownWorker,
                 "no worker " + std::string(m.args[0]) + " connected");
  }
  if (!w->retiring) {
    return Reply(identity, m.request_id, ErrorCode::kNotRetiring,
                 "worker " + w->id + " is not retiring");
  }
  if (w->self_drain || w->stop_sent) {
    return Reply(identity, m.request_id, ErrorCode::kNotRetiring,
                 "worker " + w->id + " is already stopping");
  }
  w->retiring = false;
  blacklist_.Remove(w->id);
  spdlog::info("worker {} unretired: takes work again", w->id);
  // Its credit was zeroed at retirement: give back every free slot.
  std::uint32_t room = w->concurrency > w->held.size()
                           ? w->concurrency - static_cast<std::uint32_t>(w->held.size())
                           : 0;
  w->credit = room;
  workers_.MarkReady(*w);
  Reply(identity, m.request_id, ErrorCode::kOk, "worker " + w->id + " unretired");
}

void BrokerCore::ReplyWorkers(std::string_view identity, std::uint64_t request_id,
                              TimePoint now) {
  proto::WorkersReply reply;
  reply.request_id = request_id;
  std::vector<std::string> ids = workers_.Ids();
  for (const auto& id : ids) {
    Worker* w = workers_.Find(id);
    proto::WorkerInfo info{w->id, WorkerStateName(w->state()), w->concurrency,
                           static_cast<std::uint32_t>(w->held.size()), w->IdleSeconds(now),
                           w->processed, w->failed};
    info.slots = w->slots;
    reply.workers.push_back(info);
  }
  Send(Socket::kControl, identity, reply);
}

void BrokerCore::ReplyStats(std::string_view identity, std::uint64_t request_id) {
  proto::StatsReply reply;
  reply.request_id = request_id;
  auto depths = batches_.Depths();
  for (const auto& [name, depth] : depths) reply.queues.emplace_back(name, depth);
  for (const StatSpec& s : StatsTable()) {
    if (*s.stat != '\0') reply.values.emplace_back(s.stat, s.read(*this));
  }
  Send(Socket::kControl, identity, reply);
}

}  // namespace fleet::broker

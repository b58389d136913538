#include "broker/broker_core.h"

#include <algorithm>

#include "common/codec.h"

namespace fleet::broker {

using proto::ErrorCode;

const char* SocketName(Socket s) {
  switch (s) {
    case Socket::kFrontend: return "frontend";
    case Socket::kBackend: return "backend";
    case Socket::kControl: return "control";
  }
  return "?";
}

namespace {

// Routing ids are binary; logs show them in hex.
std::string Hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string JoinOr(const std::vector<std::string_view>& items, const char* none) {
  if (items.empty()) return none;
  std::string out;
  for (auto s : items) {
    if (!out.empty()) out += ',';
    out += s;
  }
  return out;
}

// Error texts sent to producers are cut to their last this many bytes, well
// under every client's decode limit.
constexpr std::size_t kMaxErrorBytes = 16u << 10;

bool ValidId(std::string_view id, std::size_t max) {
  return !id.empty() && id.size() <= max;
}

}  // namespace

BrokerCore::BrokerCore(const BrokerOptions& options)
    : options_(options),
      results_(options.result_retention, options.max_retained_results),
      blacklist_(options.blacklist_ttl) {}

Outbox::ProducerOut& BrokerCore::Out(std::string_view identity) {
  auto it = outbox_.producers.find(identity);
  if (it == outbox_.producers.end()) {
    it = outbox_.producers.emplace(std::string(identity), Outbox::ProducerOut{}).first;
  }
  return it->second;
}

void BrokerCore::Send(Socket socket, std::string_view identity,
                      const proto::Message& m) {
  proto::EncodeTo(m, &scratch_);
  outbox_.frames.push_back({socket, std::string(identity), scratch_});
}

void BrokerCore::SendToWorker(Worker& w, const proto::Message& m, TimePoint now) {
  Send(Socket::kBackend, w.identity, m);
  w.last_sent = now;
}

void BrokerCore::Reply(std::string_view identity, std::uint64_t request_id,
                       ErrorCode code, std::string message) {
  Send(Socket::kControl, identity, proto::ControlReply{request_id, code, message});
}

void BrokerCore::Reject(std::string_view identity, std::string_view id,
                        ErrorCode code, std::string message) {
  Out(identity).rejected.push_back(
      {std::string(id), code, std::move(message)});
}

void BrokerCore::OnBadInput(Socket socket, std::string_view identity,
                            ErrorCode code, std::string_view detail) {
  ++counters_.malformed;
  ++counters_.malformed_by_code[std::min<std::size_t>(static_cast<std::size_t>(code), 15)];
  // The first few are worth a warning; a flood must not flood the log.
  if (++bad_input_logged_ <= 20 || bad_input_logged_ % 1000 == 0) {
    spdlog::warn("rejected message on {} from peer {}: {} ({}); {} so far",
                 SocketName(socket), Hex(identity), detail,
                 proto::ErrorCodeName(code), counters_.malformed);
  }
  Send(socket, identity, proto::Error{code, detail});
}

void BrokerCore::OnMessage(Socket socket, std::string_view identity,
                           const proto::Message& message, TimePoint now) {
  switch (socket) {
    case Socket::kFrontend:
      if (auto* m = std::get_if<proto::Submit>(&message)) return OnSubmit(identity, *m, now);
      if (auto* m = std::get_if<proto::Fetch>(&message)) return OnFetch(identity, *m);
      break;
    case Socket::kBackend:
      if (auto* m = std::get_if<proto::Done>(&message)) return OnDone(identity, *m, now);
      if (std::holds_alternative<proto::Heartbeat>(message)) {
        if (Worker* w = workers_.FindByIdentity(identity)) {
          w->last_seen = now;
        } else {
          ++counters_.resets;
          Send(Socket::kBackend, identity, proto::Reset{"unknown worker: send HELLO"});
        }
        return;
      }
      if (auto* m = std::get_if<proto::Hello>(&message)) return OnHello(identity, *m, now);
      if (std::holds_alternative<proto::Drain>(message)) return OnDrain(identity, now);
      if (std::holds_alternative<proto::Bye>(message)) return OnBye(identity, now);
      break;
    case Socket::kControl:
      if (auto* m = std::get_if<proto::Control>(&message)) return OnControl(identity, *m, now);
      break;
  }
  OnBadInput(socket, identity, ErrorCode::kUnknownCommand,
             std::string("command ") +
                 std::to_string(static_cast<int>(proto::CommandOf(message))) +
                 " is not valid on the " + SocketName(socket) + " socket");
}

// ---- producers ----

void BrokerCore::OnSubmit(std::string_view identity, const proto::Submit& m,
                          TimePoint now) {
  Outbox::ProducerOut& out = Out(identity);
  for (const proto::SubmitItem& item : m.batches) {
    std::string_view queue = item.queue.empty() ? std::string_view("default") : item.queue;
    if (!ValidId(item.id, options_.max_id_bytes)) {
      ++counters_.rejected_invalid;
      Reject(identity, item.id, ErrorCode::kInvalidArgument, "batch id must not be empty");
      continue;
    }
    if (item.payload.size() > options_.max_batch_bytes) {
      ++counters_.rejected_too_large;
      Reject(identity, item.id, ErrorCode::kTooLarge,
             "payload of " + std::to_string(item.payload.size()) +
                 " bytes over --max-batch-bytes " + std::to_string(options_.max_batch_bytes));
      continue;
    }
    // A known id is never run twice: its one result goes to whoever asked
    // last (a producer that reconnected has a new routing id).
    if (auto stored = results_.Find(item.id)) {
      ++counters_.resubmitted;
      out.accepted.emplace_back(item.id);
      out.results.emplace_back(std::string(item.id), stored);
      continue;
    }
    if (auto seq = batches_.FindId(item.id)) {
      ++counters_.resubmitted;
      batches_.SetOwner(*seq, identity);
      out.accepted.emplace_back(item.id);
      continue;
    }
    if (batches_.queued() >= options_.max_queue) {
      ++counters_.rejected_queue_full;
      Reject(identity, item.id, ErrorCode::kQueueFull,
             "queue full: " + std::to_string(batches_.queued()) +
                 " batches waiting (--max-queue " + std::to_string(options_.max_queue) +
                 "); retry later");
      continue;
    }
    if (options_.max_inflight_per_producer > 0 &&
        batches_.OwnedBy(identity) >= options_.max_inflight_per_producer) {
      ++counters_.rejected_queue_full;
      Reject(identity, item.id, ErrorCode::kQueueFull,
             "queue full for this producer: " + std::to_string(batches_.OwnedBy(identity)) +
                 " of its batches unfinished (--max-inflight-per-producer " +
                 std::to_string(options_.max_inflight_per_producer) + "); retry later");
      continue;
    }
    if (batches_.bytes() + item.payload.size() > options_.max_queue_bytes) {
      ++counters_.rejected_queue_full;
      Reject(identity, item.id, ErrorCode::kQueueFull,
             "queue full: " + std::to_string(batches_.bytes()) +
                 " payload bytes held (--max-queue-bytes " +
                 std::to_string(options_.max_queue_bytes) + "); retry later");
      continue;
    }
    BatchSeq seq = batches_.Add(item.id, queue, item.payload, identity, now);
    if (journal_ != nullptr) JournalAccepted(*batches_.Get(seq), *journal_);
    ++counters_.submitted;
    out.accepted.emplace_back(item.id);
  }
}

void BrokerCore::OnFetch(std::string_view identity, const proto::Fetch& m) {
  Outbox::ProducerOut& out = Out(identity);
  for (std::string_view id : m.ids) {
    if (auto stored = results_.Find(id)) {
      out.results.emplace_back(std::string(id), stored);
    } else if (auto seq = batches_.FindId(id)) {
      batches_.SetOwner(*seq, identity);  // result comes later
    } else {
      out.unknown.emplace_back(id);
    }
  }
}

// ---- workers ----

void BrokerCore::OnHello(std::string_view identity, const proto::Hello& m,
                         TimePoint now) {
  if (!ValidId(m.worker_id, options_.max_id_bytes) || m.concurrency == 0) {
    OnBadInput(Socket::kBackend, identity, ErrorCode::kInvalidArgument,
               "HELLO needs a worker id and a concurrency of at least 1");
    return;
  }
  if (blacklist_.Contains(m.worker_id, now)) {
    ++counters_.blacklist_refusals;
    spdlog::info("worker {} is blacklisted (retired less than {} s ago): told to stop",
                 m.worker_id,
                 std::chrono::duration_cast<std::chrono::seconds>(blacklist_.ttl()).count());
    Send(Socket::kBackend, identity,
         proto::Stop{"blacklisted: this worker id was retired; it gets no work until its "
                     "blacklist entry expires"});
    return;
  }
  Worker* w = workers_.FindByIdentity(identity);
  if (w != nullptr && w->id != m.worker_id) {
    DropWorker(*w, "its connection re-registered under another id", now);
    w = nullptr;
  }
  if (w == nullptr) {
    if (Worker* old = workers_.Find(m.worker_id)) {
      // Same id on a new connection: a reconnect (or a restart). What the
      // old connection held goes back; if it still runs them, their late
      // results are accepted while the batches have no result.
      spdlog::warn("worker {} registered again from a new connection; requeueing the {} "
                   "batches of the old one",
                   m.worker_id, old->held.size());
      DropWorker(*old, "it reconnected", now);
    }
    w = &workers_.Add(m.worker_id, identity, now);
    ++counters_.workers_registered;
    spdlog::info("worker {} registered (concurrency {}, credit {}, queues {})", m.worker_id,
                 m.concurrency, m.credit,
                 JoinOr(m.queues, "all"));
  }
  w->concurrency = m.concurrency;
  w->queues.assign(m.queues.begin(), m.queues.end());
  std::uint32_t room = m.concurrency > w->held.size()
                           ? m.concurrency - static_cast<std::uint32_t>(w->held.size())
                           : 0;
  w->credit = std::min(m.credit, room);
  w->last_seen = now;
  SendToWorker(*w,
               proto::Welcome{static_cast<std::uint32_t>(
                                  std::chrono::duration_cast<Millis>(options_.heartbeat).count()),
                              options_.liveness},
               now);
  workers_.MarkReady(*w);
}

void BrokerCore::OnDone(std::string_view identity, const proto::Done& m, TimePoint now) {
  Worker* w = workers_.FindByIdentity(identity);
  for (const proto::DoneItem& item : m.results) Complete(item, w, now);
  if (w == nullptr) {
    // Results from a connection we no longer know (declared dead, or before
    // a broker restart) were taken above; it must register again.
    ++counters_.resets;
    Send(Socket::kBackend, identity, proto::Reset{"unknown worker: send HELLO"});
    return;
  }
  w->last_seen = now;
  std::uint64_t room = w->concurrency > w->held.size() ? w->concurrency - w->held.size() : 0;
  w->credit = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(w->credit) + m.credit, room));
  workers_.MarkReady(*w);
}

void BrokerCore::OnDrain(std::string_view identity, TimePoint now) {
  Worker* w = workers_.FindByIdentity(identity);
  if (w == nullptr) return;  // it is leaving anyway
  w->last_seen = now;
  spdlog::info("worker {} is draining on its own ({} batches held)", w->id, w->held.size());
  w->retiring = true;
  w->self_drain = true;
  w->credit = 0;
}

void BrokerCore::OnBye(std::string_view identity, TimePoint now) {
  Worker* w = workers_.FindByIdentity(identity);
  if (w == nullptr) return;
  spdlog::info("worker {} said goodbye (processed {}, failed {})", w->id, w->processed,
               w->failed);
  // Retired ids stay blacklisted for the TTL counted from their exit.
  if (w->retiring && !w->self_drain) blacklist_.Add(w->id, now);
  DropWorker(*w, "it left", now);
}

void BrokerCore::Release(Worker& w, BatchSeq seq, TimePoint now) {
  auto it = std::find(w.held.begin(), w.held.end(), seq);
  if (it == w.held.end()) return;
  *it = w.held.back();
  w.held.pop_back();
  if (w.held.empty()) {
    w.idle_since = now;
    StopIfDrained(w, now);
  }
}

void BrokerCore::StopIfDrained(Worker& w, TimePoint now) {
  if (!w.retiring || w.self_drain || w.stop_sent || !w.held.empty()) return;
  if (now < w.retired_at + options_.retire_linger) return;  // Tick comes back
  w.stop_sent = true;
  spdlog::info("worker {} retired and drained: told to stop", w.id);
  SendToWorker(w, proto::Stop{"retired"}, now);
}

void BrokerCore::Complete(const proto::DoneItem& item, Worker* reporter, TimePoint now) {
  if (reporter != nullptr) {
    ++reporter->processed;
    if (item.outcome != proto::Outcome::kOk) ++reporter->failed;
  }
  auto seq = batches_.FindId(item.id);
  if (!seq) {
    if (results_.Find(item.id) != nullptr) {
      ++counters_.duplicates;
      spdlog::debug("duplicate result for batch {} dropped", item.id);
    } else {
      ++counters_.unknown_results;
      spdlog::debug("result for unknown batch {} dropped", item.id);
    }
    return;
  }
  Batch* b = batches_.Get(*seq);
  if (b->state == BatchState::kRunning) {
    processing_seconds_.Observe(SecondsBetween(b->dispatched_at, now));
    if (Worker* holder = workers_.Find(b->worker)) Release(*holder, *seq, now);
  }
  // Views into the DONE frame; the store copies them.
  StoredResult r{item.outcome == proto::Outcome::kOk ? proto::Outcome::kOk
                                                    : proto::Outcome::kFailed,
                 std::max<std::uint32_t>(b->attempts, 1), item.result, item.error, now};
  std::string too_large;
  if (r.result.size() > options_.max_batch_bytes) {
    // Producers accept results as large as payloads, no larger.
    r.outcome = proto::Outcome::kFailed;
    too_large = "result of " + std::to_string(r.result.size()) +
                " bytes over --max-batch-bytes " + std::to_string(options_.max_batch_bytes);
    r.error = too_large;
    r.result = {};
  }
  if (r.error.size() > kMaxErrorBytes) {
    r.error.remove_prefix(r.error.size() - kMaxErrorBytes);  // the tail says most
  }
  if (r.outcome == proto::Outcome::kOk) {
    ++counters_.completed_ok;
  } else {
    ++counters_.completed_failed;
  }
  Out(b->owner).results.emplace_back(b->id, results_.Put(b->id, r));
  JournalFinished(b->id);
  batches_.Erase(*seq);
}

void BrokerCore::FinishFailed(BatchSeq seq, std::string error, TimePoint now) {
  Batch* b = batches_.Get(seq);
  ++counters_.completed_failed;
  Out(b->owner).results.emplace_back(
      b->id, results_.Put(b->id, StoredResult{proto::Outcome::kFailed, b->attempts, "",
                                              error, now}));
  JournalFinished(b->id);
  batches_.Erase(seq);
}

// ---- journal ----
// Records: kAccepted = u32 id length | id | u32 queue length | queue | payload;
// kFinished = id; kDispatched = u32 attempts | id (the attempt count, so a
// restart does not give a batch a fresh set of attempts).

namespace {

constexpr std::uint8_t kAccepted = 1;
constexpr std::uint8_t kFinished = 2;
constexpr std::uint8_t kDispatched = 3;

void PutField(std::string& out, std::string_view s) {
  PutLe32(out, static_cast<std::uint32_t>(s.size()));
  out.append(s);
}

bool TakeField(std::string_view& in, std::string_view* field) {
  if (in.size() < 4) return false;
  const std::uint32_t n = ReadLe32(in.data());
  if (in.size() - 4 < n) return false;
  *field = in.substr(4, n);
  in.remove_prefix(4 + n);
  return true;
}

}  // namespace

void BrokerCore::JournalAccepted(const Batch& b, Journal& journal) const {
  std::string& body = journal_scratch_;
  body.clear();
  PutField(body, b.id);
  PutField(body, b.queue);
  body.append(b.payload);
  journal.Append(kAccepted, body);
}

void BrokerCore::JournalDispatched(const Batch& b, Journal& journal) const {
  // Not synced on its own either: a lost one only leaves the count lower.
  std::string& body = journal_scratch_;
  body.clear();
  PutLe32(body, b.attempts);
  body.append(b.id);
  journal.Append(kDispatched, body, /*must_sync=*/false);
}

void BrokerCore::JournalFinished(std::string_view id) {
  // Not synced on its own: lost in a crash, the batch only runs again.
  if (journal_ != nullptr) journal_->Append(kFinished, id, /*must_sync=*/false);
}

void BrokerCore::Restore(std::uint8_t type, std::string_view body, TimePoint now) {
  if (type == kAccepted) {
    std::string_view id, queue;
    if (!TakeField(body, &id) || !TakeField(body, &queue) || id.empty()) {
      throw JournalError("journal: unreadable accepted-batch record");
    }
    // A batch can appear twice (a compaction cut short by a crash): once
    // is enough. Its producer is unknown until it re-sends or fetches.
    if (!batches_.FindId(id)) {
      batches_.Add(id, queue.empty() ? std::string_view("default") : queue, body, "", now);
    }
  } else if (type == kFinished) {
    if (auto seq = batches_.FindId(body)) batches_.Erase(*seq);
  } else if (type == kDispatched) {
    if (body.size() < 5) throw JournalError("journal: unreadable dispatched-batch record");
    const std::uint32_t attempts = ReadLe32(body.data());
    if (auto seq = batches_.FindId(body.substr(4))) {
      Batch* b = batches_.Get(*seq);
      b->attempts = std::max(b->attempts, attempts);
    }
  } else {
    throw JournalError("journal: unknown record type " + std::to_string(type));
  }
}

void BrokerCore::Snapshot(Journal& journal) const {
  for (const Batch* b : batches_.InOrder()) {
    JournalAccepted(*b, journal);
    if (b->attempts > 0) JournalDispatched(*b, journal);
  }
}

std::size_t BrokerCore::FinishRestore(TimePoint now) {
  // A batch that was running its last attempt when the broker stopped has
  // used them all, as if its worker had died: dead-letter it now. Its
  // producer fetches the result.
  std::vector<BatchSeq> exhausted;
  for (const Batch* b : batches_.InOrder()) {
    if (b->attempts >= options_.max_attempts) exhausted.push_back(*batches_.FindId(b->id));
  }
  for (BatchSeq seq : exhausted) {
    Batch* b = batches_.Get(seq);
    ++counters_.dead_lettered;
    ++counters_.completed_failed;
    spdlog::warn("batch {} dead-lettered after {} attempts (the broker stopped during the last)",
                 b->id, b->attempts);
    results_.Put(b->id, StoredResult{proto::Outcome::kFailed, b->attempts, "",
                                     "dead-lettered after " + std::to_string(b->attempts) +
                                         " attempts; the broker stopped during the last",
                                     now});
    JournalFinished(b->id);
    batches_.Erase(seq);
  }
  return exhausted.size();
}

void BrokerCore::Requeue(BatchSeq seq, std::string_view why, TimePoint now) {
  Batch* b = batches_.Get(seq);
  if (b == nullptr || b->state != BatchState::kRunning) return;
  if (b->attempts >= options_.max_attempts) {
    ++counters_.dead_lettered;
    spdlog::warn("batch {} dead-lettered after {} attempts (last worker {}: {})", b->id,
                 b->attempts, b->worker.view(), why);
    FinishFailed(seq,
                 "dead-lettered after " + std::to_string(b->attempts) + " attempts; last worker " +
                     std::string(b->worker.view()) + " " + std::string(why),
                 now);
    return;
  }
  ++counters_.requeued;
  batches_.Requeue(seq);
}

void BrokerCore::DropWorker(Worker& w, std::string_view why, TimePoint now) {
  if (!w.held.empty()) {
    spdlog::info("worker {}: requeueing {} batches because {}", w.id, w.held.size(), why);
  }
  std::vector<BatchSeq> held;
  held.swap(w.held);
  std::string id = w.id;
  workers_.Remove(id);  // `w` dangles from here on
  for (BatchSeq seq : held) Requeue(seq, why, now);
}

void BrokerCore::OnDispatchFailed(std::string_view worker_id, TimePoint now) {
  Worker* w = workers_.Find(worker_id);
  if (w == nullptr) return;
  ++counters_.undeliverable;
  spdlog::warn("could not send to worker {} (gone, or not reading): dropping it", w->id);
  // The unsent batches never reached it: back to the front, no attempt used.
  for (BatchSeq seq : w->outgoing) {
    if (Batch* b = batches_.Get(seq)) {
      if (b->attempts > 0) --b->attempts;
      auto it = std::find(w->held.begin(), w->held.end(), seq);
      if (it != w->held.end()) w->held.erase(it);
      batches_.Requeue(seq);
    }
  }
  w->outgoing.clear();
  DropWorker(*w, "became unreachable", now);
}

bool BrokerCore::CanDispatch() const { return batches_.queued() > 0; }

void BrokerCore::Pump(TimePoint now) {
  if (batches_.queued() == 0) return;
  if (!demand_waiters_.empty()) AnswerDemand();
  std::vector<std::string> no_work;  // ready workers whose queues are empty
  while (batches_.queued() > 0) {
    std::optional<std::string> id = workers_.NextReady();
    if (!id) break;
    Worker* w = workers_.Find(*id);
    if (w->credit == 0 || w->retiring) continue;
    std::optional<BatchSeq> seq = batches_.Pop(w->queues);
    if (!seq) {
      no_work.push_back(std::move(*id));
      continue;
    }
    Batch* b = batches_.Get(*seq);
    if (w->retiring) ++counters_.dispatched_to_retiring;  // never, by the check above
    wait_seconds_.Observe(SecondsBetween(b->enqueued_at, now));
    ++b->attempts;
    if (journal_ != nullptr) JournalDispatched(*b, *journal_);
    batches_.SetWorker(*seq, w->id);
    b->dispatched_at = now;
    --w->credit;
    w->held.push_back(*seq);
    if (w->outgoing.empty()) outbox_.dispatch_workers.push_back(w->id);
    w->outgoing.push_back(*seq);
    w->last_sent = now;
    workers_.MarkReady(*w);  // back of the round robin while it has credit
  }
  for (const auto& id : no_work) {
    if (Worker* w = workers_.Find(id)) workers_.MarkReady(*w);
  }
}

void BrokerCore::Tick(TimePoint now) {
  const Duration dead_after = options_.heartbeat * options_.liveness;
  std::vector<std::string> dead;
  workers_.ForEach([&](Worker& w) {
    if (now - w.last_seen > dead_after) {
      dead.push_back(w.id);
      return;
    }
    StopIfDrained(w, now);  // retired and idle past the linger
    if (now - w.last_sent >= options_.heartbeat) {
      SendToWorker(w, proto::Heartbeat{}, now);
    }
  });
  for (const auto& id : dead) {
    Worker* w = workers_.Find(id);
    ++counters_.workers_dead;
    spdlog::warn("worker {} silent for {:.1f} s: declared dead, {} batches requeued", id,
                 SecondsBetween(w->last_seen, now), w->held.size());
    DropWorker(*w, "stopped heartbeating", now);
  }
  blacklist_.Purge(now);
  // wait-demand requests past their deadline get "no demand"; the client
  // asks again if it still wants to know.
  std::erase_if(demand_waiters_, [&](const DemandWaiter& d) {
    if (now < d.deadline) return false;
    Reply(d.identity, d.request_id, ErrorCode::kOk, "no demand");
    return true;
  });
}

void BrokerCore::AfterFlush(TimePoint now) { results_.Trim(now); }

// ---- control ----

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
    reply.workers.push_back({w->id, WorkerStateName(w->state()), w->concurrency,
                             static_cast<std::uint32_t>(w->held.size()), w->IdleSeconds(now),
                             w->processed, w->failed});
  }
  Send(Socket::kControl, identity, reply);
}

void BrokerCore::ReplyStats(std::string_view identity, std::uint64_t request_id) {
  proto::StatsReply reply;
  reply.request_id = request_id;
  auto depths = batches_.Depths();
  for (const auto& [name, depth] : depths) reply.queues.emplace_back(name, depth);
  auto by_state = workers_.CountByState();
  const Counters& c = counters_;
  reply.values = {
      {"queued", static_cast<double>(batches_.queued())},
      {"inflight", static_cast<double>(batches_.running())},
      {"workers_idle", static_cast<double>(by_state[0])},
      {"workers_busy", static_cast<double>(by_state[1])},
      {"workers_retiring", static_cast<double>(by_state[2])},
      {"blacklisted", static_cast<double>(blacklist_.size())},
      {"submitted", static_cast<double>(c.submitted)},
      {"completed_ok", static_cast<double>(c.completed_ok)},
      {"completed_failed", static_cast<double>(c.completed_failed)},
      {"dead_lettered", static_cast<double>(c.dead_lettered)},
      {"requeued", static_cast<double>(c.requeued)},
      {"duplicates", static_cast<double>(c.duplicates)},
      {"resubmitted", static_cast<double>(c.resubmitted)},
      {"rejected", static_cast<double>(c.rejected_queue_full + c.rejected_too_large +
                                       c.rejected_invalid)},
      {"rejected_queue_full", static_cast<double>(c.rejected_queue_full)},
      {"malformed", static_cast<double>(c.malformed)},
      {"undeliverable", static_cast<double>(c.undeliverable)},
      {"workers_dead", static_cast<double>(c.workers_dead)},
      {"workers_retired", static_cast<double>(c.workers_retired)},
      {"retire_refused", static_cast<double>(c.retire_refused)},
      {"blacklist_refusals", static_cast<double>(c.blacklist_refusals)},
      {"results_retained", static_cast<double>(results_.size())},
  };
  Send(Socket::kControl, identity, reply);
}

}  // namespace fleet::broker

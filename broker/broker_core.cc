#include "broker/broker_core.h"

#include <algorithm>

#include "broker/journal_records.h"
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
  return outbox_.For(identity);
}

void BrokerCore::Send(Socket socket, std::string_view identity,
                      const proto::Message& m) {
  // Encoded in place: the frame's body is the only copy until the send.
  outbox_.frames.push_back({socket, std::string(identity), {}});
  proto::EncodeTo(m, &outbox_.frames.back().body);
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
                            ErrorCode code, std::string_view detail,
                            std::optional<std::uint64_t> request_id) {
  ++counters_.malformed;
  ++counters_.malformed_by_code[std::min<std::size_t>(static_cast<std::size_t>(code), 15)];
  // The first few are worth a warning; a flood must not flood the log.
  if (++bad_input_logged_ <= 20 || bad_input_logged_ % 1000 == 0) {
    spdlog::warn("rejected message on {} from peer {}: {} ({}); {} so far",
                 SocketName(socket), Hex(identity), detail,
                 proto::ErrorCodeName(code), counters_.malformed);
  }
  // A control client matches answers by request id: one it can match must
  // carry it, or a late ERROR could pass for the answer to a later call.
  if (socket == Socket::kControl && request_id) {
    Reply(identity, *request_id, code, std::string(detail));
    return;
  }
  Send(socket, identity, proto::Error{code, detail});
}

void BrokerCore::OnMessage(Socket socket, std::string_view identity,
                           const proto::Message& message, TimePoint now) {
  switch (socket) {
    case Socket::kFrontend:
      if (auto* m = std::get_if<proto::Submit>(&message)) return OnSubmit(identity, *m, now);
      if (auto* m = std::get_if<proto::Fetch>(&message)) return OnFetch(identity, *m);
      if (auto* m = std::get_if<proto::ObjectReply>(&message)) {
        return OnObjectReply(identity, *m, now);
      }
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
      if (auto* m = std::get_if<proto::ObjectGet>(&message)) return OnObjectGet(identity, *m, now);
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
    // last (a producer that reconnected has a new routing id). The id is
    // hashed once for both stores and the new batch's index entry.
    const std::uint32_t hash = IdIndex::HashOf(item.id);
    if (auto stored = results_.Find(item.id, hash)) {
      ++counters_.resubmitted;
      out.accepted.emplace_back(item.id);
      out.results.emplace_back(std::string(item.id), stored);
      continue;
    }
    if (auto seq = batches_.FindId(item.id, hash)) {
      ++counters_.resubmitted;
      batches_.SetOwner(*seq, identity);
      if (const Batch* b = batches_.Get(*seq); b->state == BatchState::kPending) {
        // Answered with its write: the one out (SealCommit gave it a
        // segment), or the next.
        (b->journal_segment != 0 ? sealed_acks_ : open_acks_)
            .push_back({std::string(identity), *seq});
      } else {
        out.accepted.emplace_back(item.id);
      }
      continue;
    }
    if (batches_.queued() + batches_.pending() >= options_.max_queue) {
      ++counters_.rejected_queue_full;
      Reject(identity, item.id, ErrorCode::kQueueFull,
             "queue full: " + std::to_string(batches_.queued() + batches_.pending()) +
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
    // Last: a batch another cap refuses must not make the journal turn
    // unavailable.
    if (journal_ != nullptr &&
        !journal_->Admit(Journal::RecordBytes(
            records::AcceptedBytes(item.id, queue, item.payload)))) {
      ++counters_.rejected_disk_full;
      Reject(identity, item.id, ErrorCode::kDiskFull,
             journal_->accepting()
                 ? "no room on the broker's disk for a batch of " +
                       std::to_string(item.payload.size()) +
                       " bytes now (smaller ones still get in): retry later"
                 : "the broker cannot write its journal (" +
                       ErrnoText(journal_->problem_errno()) +
                       "); it accepts again by itself once it can: retry later");
      continue;
    }
    BatchSeq seq = batches_.Add(item.id, hash, queue, item.payload, identity, now, off_loop_);
    if (journal_ != nullptr) {
      JournalAccepted(*batches_.Get(seq));
      uncommitted_.push_back(seq);
    }
    ++counters_.submitted;
    if (off_loop_) {
      open_acks_.push_back({std::string(identity), seq});
    } else {
      out.accepted.emplace_back(item.id);
    }
  }
}

void BrokerCore::OnFetch(std::string_view identity, const proto::Fetch& m) {
  Outbox::ProducerOut& out = Out(identity);
  for (std::string_view id : m.ids) {
    const std::uint32_t hash = IdIndex::HashOf(id);
    if (auto stored = results_.Find(id, hash)) {
      out.results.emplace_back(std::string(id), stored);
    } else if (auto seq = batches_.FindId(id, hash)) {
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
      // The id is registered on another connection. The same process
      // reconnecting (same incarnation), or an old connection that has
      // missed its heartbeats (its process is gone: a quick restart), is
      // replaced. A live one keeps its registration, its batches and its
      // credit, and the newcomer is refused: two processes must not share
      // an id. The old connection is sent a HEARTBEAT at once: if it is
      // gone, that send fails, the loop drops it, and the newcomer's next
      // HELLO gets in.
      const bool same_run = !m.incarnation.empty() && m.incarnation == old->incarnation;
      const Duration silent = now - old->last_seen;
      if (!same_run && silent <= kDuplicateSilence * options_.heartbeat) {
        ++counters_.duplicate_worker_refusals;
        spdlog::warn("refused a HELLO for worker {} from a new connection: the id is "
                     "registered on a live connection (heard from {} ms ago); give every "
                     "worker its own --id",
                     m.worker_id, std::chrono::duration_cast<Millis>(silent).count());
        Send(Socket::kBackend, identity,
             proto::Error{ErrorCode::kDuplicateWorker,
                          "worker id " + std::string(m.worker_id) +
                              " is registered on another live connection; not registered"});
        SendToWorker(*old, proto::Heartbeat{}, now);
        return;
      }
      spdlog::warn("worker {} registered again from a new connection ({}); requeueing the {} "
                   "batches of the old one",
                   m.worker_id,
                   same_run ? "the same process reconnected"
                            : "the old connection was silent for " +
                                  std::to_string(
                                      std::chrono::duration_cast<Millis>(silent).count()) +
                                  " ms",
                   old->held.size());
      DropWorker(*old, same_run ? "it reconnected" : "a new process took over its id", now);
    }
    w = &workers_.Add(m.worker_id, identity, now);
    ++counters_.workers_registered;
    spdlog::info("worker {} registered (slots {}, prefetch {}, credit {}, queues {})",
                 m.worker_id, std::min(m.slots == 0 ? m.concurrency : m.slots, m.concurrency),
                 m.concurrency - std::min(m.slots == 0 ? m.concurrency : m.slots, m.concurrency),
                 m.credit, JoinOr(m.queues, "all"));
  }
  w->concurrency = m.concurrency;
  w->slots = std::min(m.slots == 0 ? m.concurrency : m.slots, m.concurrency);
  w->incarnation.assign(m.incarnation);
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
  // A worker that just reported results is the most recently busy one: the
  // dispatch rule tries it first (broker/dispatch_rule.cc).
  workers_.MarkReady(*w, m.results.empty() ? WorkerRegistry::Recency::kKeep
                                           : WorkerRegistry::Recency::kJustBusy);
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
  // Batch::held_index says where `seq` is in w.held; the last entry moves
  // into its place (and its batch learns its new index).
  const Batch* b = batches_.Get(seq);
  const std::uint32_t i = b != nullptr ? b->held_index : 0;
  if (b == nullptr || i >= w.held.size() || w.held[i] != seq) return;
  w.held[i] = w.held.back();
  w.held.pop_back();
  if (i < w.held.size()) {
    if (Batch* moved = batches_.Get(w.held[i])) moved->held_index = i;
  }
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
  const std::uint32_t hash = IdIndex::HashOf(item.id);
  auto seq = batches_.FindId(item.id, hash);
  if (!seq) {
    if (results_.Find(item.id, hash) != nullptr) {
      ++counters_.duplicates;
      spdlog::debug("duplicate result for batch {} dropped", item.id);
    } else {
      ++counters_.unknown_results;
      spdlog::debug("result for unknown batch {} dropped", item.id);
    }
    return;
  }
  Batch* b = batches_.Get(*seq);
  if (b->state == BatchState::kPending) {
    // Accepted again but not on disk yet, so no worker holds it: a result
    // from an earlier life of the id. It runs again (it may be taken back).
    ++counters_.duplicates;
    return;
  }
  if (item.outcome == proto::Outcome::kRetry) {
    // The worker could not finish it (its handler process died): another
    // try, counted like a worker's death, but only for the attempt running
    // now on the worker that holds it (a late one from an earlier holder,
    // or for an earlier attempt, changes nothing).
    if (b->state != BatchState::kRunning || reporter == nullptr ||
        b->worker.view() != std::string_view(reporter->id) || item.attempt != b->attempts) {
      ++counters_.duplicates;
      return;
    }
    Release(*reporter, *seq, now);
    std::string why = "asked for a retry: ";
    why.append(item.error.substr(0, 1024));
    Requeue(*seq, why, now);
    return;
  }
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
  Out(b->owner).results.emplace_back(b->id, results_.Put(b->id, b->id_hash, r));
  JournalFinished(*b);
  batches_.Erase(*seq);
}

void BrokerCore::FinishFailed(BatchSeq seq, std::string error, TimePoint now) {
  Batch* b = batches_.Get(seq);
  ++counters_.completed_failed;
  Out(b->owner).results.emplace_back(
      b->id, results_.Put(b->id, b->id_hash,
                          StoredResult{proto::Outcome::kFailed, b->attempts, "", error, now}));
  JournalFinished(*b);
  batches_.Erase(seq);
}

// ---- journal (record format: broker/journal_records.h) ----

void BrokerCore::JournalAccepted(Batch& b) {
  records::EncodeAcceptedHead(&journal_scratch_, b.id, b.queue);
  journal_->Append(records::kAccepted, {journal_scratch_, b.payload});
  if (off_loop_) return;  // its segment is the one SealCommit's write goes to
  b.journal_segment = journal_->active_segment();
  journal_->AddLive(b.journal_segment, JournalBytes(b));
}

void BrokerCore::SealCommit() {
  // One write is out at a time, so the last one's batches were settled by
  // AfterCommit before this one started.
  const std::uint64_t segment = journal_->active_segment();
  std::uint64_t bytes = 0;
  std::uint64_t count = 0;
  for (BatchSeq seq : uncommitted_) {
    if (Batch* b = batches_.Get(seq)) {
      b->journal_segment = segment;
      bytes += JournalBytes(*b);
      ++count;
    }
  }
  if (count > 0) journal_->AddLive(segment, bytes, count);
  sealed_.swap(uncommitted_);
  uncommitted_.clear();
  sealed_acks_.swap(open_acks_);
  open_acks_.clear();
}

void BrokerCore::AfterStartWrite(Journal::StartResult result, TimePoint now) {
  switch (result) {
    case Journal::StartResult::kStarted: SealCommit(); break;
    case Journal::StartResult::kRefused:
      SealCommit();
      AfterCommit(Journal::CommitResult::kRefused, now);
      break;
    case Journal::StartResult::kNothing: break;
  }
}

std::uint64_t BrokerCore::JournalBytes(const Batch& b) {
  return Journal::RecordBytes(records::AcceptedBytes(b.id, b.queue, b.payload));
}

void BrokerCore::JournalDispatched(const Batch& b, Journal& journal) const {
  // Not synced on its own either: a lost one only leaves the count lower.
  char attempts[4];
  records::StoreAttempts(attempts, b.attempts);
  journal.Append(records::kDispatched, {std::string_view(attempts, 4), b.id},
                 /*must_sync=*/false);
}

void BrokerCore::NoteAttempts(Batch& b, BatchSeq seq) {
  if (!off_loop_) {
    JournalDispatched(b, *journal_);
    return;
  }
  if (b.attempts_due) return;
  b.attempts_due = true;
  attempts_due_.push_back(seq);
}

void BrokerCore::AppendDueRecords() {
  for (BatchSeq seq : attempts_due_) {
    // A batch finished since has no record to write (Get: not held).
    if (Batch* b = batches_.Get(seq)) {
      b->attempts_due = false;
      JournalDispatched(*b, *journal_);
    }
  }
  attempts_due_.clear();
}

void BrokerCore::JournalFinished(const Batch& b) {
  if (journal_ == nullptr) return;
  // Not synced on its own: lost in a crash, the batch only runs again.
  // Batches finishing in a row share a record.
  journal_->AppendItem(records::kFinishedIds, b.id);
  journal_->RemoveLive(b.journal_segment, JournalBytes(b));
}

void BrokerCore::AfterCommit(Journal::CommitResult result, TimePoint now) {
  std::vector<BatchSeq>& written = off_loop_ ? sealed_ : uncommitted_;
  if (result == Journal::CommitResult::kRefused) {
    spdlog::warn("journal: {} batches accepted this turn did not reach the disk: refused "
                 "with disk_full (their producers send them again)",
                 written.size());
    if (off_loop_) {
      // Every "accepted" held for the write is for one of its batches (a
      // re-send of one of them while it was out included): "disk_full" now.
      const std::string why = DiskFullWhy();
      for (const HeldAck& a : sealed_acks_) {
        if (const Batch* b = batches_.Get(a.seq)) {
          Out(a.identity).rejected.push_back({std::string(b->id), ErrorCode::kDiskFull, why});
        }
      }
    }
    for (BatchSeq seq : written) TakeBack(seq, now);
  } else if (off_loop_) {
    // On disk: into their queues in the order they came, and "accepted".
    for (BatchSeq seq : sealed_) batches_.Enqueue(seq);
    for (HeldAck& a : sealed_acks_) {
      if (const Batch* b = batches_.Get(a.seq)) Out(a.identity).accepted.emplace_back(b->id);
    }
  }
  written.clear();
  if (off_loop_) sealed_acks_.clear();
}

void BrokerCore::TakeBack(BatchSeq seq, TimePoint now) {
  Batch* b = batches_.Get(seq);
  if (b == nullptr) return;
  if (b->state == BatchState::kRunning) {
    // Assigned this turn, not sent yet (the loop sends after the commit).
    if (Worker* w = workers_.Find(b->worker)) {
      std::erase(w->outgoing, seq);
      ++w->credit;
      Release(*w, seq, now);
      workers_.MarkReady(*w);
    }
  }
  const std::string id(b->id);
  journal_->RemoveLive(b->journal_segment, JournalBytes(*b));
  --counters_.submitted;
  ++counters_.rejected_disk_full;
  batches_.Erase(seq);
  // Off the loop no "accepted" for it is in the outbox (AfterCommit turned
  // the ones held for it into "disk_full").
  if (off_loop_) return;
  // Every producer told "accepted" this turn (the same id may have come
  // from two) is told "disk_full" instead.
  const std::string why = DiskFullWhy();
  for (auto& [identity, out] : outbox_.producers) {
    if (std::erase(out.accepted, id) > 0) out.rejected.push_back({id, ErrorCode::kDiskFull, why});
  }
}

std::string BrokerCore::DiskFullWhy() const {
  return "the broker could not write its journal (" + ErrnoText(journal_->problem_errno()) +
         "): retry later";
}

std::vector<std::string> BrokerCore::LiveIds(std::uint64_t upto) const {
  std::vector<std::string> ids;
  batches_.ForEach([&](const Batch& b) {
    // A pending batch's record is in no closed segment yet.
    if (b.journal_segment <= upto && b.state != BatchState::kPending) ids.emplace_back(b.id);
  });
  return ids;
}

void BrokerCore::Restore(std::uint64_t segment, std::uint8_t type, std::string_view body,
                         TimePoint now) {
  if (type == records::kAccepted) {
    const auto a = records::DecodeAccepted(body);
    if (!a) throw JournalError("journal: unreadable accepted-batch record");
    // A batch can appear twice (a compaction cut short by a crash): once
    // is enough. Its producer is unknown until it re-sends or fetches.
    if (!batches_.FindId(a->id)) {
      const BatchSeq seq = batches_.Add(
          a->id, a->queue.empty() ? std::string_view("default") : a->queue, a->payload, "", now);
      batches_.Get(seq)->journal_segment = segment;
    }
  } else if (type == records::kFinished) {
    if (auto seq = batches_.FindId(body)) batches_.Erase(*seq);
  } else if (type == records::kFinishedIds) {
    const bool readable = Journal::ForEachItem(body, [&](std::string_view id) {
      if (auto seq = batches_.FindId(id)) batches_.Erase(*seq);
    });
    if (!readable) throw JournalError("journal: unreadable finished-batches record");
  } else if (type == records::kDispatched) {
    const auto d = records::DecodeDispatched(body);
    if (!d) throw JournalError("journal: unreadable dispatched-batch record");
    // The last record wins: attempts only grow, except when an attempt is
    // given back (a dispatch that never left), which is journaled too.
    if (auto seq = batches_.FindId(d->id)) batches_.Get(*seq)->attempts = d->attempts;
  } else {
    throw JournalError("journal: unknown record type " + std::to_string(type));
  }
}

std::size_t BrokerCore::FinishRestore(TimePoint now) {
  if (journal_ != nullptr) {
    for (const Batch* b : batches_.InOrder()) journal_->AddLive(b->journal_segment, JournalBytes(*b));
  }
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
    results_.Put(b->id, b->id_hash, StoredResult{proto::Outcome::kFailed, b->attempts, "",
                                     "dead-lettered after " + std::to_string(b->attempts) +
                                         " attempts; the broker stopped during the last",
                                     now});
    JournalFinished(*b);
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
  // Its object requests are answered now (the connection may still be
  // there: a worker declared dead while stopped, or one that said BYE);
  // late replies from producers are dropped.
  const std::vector<PendingObject> pending = objects_.TakeWorker(w.identity);
  if (!pending.empty()) {
    FailObjects(pending, proto::ObjectStatus::kUnknownBatch,
                "the worker no longer holds it (" + std::string(why) + ")", now);
  }
  std::string id = w.id;
  workers_.Remove(id);  // `w` dangles from here on
  // Each goes back to the front of its queue: newest first, so that the
  // oldest ends up in front and the queue keeps its order.
  std::sort(held.begin(), held.end(), [&](BatchSeq a, BatchSeq b) {
    const Batch* x = batches_.Get(a);
    const Batch* y = batches_.Get(b);
    return (x != nullptr ? x->order() : 0) > (y != nullptr ? y->order() : 0);
  });
  for (BatchSeq seq : held) Requeue(seq, why, now);
}

void BrokerCore::OnUndeliverable(Socket socket, std::string_view identity, TimePoint now) {
  Worker* w = socket == Socket::kBackend ? workers_.FindByIdentity(identity) : nullptr;
  if (w == nullptr) {
    ++counters_.undeliverable;
    // A producer that cannot be reached answers none of the object
    // requests it was asked: its workers hear so now, not at the timeout.
    if (socket == Socket::kFrontend) {
      FailObjects(objects_.TakeOwnedBy(identity), proto::ObjectStatus::kProducerGone,
                  "its producer is not connected to the broker (a message to it could not "
                  "be sent)",
                  now);
    }
    return;
  }
  // Its connection is gone (a send fails at once when libzmq has seen the
  // peer leave): as dead as one that stopped heartbeating, found sooner.
  // The loop sends these frames before any dispatch, so none of this
  // turn's batches for it has left yet.
  ++counters_.undeliverable;
  ++counters_.workers_dead;
  spdlog::warn("worker {}: its connection is gone (a message to it could not be sent): "
               "declared dead, {} batches requeued",
               w->id, w->held.size() - w->outgoing.size());
  Unreachable(*w, 0, "its connection is gone", now);
}

void BrokerCore::OnDispatchFailed(std::string_view worker_id, std::size_t sent,
                                  TimePoint now) {
  Worker* w = workers_.Find(worker_id);
  if (w == nullptr) return;
  ++counters_.undeliverable;
  ++counters_.workers_dead;
  spdlog::warn("could not send to worker {} (gone, or not reading): declared dead", w->id);
  Unreachable(*w, sent, "became unreachable", now);
}

void BrokerCore::Unreachable(Worker& w, std::size_t sent, std::string_view why,
                             TimePoint now) {
  // The first `sent` batches of w.outgoing left in messages that were
  // queued for the worker and may have reached it: they keep their attempt
  // (the dead-letter limit counts on it). The unsent ones never left: their
  // attempt is given back (in the journal too, so a restart does not count
  // it). All of them are requeued with the rest of what it holds.
  for (std::size_t k = sent; k < w.outgoing.size(); ++k) {
    if (Batch* b = batches_.Get(w.outgoing[k])) {
      if (b->attempts > 0) --b->attempts;
      if (journal_ != nullptr) NoteAttempts(*b, w.outgoing[k]);
    }
  }
  w.outgoing.clear();
  DropWorker(w, why, now);
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
  FailObjects(objects_.TakeExpired(now), proto::ObjectStatus::kTimeout,
              "its producer did not answer within --object-timeout-seconds", now);
  // wait-demand requests past their deadline get "no demand"; the client
  // asks again if it still wants to know.
  std::erase_if(demand_waiters_, [&](const DemandWaiter& d) {
    if (now < d.deadline) return false;
    Reply(d.identity, d.request_id, ErrorCode::kOk, "no demand");
    return true;
  });
}

void BrokerCore::AfterFlush(TimePoint now) { results_.Trim(now); }

}  // namespace fleet::broker

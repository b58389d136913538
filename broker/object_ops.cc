// The broker's side of large objects (docs/protocol.md section 5a): a
// worker's OBJECT_GET for a batch it holds goes to that batch's owner as
// OBJECT_REQUEST, and the owner's OBJECT_REPLY comes back to the worker as
// OBJECT_DATA. The broker keeps only the pending request (ObjectTable),
// never the object. Part of BrokerCore; see broker_core.h.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "broker/broker_core.h"

namespace fleet::broker {

using proto::ObjectStatus;

namespace {

// Room left in a message for everything but the chunk: the OBJECT_DATA or
// OBJECT_REPLY envelope, the 64-bit fields and an error text.
constexpr std::size_t kObjectEnvelopeBytes = 4096;

std::string Why(std::string_view batch_id, std::string_view reason) {
  std::string out = "object request for batch ";
  out.append(batch_id.substr(0, 256));
  out += ": ";
  out.append(reason);
  return out;
}

}  // namespace

std::uint32_t BrokerCore::ObjectChunkBytes() const {
  const std::size_t max = MaxMessageBytes(options_);
  const std::size_t chunk = max > 2 * kObjectEnvelopeBytes ? max - kObjectEnvelopeBytes
                                                           : max / 2;
  return static_cast<std::uint32_t>(std::min<std::size_t>(chunk, 0xffffffffu));
}

void BrokerCore::AnswerObject(std::string_view worker, std::uint64_t tag, std::uint64_t offset,
                              ObjectStatus status, std::string_view error, TimePoint now,
                              std::uint64_t total, std::string_view data) {
  ++counters_.object_answers[static_cast<std::size_t>(status)];
  counters_.object_bytes += data.size();
  const proto::ObjectData m{tag, static_cast<std::uint32_t>(status), total, offset, data, error};
  if (Worker* w = workers_.FindByIdentity(worker)) {
    SendToWorker(*w, m, now);
  } else {
    Send(Socket::kBackend, worker, m);
  }
}

void BrokerCore::FailObjects(const std::vector<PendingObject>& pending, ObjectStatus status,
                             std::string_view why, TimePoint now) {
  for (const PendingObject& p : pending) {
    spdlog::debug("object request {} for batch {}: {}", p.tag, p.batch_id,
                  proto::ObjectStatusName(status));
    AnswerObject(p.worker, p.tag, p.offset, status, Why(p.batch_id, why), now);
  }
}

void BrokerCore::OnObjectGet(std::string_view identity, const proto::ObjectGet& m,
                             TimePoint now) {
  Worker* w = workers_.FindByIdentity(identity);
  if (w == nullptr) {
    AnswerObject(identity, m.tag, m.offset, ObjectStatus::kUnknownBatch,
                 Why(m.batch_id, "this connection is not a registered worker"), now);
    // As for a DONE or HEARTBEAT from it: it learns that it must register.
    Send(Socket::kBackend, identity, proto::Reset{"unknown worker: send HELLO"});
    return;
  }
  w->last_seen = now;
  if (m.digest.empty() || m.digest.size() > proto::kMaxDigestBytes || m.length == 0) {
    AnswerObject(identity, m.tag, m.offset, ObjectStatus::kBadRequest,
                 Why(m.batch_id, "a digest must have 1 to 64 bytes and a length at least 1"),
                 now);
    return;
  }
  const auto seq = batches_.FindId(m.batch_id);
  const Batch* b = seq ? batches_.Get(*seq) : nullptr;
  if (b == nullptr || b->state != BatchState::kRunning || b->worker.view() != w->id) {
    AnswerObject(identity, m.tag, m.offset, ObjectStatus::kUnknownBatch,
                 Why(m.batch_id, "this worker does not hold the batch"), now);
    return;
  }
  if (!objects_.HasRoom(identity, w->slots)) {
    AnswerObject(identity, m.tag, m.offset, ObjectStatus::kBusy,
                 Why(m.batch_id, "too many object requests pending (16 per slot of the worker, "
                                 "1024 in all): ask again later"),
                 now);
    return;
  }
  if (b->owner.view().empty()) {
    AnswerObject(identity, m.tag, m.offset, ObjectStatus::kProducerGone,
                 Why(m.batch_id, "its producer is not connected (the batch came back from "
                                 "the journal and no producer has re-sent or fetched it)"),
                 now);
    return;
  }
  PendingObject p;
  p.worker.assign(identity);
  p.owner.assign(b->owner.view());
  p.batch_id.assign(m.batch_id);
  p.tag = m.tag;
  p.offset = m.offset;
  p.length = std::min(m.length, ObjectChunkBytes());
  p.deadline = now + options_.object_timeout;
  const std::uint32_t length = p.length;
  const std::uint64_t token = objects_.Add(std::move(p));
  Send(Socket::kFrontend, b->owner.view(),
       proto::ObjectRequest{token, m.batch_id, m.digest, m.offset, length});
}

void BrokerCore::OnObjectReply(std::string_view identity, const proto::ObjectReply& m,
                               TimePoint now) {
  PendingObject p;
  if (!objects_.Take(m.token, &p)) {
    ++counters_.object_replies_dropped;
    spdlog::debug("OBJECT_REPLY for token {} that no request waits for: dropped", m.token);
    return;
  }
  if (p.owner != identity) {
    // Not the connection asked: dropped, and the request still waits for
    // the one that was.
    ++counters_.object_replies_dropped;
    objects_.Restore(m.token, std::move(p));
    return;
  }
  const auto status = static_cast<ObjectStatus>(m.status);
  if (status == ObjectStatus::kOk) {
    if (m.data.size() > p.length || p.offset > m.total || m.data.size() > m.total - p.offset) {
      AnswerObject(p.worker, p.tag, p.offset, ObjectStatus::kBadRequest,
                   Why(p.batch_id, "the producer answered with " + std::to_string(m.data.size()) +
                                       " bytes at offset " + std::to_string(p.offset) +
                                       " of an object of " + std::to_string(m.total) +
                                       " bytes, for a request of " + std::to_string(p.length)),
                   now);
      return;
    }
    AnswerObject(p.worker, p.tag, p.offset, ObjectStatus::kOk, "", now, m.total, m.data);
    return;
  }
  if (status == ObjectStatus::kUnknownObject || status == ObjectStatus::kBadRequest) {
    std::string reason = std::string("the producer answered ") +
                         proto::ObjectStatusName(status) + ": ";
    reason.append(m.error.substr(0, 1024));
    AnswerObject(p.worker, p.tag, p.offset, status, Why(p.batch_id, reason), now);
    return;
  }
  AnswerObject(p.worker, p.tag, p.offset, ObjectStatus::kBadRequest,
               Why(p.batch_id, "the producer answered with status " +
                                   std::to_string(m.status) +
                                   ", which a producer may not send"),
               now);
}

}  // namespace fleet::broker

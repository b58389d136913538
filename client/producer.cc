#include "client/producer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace fleet::client {
namespace {

// Messages handled per Poll before yielding back to the caller, so a flood
// of results cannot starve the caller's own deadlines.
constexpr std::size_t kMaxReceivesPerPoll = 1024;

std::string RejectionText(proto::ErrorCode code, std::string_view message) {
  std::string text = "rejected: ";
  text += proto::ErrorCodeName(code);
  text += ": ";
  text += message;
  return text;
}

std::chrono::milliseconds CeilMillis(Duration d) {
  return std::chrono::ceil<std::chrono::milliseconds>(d);
}

// inproc names are per context; one counter for the process keeps them
// distinct in every context.
std::string NextMonitorEndpoint() {
  static std::atomic<unsigned> counter{0};
  return "inproc://fleet-producer-monitor-" + std::to_string(++counter);
}

}  // namespace

Producer::Producer(zmq::context_t& context, Options options,
                   ResultCallback on_result, const Clock& clock)
    : options_(std::move(options)),
      on_result_(std::move(on_result)),
      clock_(&clock),
      monitor_(context, zmq::socket_type::pair),
      socket_(context, zmq::socket_type::dealer),
      tracker_(BatchTracker::Options{options_.max_in_flight,
                                     options_.retry_initial,
                                     options_.retry_max,
                                     options_.resend_after}),
      handshake_(options_.endpoint, options_.socket.curve.enabled()) {
  options_.max_batches_per_message = std::clamp<std::size_t>(
      options_.max_batches_per_message, 1, options_.limits.max_items);
  ApplySocketOptions(socket_, options_.socket, /*router=*/false);
  // Queue nothing for a broker we are not connected to: a send then fails
  // at once and the batches stay in our book instead of a dead pipe.
  socket_.set(zmq::sockopt::immediate, 1);
  // Watch the connection before making it, so the first handshake is seen.
  // HANDSHAKE_SUCCEEDED rather than CONNECTED: the pipe is usable (and, with
  // CURVE, the broker accepted our key) only once the handshake is done.
  const std::string monitor_endpoint = NextMonitorEndpoint();
  if (zmq_socket_monitor(socket_.handle(), monitor_endpoint.c_str(),
                         HandshakeWatch::kEvents | ZMQ_EVENT_DISCONNECTED) != 0) {
    throw zmq::error_t();
  }
  monitor_.set(zmq::sockopt::linger, 0);
  monitor_.connect(monitor_endpoint);
  monitor_fd_ = static_cast<int>(monitor_.get(zmq::sockopt::fd));
  socket_.connect(options_.endpoint);
}

bool Producer::Submit(std::string_view id, std::string_view queue,
                      std::string_view payload) {
  // Check what the broker would reject for the whole message, so one bad
  // batch cannot get a coalesced SUBMIT refused with ERROR.
  const proto::Limits& l = options_.limits;
  std::string problem;
  if (id.empty()) {
    problem = RejectionText(proto::ErrorCode::kInvalidArgument, "empty id");
  } else if (id.size() > l.max_id_bytes || queue.size() > l.max_id_bytes) {
    problem = RejectionText(proto::ErrorCode::kTooLarge,
                            "id or queue longer than " +
                                std::to_string(l.max_id_bytes) + " bytes");
  } else if (payload.size() > l.max_payload_bytes) {
    problem = RejectionText(proto::ErrorCode::kTooLarge,
                            "payload larger than " +
                                std::to_string(l.max_payload_bytes) + " bytes");
  }
  if (!problem.empty()) {
    local_rejections_.emplace_back(std::string(id), std::move(problem));
    return true;
  }
  return tracker_.Add(id, queue, payload);
}

std::size_t Producer::Poll(std::chrono::milliseconds timeout) {
  std::size_t delivered = DeliverLocalRejections();
  TimePoint now = clock_->Now();
  Flush(now);

  std::chrono::milliseconds wait =
      delivered > 0 ? std::chrono::milliseconds(0)
                    : std::max(timeout, std::chrono::milliseconds(0));
  if (auto next = tracker_.NextDeadline()) {
    wait = std::clamp(CeilMillis(*next - now), std::chrono::milliseconds(0),
                      wait);
  }
  // The monitor by its descriptor (ZMQ_FD), not as a zmq socket: zmq::poll
  // asks a zmq socket for ZMQ_EVENTS before and after each wait, two system
  // calls each for an idle one (common/socket_waiter.h). The descriptor
  // wakes when commands reach the monitor, which is exact for its input once
  // a receive has found nothing: ReadMonitor empties it whenever it wakes,
  // and once before the descriptor is trusted (input that came before any
  // receive wakes nothing).
  if (monitor_unread_) wait = std::chrono::milliseconds(0);
  zmq::pollitem_t items[] = {
      {socket_.handle(), 0,
       static_cast<short>(ZMQ_POLLIN | (send_blocked_ ? ZMQ_POLLOUT : 0)), 0},
      {nullptr, monitor_fd_, ZMQ_POLLIN, 0},
      {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  PollNoThrow(items, wake_fd_ >= 0 ? 3 : 2, wait);
  if (items[0].revents & ZMQ_POLLOUT) send_blocked_ = false;

  now = clock_->Now();
  if (items[0].revents & ZMQ_POLLIN) delivered += Receive(now);
  // After Receive, so results already here are not re-sent for.
  if (monitor_unread_ || (items[1].revents & ZMQ_POLLIN)) ReadMonitor();
  // Results free window slots, a reconnect queues re-sends: send them now
  // rather than a Poll later.
  Flush(now);
  return delivered;
}

void Producer::ReadMonitor() {
  // Each event is [u16 event, u32 value][endpoint]. Emptied only when a
  // receive finds nothing (a callback below may throw): Poll trusts the
  // monitor's descriptor from then on.
  while (true) {
    if (!RecvMultipart(monitor_, &frames_)) {
      monitor_unread_ = false;
      return;
    }
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    if (frames_.empty() || frames_[0].size() < sizeof event + sizeof value) continue;
    std::memcpy(&event, frames_[0].data(), sizeof event);
    std::memcpy(&value, static_cast<const char*>(frames_[0].data()) + sizeof event, sizeof value);
    handshake_.OnEvent(event, value, clock_->Now());
    if (event == ZMQ_EVENT_DISCONNECTED) {
      // Nothing to do yet: once libzmq has closed the old pipe, sends fail
      // (ZMQ_IMMEDIATE) and batches stay in the book. Re-sending here
      // instead of at the handshake would race it: it reports the
      // disconnect before it closes that pipe, so a SUBMIT can still go
      // into it and be dropped (the tests have seen it).
      ++counters_.disconnects;
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      // The first connection follows nothing: with ZMQ_IMMEDIATE no send
      // succeeds before a handshake, so whatever is sent went over it.
      if (++counters_.connections > 1) OnReconnect();
    }
  }
}

void Producer::OnReconnect() {
  ++counters_.reconnects;
  // The re-submits answer every fetch still waiting to go out.
  fetch_queue_.clear();
  const std::size_t resent = tracker_.ResendSent();
  counters_.reconnect_resends += resent;
  // A new connection is a new pipe: try it rather than wait for POLLOUT.
  send_blocked_ = false;
  // Batches sent over the new connection before its event was read go out
  // twice; the broker's dedup makes that harmless, and it covers those sent
  // into the dying old pipe.
  if (on_reconnect_) on_reconnect_(resent);
}

void Producer::Flush(TimePoint now) {
  tracker_.Due(now, &fetch_queue_);
  if (send_blocked_) return;
  if (!FlushFetches()) return;
  FlushSubmits(now);
}

bool Producer::FlushSubmits(TimePoint now) {
  proto::Submit submit;
  while (true) {
    sendable_.clear();
    tracker_.PeekSendable(options_.max_batches_per_message,
                          options_.max_message_bytes, &sendable_);
    if (sendable_.empty()) return true;
    submit.batches.clear();
    for (const BatchTracker::Batch* b : sendable_) {
      submit.batches.push_back({b->id, b->queue, b->payload});
    }
    proto::EncodeTo(submit, &buffer_);
    if (!SendFrame(socket_, buffer_, /*block=*/false)) {
      // Not connected (immediate) or the pipe is at its high-water mark.
      send_blocked_ = true;
      return false;
    }
    ++counters_.submit_messages;
    tracker_.MarkSent(sendable_.size(), now);
  }
}

bool Producer::FlushFetches() {
  proto::Fetch fetch;
  while (!fetch_queue_.empty()) {
    std::size_t n =
        std::min(fetch_queue_.size(), options_.max_batches_per_message);
    fetch.ids.assign(fetch_queue_.end() - static_cast<std::ptrdiff_t>(n),
                     fetch_queue_.end());
    proto::EncodeTo(fetch, &buffer_);
    if (!SendFrame(socket_, buffer_, /*block=*/false)) {
      send_blocked_ = true;
      return false;
    }
    counters_.fetches += n;
    fetch_queue_.resize(fetch_queue_.size() - n);
  }
  return true;
}

std::size_t Producer::Receive(TimePoint now) {
  std::size_t delivered = 0;
  for (std::size_t i = 0; i < kMaxReceivesPerPoll; ++i) {
    if (!RecvMultipart(socket_, &frames_)) break;
    if (frames_.size() != 1) {
      ++counters_.malformed;
      spdlog::warn("broker sent a {}-frame message; expected 1",
                   frames_.size());
      continue;
    }
    proto::Decoded decoded =
        proto::Decode(frames_[0].data(), frames_[0].size(), options_.limits);
    if (!decoded.ok()) {
      ++counters_.malformed;
      spdlog::warn("undecodable message from broker: {}: {}",
                   proto::ErrorCodeName(decoded.error), decoded.detail);
      continue;
    }
    delivered += Handle(*decoded.message, now);
  }
  return delivered;
}

std::size_t Producer::Handle(const proto::Message& message, TimePoint now) {
  std::size_t delivered = 0;
  if (const auto* ack = std::get_if<proto::Ack>(&message)) {
    ++counters_.acks;
    for (std::string_view id : ack->accepted) {
      if (tracker_.OnAccepted(id, now)) ++counters_.accepted;
    }
    for (const proto::Rejection& r : ack->rejected) {
      // Both wait for the broker, never fail the batch: its queue drains,
      // and a journal that filled the disk accepts again once space returns.
      if (r.code == proto::ErrorCode::kQueueFull) {
        if (tracker_.OnQueueFull(r.id, now)) ++counters_.queue_full_retries;
        continue;
      }
      if (r.code == proto::ErrorCode::kDiskFull) {
        if (tracker_.OnQueueFull(r.id, now)) ++counters_.disk_full_retries;
        continue;
      }
      if (!tracker_.Complete(r.id)) continue;  // answered already
      ++counters_.rejected;
      std::string error = RejectionText(r.code, r.message);
      Deliver({r.id, proto::Outcome::kFailed, 0, {}, error});
      ++delivered;
    }
  } else if (const auto* result = std::get_if<proto::Result>(&message)) {
    for (const proto::ResultItem& item : result->results) {
      if (item.outcome == proto::Outcome::kUnknown) {
        // The broker lost it (a restart): send it again, same id and payload.
        // Not outstanding: the real result already came; nothing to do.
        if (tracker_.OnUnknown(item.id)) ++counters_.resends;
        continue;
      }
      if (!tracker_.Complete(item.id)) {
        ++counters_.duplicates_dropped;
        continue;
      }
      Deliver({item.id, item.outcome, item.attempts, item.result, item.error});
      ++delivered;
    }
    // Each finished batch left room in the broker's queue: batches waiting
    // out a queue-full backoff take it now instead of at their deadline.
    if (delivered > 0) tracker_.WakeRetries(delivered);
  } else if (const auto* req = std::get_if<proto::ObjectRequest>(&message)) {
    // This producer shares no objects (docs/protocol.md section 5a): it
    // says so, and the worker's batch fails at once instead of at the
    // broker's timeout. Dropped if the socket cannot take it now.
    ++counters_.object_requests;
    proto::EncodeTo(proto::ObjectReply{req->token,
                                       static_cast<std::uint32_t>(
                                           proto::ObjectStatus::kUnknownObject),
                                       0, {}, "this producer shares no objects"},
                    &buffer_);
    SendFrame(socket_, buffer_, /*block=*/false);
  } else if (const auto* error = std::get_if<proto::Error>(&message)) {
    // Not tied to batches: whatever it refused is fetched when overdue.
    ++counters_.errors;
    spdlog::warn("broker error: {}: {}", proto::ErrorCodeName(error->code),
                 error->message);
  } else {
    ++counters_.malformed;
    spdlog::warn("unexpected command {} on the frontend",
                 static_cast<int>(proto::CommandOf(message)));
  }
  return delivered;
}

std::size_t Producer::DeliverLocalRejections() {
  // Swap out first: the callback may Submit, which may append more.
  std::vector<std::pair<std::string, std::string>> batch;
  batch.swap(local_rejections_);
  for (const auto& [id, error] : batch) {
    ++counters_.rejected;
    Deliver({id, proto::Outcome::kFailed, 0, {}, error});
  }
  return batch.size();
}

void Producer::Deliver(const ResultView& view) {
  ++counters_.results;
  if (on_result_) on_result_(view);
}

}  // namespace fleet::client

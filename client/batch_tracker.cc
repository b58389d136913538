#include "client/batch_tracker.h"

#include <algorithm>

namespace fleet::client {
namespace {

// Rough wire size of one batch inside a SUBMIT: the three byte strings plus
// msgpack headers. Only used to cap a message near max_bytes.
std::size_t WireSize(const BatchTracker::Batch& b) {
  return b.id.size() + b.queue.size() + b.payload.size() + 16;
}

}  // namespace

BatchTracker::BatchTracker(Options options) : options_(options) {
  // Zero durations would re-arm a timer at `now` and spin Due forever.
  options_.window = std::max<std::size_t>(options_.window, 1);
  options_.retry_initial =
      std::max<Duration>(options_.retry_initial, std::chrono::milliseconds(1));
  options_.retry_max = std::max(options_.retry_max, options_.retry_initial);
  options_.resend_after =
      std::max<Duration>(options_.resend_after, std::chrono::milliseconds(1));
}

BatchTracker::Entry* BatchTracker::Find(std::string_view id) {
  auto it = batches_.find(id);
  return it == batches_.end() ? nullptr : &it->second;
}

void BatchTracker::Arm(Entry& entry, TimePoint deadline) {
  Disarm(entry);
  entry.deadline = deadline;
  timers_.emplace(deadline, entry.batch.id);
}

void BatchTracker::Disarm(Entry& entry) {
  if (entry.state == State::kSent || entry.state == State::kRetry) {
    timers_.erase(Timer(entry.deadline, entry.batch.id));
  }
}

bool BatchTracker::Add(std::string_view id, std::string_view queue,
                       std::string_view payload) {
  auto [it, inserted] = batches_.try_emplace(std::string(id));
  if (!inserted) return false;
  Entry& e = it->second;
  e.batch.id = it->first;
  e.batch.queue = queue;
  e.batch.payload = payload;
  e.backoff = options_.retry_initial;
  pending_.push_back(it->first);
  return true;
}

void BatchTracker::PeekSendable(std::size_t max_batches, std::size_t max_bytes,
                                std::vector<const Batch*>* out) const {
  std::size_t taken = 0;
  std::size_t bytes = 0;
  auto take = [&](const std::string& id) {
    if (taken >= max_batches || (taken > 0 && bytes >= max_bytes)) {
      return false;
    }
    const Batch& b = batches_.find(id)->second.batch;
    // Stop before a batch that would push a non-empty message past the cap.
    if (taken > 0 && bytes + WireSize(b) > max_bytes) return false;
    out->push_back(&b);
    ++taken;
    bytes += WireSize(b);
    return true;
  };
  // Resubmits already hold their window slots; pending ones need a free one.
  for (const std::string& id : resubmit_) {
    if (!take(id)) return;
  }
  std::size_t room =
      options_.window > in_flight() ? options_.window - in_flight() : 0;
  for (std::size_t i = 0; i < pending_.size() && i < room; ++i) {
    if (!take(pending_[i])) return;
  }
}

void BatchTracker::MarkSent(std::size_t count, TimePoint now) {
  // Same order as PeekSendable: resubmits, then pending.
  for (; count > 0; --count) {
    std::deque<std::string>& from = resubmit_.empty() ? pending_ : resubmit_;
    Entry& e = batches_.find(from.front())->second;
    from.pop_front();
    e.state = State::kSent;
    Arm(e, now + options_.resend_after);
  }
}

bool BatchTracker::OnAccepted(std::string_view id, TimePoint now) {
  Entry* e = Find(id);
  if (e == nullptr || e->state != State::kSent) return false;
  e->backoff = options_.retry_initial;
  Arm(*e, now + options_.resend_after);
  return true;
}

bool BatchTracker::OnQueueFull(std::string_view id, TimePoint now) {
  Entry* e = Find(id);
  if (e == nullptr || e->state != State::kSent) return false;
  Arm(*e, now + e->backoff);
  e->state = State::kRetry;
  e->backoff = std::min<Duration>(e->backoff * 2, options_.retry_max);
  return true;
}

void BatchTracker::WakeRetries(std::size_t n) {
  // Retry deadlines (at most retry_max away) sort before resend deadlines
  // (resend_after away), so the scan meets retries first; it is bounded so
  // that a window full of sent batches costs little.
  std::size_t budget = n * 2 + 64;
  for (auto it = timers_.begin(); n > 0 && budget > 0 && it != timers_.end(); --budget) {
    Entry& e = batches_.find(it->second)->second;
    ++it;  // Disarm erases the current timer
    if (e.state != State::kRetry) continue;
    Disarm(e);
    e.state = State::kResubmit;
    resubmit_.push_back(e.batch.id);
    --n;
  }
}

bool BatchTracker::OnUnknown(std::string_view id) {
  Entry* e = Find(id);
  if (e == nullptr || e->state != State::kSent) return false;
  Disarm(*e);
  e->state = State::kResubmit;
  resubmit_.push_back(e->batch.id);
  return true;
}

std::size_t BatchTracker::ResendSent() {
  // timers_ is ordered by deadline, and a sent batch's deadline is its send
  // (or accept) time plus the same resend_after, so this walk re-sends in
  // about the order they first went out, which keeps the broker's FIFO
  // order for a restarted in-memory broker.
  std::size_t moved = 0;
  for (auto it = timers_.begin(); it != timers_.end();) {
    Entry& e = batches_.find(it->second)->second;
    if (e.state != State::kSent) {
      ++it;
      continue;
    }
    it = timers_.erase(it);
    e.state = State::kResubmit;
    resubmit_.push_back(e.batch.id);
    ++moved;
  }
  return moved;
}

bool BatchTracker::Complete(std::string_view id) {
  auto it = batches_.find(id);
  if (it == batches_.end()) return false;
  Entry& e = it->second;
  // A result for a batch we never sent belongs to someone else's use of the
  // id (an earlier run, say); it must not stand in for ours.
  if (e.state == State::kPending) return false;
  Disarm(e);
  if (e.state == State::kResubmit) {
    // Rare (a late result for a batch being sent again) and the deque is
    // short: even after a reconnect moved the whole window here, the
    // producer sends it in the same Poll, before results can come for it.
    // So a linear erase beats lazy tombstones.
    resubmit_.erase(std::find(resubmit_.begin(), resubmit_.end(), id));
  }
  batches_.erase(it);
  return true;
}

void BatchTracker::Due(TimePoint now, std::vector<std::string>* fetch) {
  while (!timers_.empty() && timers_.begin()->first <= now) {
    std::string id = timers_.begin()->second;
    Entry& e = batches_.find(id)->second;
    if (e.state == State::kRetry) {
      Disarm(e);
      e.state = State::kResubmit;
      resubmit_.push_back(id);
    } else {
      Arm(e, now + options_.resend_after);
      fetch->push_back(std::move(id));
    }
  }
}

std::optional<TimePoint> BatchTracker::NextDeadline() const {
  if (timers_.empty()) return std::nullopt;
  return timers_.begin()->first;
}

}  // namespace fleet::client

#include "client/batch_tracker.h"

#include <algorithm>
#include <stdexcept>

namespace fleet::client {
namespace {

// Rough wire size of one batch inside a SUBMIT: the three byte strings plus
// msgpack headers. Only used to cap a message near max_bytes.
std::size_t WireSize(const BatchTracker::Batch& b) {
  return b.id.size() + b.queue.size() + b.payload.size() + 16;
}

// A pool this small is kept when nothing is outstanding (a light load
// empties it after nearly every batch); a bigger one, left by a burst, goes.
constexpr std::size_t kKeepEntries = 4096;
// A recycled entry's payload buffer is kept up to this capacity.
constexpr std::size_t kKeepPayloadBytes = 64u << 10;

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
  const std::uint32_t i = by_id_.Find(id, [this](std::uint32_t v) { return IdOf(v); });
  return i == IdIndex::kNone ? nullptr : &pool_[i];
}

BatchTracker::Entry* BatchTracker::NewEntry() {
  if (!free_.empty()) {
    Entry* e = &pool_[free_.back()];
    free_.pop_back();
    return e;
  }
  Entry& e = pool_.emplace_back();
  e.index = static_cast<std::uint32_t>(pool_.size() - 1);
  return &e;
}

void BatchTracker::Recycle(Entry* e) {
  e->arm = 0;  // every timer still pointing here is stale
  e->state = State::kPending;
  if (e->batch.payload.capacity() > kKeepPayloadBytes) std::string().swap(e->batch.payload);
  free_.push_back(e->index);
  if (by_id_.size() == 0 && pool_.size() > kKeepEntries) {
    // Nothing outstanding: no queue, retry timer or live resend timer
    // refers to an entry, so the whole pool can go.
    resend_timers_.clear();
    std::deque<Entry>().swap(pool_);
    std::vector<std::uint32_t>().swap(free_);
    by_id_.Clear();
  }
}

void BatchTracker::ResubmitFirstRetry() {
  Entry& e = *Find(retry_timers_.begin()->second);
  Disarm(e);  // erases that first retry timer
  e.state = State::kResubmit;
  resubmit_.push_back(&e);
}

void BatchTracker::ArmResend(Entry& entry, TimePoint deadline) {
  Disarm(entry);
  entry.deadline = deadline;
  entry.arm = ++next_arm_;
  resend_timers_.push_back(SentTimer{deadline, &entry, entry.arm});
}

void BatchTracker::ArmRetry(Entry& entry, TimePoint deadline) {
  Disarm(entry);
  entry.deadline = deadline;
  retry_timers_.emplace(deadline, entry.batch.id);
}

void BatchTracker::Disarm(Entry& entry) {
  entry.arm = 0;  // its resend timer, if any, is stale from now on
  if (entry.state == State::kRetry) {
    retry_timers_.erase(RetryTimer(entry.deadline, entry.batch.id));
  }
}

void BatchTracker::Tidy() const {
  while (!resend_timers_.empty() && !LiveEntry(resend_timers_.front())) resend_timers_.pop_front();
  // Each finished or re-armed batch leaves one stale timer behind; past
  // three per batch in flight, a pass drops them all (amortized O(1) per
  // timer, and the FIFO's memory stays proportional to the window).
  const std::size_t in_flight = by_id_.size() - pending_.size();
  if (resend_timers_.size() > 3 * in_flight + 1024) {
    std::deque<SentTimer> kept;
    for (SentTimer& t : resend_timers_) {
      if (LiveEntry(t)) kept.push_back(std::move(t));
    }
    resend_timers_.swap(kept);
  }
}

bool BatchTracker::Add(std::string_view id, std::string_view queue,
                       std::string_view payload) {
  if (Find(id) != nullptr) return false;
  if (pool_.size() >= IdIndex::kNone && free_.empty()) {
    throw std::length_error("BatchTracker: more than 2^32 - 1 batches outstanding");
  }
  Entry& e = *NewEntry();
  e.batch.id.assign(id);
  e.batch.queue.assign(queue);
  e.batch.payload.assign(payload);
  e.state = State::kPending;
  e.arm = 0;
  e.backoff = options_.retry_initial;
  by_id_.Insert(e.batch.id, e.index);
  pending_.push_back(&e);
  return true;
}

void BatchTracker::PeekSendable(std::size_t max_batches, std::size_t max_bytes,
                                std::vector<const Batch*>* out) const {
  std::size_t taken = 0;
  std::size_t bytes = 0;
  auto take = [&](const Entry* e) {
    if (taken >= max_batches || (taken > 0 && bytes >= max_bytes)) {
      return false;
    }
    const Batch& b = e->batch;
    // Stop before a batch that would push a non-empty message past the cap.
    if (taken > 0 && bytes + WireSize(b) > max_bytes) return false;
    out->push_back(&b);
    ++taken;
    bytes += WireSize(b);
    return true;
  };
  // Resubmits already hold their window slots; pending ones need a free one.
  for (const Entry* e : resubmit_) {
    if (!take(e)) return;
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
    std::deque<Entry*>& from = resubmit_.empty() ? pending_ : resubmit_;
    Entry& e = *from.front();
    from.pop_front();
    e.state = State::kSent;
    ArmResend(e, now + options_.resend_after);
  }
  Tidy();
}

bool BatchTracker::OnAccepted(std::string_view id, TimePoint now) {
  Entry* e = Find(id);
  if (e == nullptr || e->state != State::kSent) return false;
  e->backoff = options_.retry_initial;
  ArmResend(*e, now + options_.resend_after);
  return true;
}

bool BatchTracker::OnQueueFull(std::string_view id, TimePoint now) {
  Entry* e = Find(id);
  if (e == nullptr || e->state != State::kSent) return false;
  ArmRetry(*e, now + e->backoff);
  e->state = State::kRetry;
  e->backoff = std::min<Duration>(e->backoff * 2, options_.retry_max);
  return true;
}

void BatchTracker::WakeRetries(std::size_t n) {
  // Earliest retry deadline first.
  for (; n > 0 && !retry_timers_.empty(); --n) ResubmitFirstRetry();
}

bool BatchTracker::OnUnknown(std::string_view id) {
  Entry* e = Find(id);
  if (e == nullptr || e->state != State::kSent) return false;
  Disarm(*e);
  e->state = State::kResubmit;
  resubmit_.push_back(e);
  return true;
}

std::size_t BatchTracker::ResendSent() {
  // Live resend timers are in the order they were armed, so this walk
  // re-sends in about the order the batches first went out, which keeps the
  // broker's FIFO order for a restarted in-memory broker.
  std::size_t moved = 0;
  for (const SentTimer& t : resend_timers_) {
    Entry* e = LiveEntry(t);
    if (e == nullptr) continue;
    Disarm(*e);
    e->state = State::kResubmit;
    resubmit_.push_back(e);
    ++moved;
  }
  resend_timers_.clear();  // every one is stale now
  return moved;
}

bool BatchTracker::Complete(std::string_view id) {
  Entry* found = Find(id);
  if (found == nullptr) return false;
  Entry& e = *found;
  // A result for a batch we never sent belongs to someone else's use of the
  // id (an earlier run, say); it must not stand in for ours.
  if (e.state == State::kPending) return false;
  Disarm(e);
  if (e.state == State::kResubmit) {
    // Rare (a late result for a batch being sent again) and the deque is
    // short: even after a reconnect moved the whole window here, the
    // producer sends it in the same Poll, before results can come for it.
    // So a linear erase beats lazy tombstones.
    resubmit_.erase(std::find(resubmit_.begin(), resubmit_.end(), &e));
  }
  by_id_.Erase(e.batch.id, [this](std::uint32_t v) { return IdOf(v); });
  Recycle(&e);
  return true;
}

void BatchTracker::Due(TimePoint now, std::vector<std::string>* fetch) {
  while (!retry_timers_.empty() && retry_timers_.begin()->first <= now) ResubmitFirstRetry();
  Tidy();
  while (!resend_timers_.empty() && resend_timers_.front().deadline <= now) {
    SentTimer t = std::move(resend_timers_.front());
    resend_timers_.pop_front();
    Entry* e = LiveEntry(t);
    if (e == nullptr) continue;
    ArmResend(*e, now + options_.resend_after);
    fetch->push_back(e->batch.id);
  }
}

std::optional<TimePoint> BatchTracker::NextDeadline() const {
  Tidy();
  std::optional<TimePoint> next;
  if (!resend_timers_.empty()) next = resend_timers_.front().deadline;
  if (!retry_timers_.empty() && (!next || retry_timers_.begin()->first < *next)) {
    next = retry_timers_.begin()->first;
  }
  return next;
}

}  // namespace fleet::client

// BatchTracker: the producer's book of batches that have no result yet. Pure
// state: no sockets, no clock (every call that needs the time takes `now`).
//
// Owns a copy of every outstanding batch (id, queue, payload) from Add until
// Complete, because the broker may lose an accepted batch (a restart) and the
// producer must then submit it again with the same id and payload.
//
// A batch is in one of four states:
//   pending   - added, never sent; waits in a FIFO for a window slot.
//   resubmit  - holds a window slot and must be (re)sent as soon as possible:
//               a queue-full retry that came due, or an id the broker said it
//               does not know.
//   sent      - submitted (or accepted); a resend deadline is armed. When it
//               passes the producer fetches the id, and the deadline re-arms.
//               After a reconnect every sent batch becomes resubmit.
//   retry     - rejected with queue_full; waits out its backoff, then becomes
//               resubmit. Backoff doubles per consecutive rejection.
// Every state but pending holds one slot of the in-flight window, so a full
// broker queue cannot make the producer churn through its whole backlog.
//
// Not thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/id_index.h"

namespace fleet::client {

class BatchTracker {
 public:
  struct Options {
    std::size_t window = 1000;  // batches in flight at most; 1..1'000'000
    // Queue-full retry backoff: first wait, doubled per rejection, capped.
    Duration retry_initial = std::chrono::milliseconds(10);
    Duration retry_max = std::chrono::seconds(1);
    // A batch sent this long ago with no result is fetched; > 0.
    Duration resend_after = std::chrono::seconds(10);
  };

  struct Batch {
    std::string id;
    std::string queue;
    std::string payload;
  };

  explicit BatchTracker(Options options);
  // Movable (the pooled entries, which the map, queues and timers point
  // at, move along), not copyable (a copy would point into the original).
  BatchTracker(const BatchTracker&) = delete;
  BatchTracker& operator=(const BatchTracker&) = delete;
  BatchTracker(BatchTracker&&) = default;
  BatchTracker& operator=(BatchTracker&&) = default;

  // Copies the batch into the pending FIFO. Returns false (and keeps
  // nothing) when `id` is already outstanding.
  bool Add(std::string_view id, std::string_view queue,
           std::string_view payload);

  // Appends to `out` the batches to send now, in order: resubmits first, then
  // pending ones while the window has room; stops at `max_batches` or once
  // about `max_bytes` are taken (always at least one if any is sendable).
  // Changes nothing: the pointers stay valid until the next non-const call.
  void PeekSendable(std::size_t max_batches, std::size_t max_bytes,
                    std::vector<const Batch*>* out) const;

  // Marks the first `count` batches PeekSendable returned as sent at `now`.
  void MarkSent(std::size_t count, TimePoint now);

  // The broker accepted `id`: re-arms its resend deadline and resets its
  // backoff. Returns false when `id` is not outstanding or not sent.
  bool OnAccepted(std::string_view id, TimePoint now);

  // The broker's queue was full: `id` waits out its backoff. Returns false
  // when `id` is not outstanding or not sent.
  bool OnQueueFull(std::string_view id, TimePoint now);

  // The broker finished `n` batches, so its queue has room again: up to `n`
  // batches waiting out a queue-full backoff (earliest deadline first) are
  // to be submitted now.
  void WakeRetries(std::size_t n);

  // The broker does not know `id` (its answer to a fetch): `id` is to be
  // submitted again. Returns false when `id` is not outstanding or already
  // waiting to be sent again (nothing to do).
  bool OnUnknown(std::string_view id);

  // The connection to the broker was replaced (the broker restarted, or the
  // network dropped): every sent batch is to be submitted again at once,
  // same id and payload, in the order it was sent; its resend deadline is
  // disarmed until then. Batches waiting out a queue-full backoff keep it
  // (the broker refused them; nothing of theirs is lost). Returns how many
  // batches it moved.
  std::size_t ResendSent();

  // `id` has its final answer: forgets it. Returns false when `id` is not
  // outstanding or was never sent (a stray or duplicate result).
  bool Complete(std::string_view id);

  // Moves retries whose backoff ended at or before `now` to resubmit and
  // appends to `fetch` the ids whose resend deadline passed (re-armed at
  // now + resend_after).
  void Due(TimePoint now, std::vector<std::string>* fetch);

  // The earliest armed deadline, if any.
  std::optional<TimePoint> NextDeadline() const;

  std::size_t outstanding() const { return by_id_.size(); }
  std::size_t pending() const { return pending_.size(); }
  std::size_t in_flight() const { return by_id_.size() - pending_.size(); }
  std::size_t resubmits() const { return resubmit_.size(); }

 private:
  enum class State { kPending, kResubmit, kSent, kRetry };
  struct Entry {
    Batch batch;
    State state = State::kPending;
    TimePoint deadline{};  // resend (kSent) or retry (kRetry) time
    Duration backoff{};    // the next queue-full wait
    std::uint64_t arm = 0;  // the live resend timer's number; 0: none
    std::uint32_t index = 0;  // in pool_
  };
  // A resend deadline. Every one is resend_after from when it was armed, so
  // they are armed in deadline order and a FIFO keeps them sorted (callers'
  // `now` never goes back; if it did, a fetch would only come late). A timer
  // is not erased when its batch finishes or is re-armed: it is stale once
  // `arm` no longer matches its entry's (numbers are never reused, and a
  // finished entry's is 0), and is dropped when it reaches the front or
  // when the FIFO is compacted. Entries are pooled, never freed while a
  // timer may point at them, so checking costs no lookup by id.
  struct SentTimer {
    TimePoint deadline;
    Entry* entry;
    std::uint64_t arm;
  };
  using RetryTimer = std::pair<TimePoint, std::string>;

  Entry* Find(std::string_view id);
  // The batch `t` still times, or null when `t` is stale.
  static Entry* LiveEntry(const SentTimer& t) {
    return t.entry->arm == t.arm ? t.entry : nullptr;
  }
  // A free entry from the pool (or a new one); Recycle gives it back.
  Entry* NewEntry();
  void Recycle(Entry* e);
  // The batch with the earliest retry deadline goes to the resubmit queue.
  void ResubmitFirstRetry();
  void ArmResend(Entry& entry, TimePoint deadline);
  void ArmRetry(Entry& entry, TimePoint deadline);
  void Disarm(Entry& entry);
  // Drops stale timers at the front of the FIFO; compacts it when stale
  // ones make up most of it, so it stays within a few times the window.
  void Tidy() const;

  Options options_;
  // Outstanding batches by id: the entry's index in pool_, the key read
  // back from the entry (an open-addressing table, no node per batch). The
  // queues and timers point at entries (no lookup per batch sent or
  // timed); an entry leaves its queue before it is recycled (Complete), and
  // a pending one is never recycled.
  IdIndex by_id_;
  // Every entry, in use or free: a deque, so they never move. A finished
  // entry keeps its strings' buffers for the next batch (no allocation per
  // batch in a steady stream); the pool is released when nothing is
  // outstanding after it grew past kKeepEntries.
  std::deque<Entry> pool_;
  std::vector<std::uint32_t> free_;
  std::string_view IdOf(std::uint32_t index) const { return pool_[index].batch.id; }
  std::deque<Entry*> pending_;   // state kPending, FIFO
  std::deque<Entry*> resubmit_;  // state kResubmit, FIFO
  mutable std::deque<SentTimer> resend_timers_;  // of kSent, by deadline
  std::set<RetryTimer> retry_timers_;            // (deadline, id) of kRetry
  std::uint64_t next_arm_ = 0;
};

}  // namespace fleet::client

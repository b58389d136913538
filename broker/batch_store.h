// BatchStore: every batch the broker has accepted and not yet finished, and
// the named FIFO queues of those waiting for a worker.
//
// Pure state: no sockets, no clock (callers pass `now`). Not thread-safe;
// the broker loop owns it. Batches are referred to by a sequence number
// (BatchSeq) that is never reused, so a stale reference is detected, not
// followed.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/string_map.h"

namespace fleet::broker {

using BatchSeq = std::uint64_t;

enum class BatchState : std::uint8_t { kQueued, kRunning };

struct Batch {
  std::string id;
  std::string queue;
  std::string payload;
  std::string owner;   // routing id of the producer that gets the result
  std::string worker;  // worker id while running, "" while queued
  std::uint32_t attempts = 0;  // dispatches so far
  BatchState state = BatchState::kQueued;
  TimePoint enqueued_at;
  TimePoint dispatched_at;
};

class BatchStore {
 public:
  // The batch with this producer-chosen id, if the store holds it.
  std::optional<BatchSeq> FindId(std::string_view id) const;
  // Null if `seq` is not (or no longer) in the store.
  Batch* Get(BatchSeq seq);
  const Batch* Get(BatchSeq seq) const;

  // Adds a new batch at the back of its queue. Requires: FindId(id) empty.
  BatchSeq Add(std::string_view id, std::string_view queue,
               std::string_view payload, std::string_view owner, TimePoint now);

  // Takes the oldest waiting batch from `queues` (every queue when empty),
  // turning round the queues so that none starves. Marks it running.
  std::optional<BatchSeq> Pop(const std::vector<std::string>& queues);

  // Puts a running batch back at the front of its queue (it is older than
  // everything behind it).
  void Requeue(BatchSeq seq);

  // Removes a finished batch, queued or running.
  void Erase(BatchSeq seq);

  // Hands the batch's result to another producer (a re-send or fetch from
  // a new connection).
  void SetOwner(BatchSeq seq, std::string_view owner);
  // Batches held (queued or running) whose result goes to `owner`.
  std::size_t OwnedBy(std::string_view owner) const;

  // Every batch, queued or running, in the order they were added.
  std::vector<const Batch*> InOrder() const;

  std::size_t queued() const { return queued_; }
  // Payload bytes of every batch held, queued or running.
  std::size_t bytes() const { return bytes_; }
  std::size_t size() const { return batches_.size(); }
  std::size_t running() const { return batches_.size() - queued_; }
  std::size_t Depth(std::string_view queue) const;
  // Depth of every queue that has ever held a batch, sorted by name.
  std::vector<std::pair<std::string, std::size_t>> Depths() const;

 private:
  // `items` may hold seqs that were erased while waiting; they are skipped
  // when popped. `depth` is exact.
  struct Queue {
    std::deque<BatchSeq> items;
    std::size_t depth = 0;
  };

  std::optional<BatchSeq> PopFrom(Queue& q);
  Queue& QueueFor(std::string_view name);

  std::unordered_map<BatchSeq, Batch> batches_;
  StringMap<BatchSeq> by_id_;
  StringMap<Queue> queues_;
  std::vector<std::string> order_;  // queue names, for round robin
  std::size_t next_queue_ = 0;
  BatchSeq next_seq_ = 1;
  std::size_t queued_ = 0;
  std::size_t bytes_ = 0;
  StringMap<std::size_t> per_owner_;  // no entry for a count of 0
};

}  // namespace fleet::broker

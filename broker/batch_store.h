// BatchStore: every batch the broker has accepted and not yet finished, and
// the named FIFO queues of those waiting for a worker.
//
// Pure state: no sockets, no clock (callers pass `now`). Not thread-safe;
// the broker loop owns it. Batches are referred to by a BatchSeq that is
// never reused, so a stale reference is detected, not followed.
//
// Memory: the broker holds up to --max-queue batches, so a batch costs little
// beyond its payload (about 160 bytes of RSS with a short id): a dense slot,
// its id and payload in one allocation, an 8-byte entry in the id index and
// in its queue; queue, producer and worker names are shared, not copied.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/id_index.h"
#include "broker/name_table.h"
#include "common/clock.h"
#include "common/string_map.h"

namespace fleet::broker {

using BatchSeq = std::uint64_t;

// kPending: accepted, its journal record not on disk yet (durable mode):
// held, in no queue, until Enqueue.
enum class BatchState : std::uint8_t { kQueued, kRunning, kPending };

// One held batch. Its text fields are views of storage the store owns; they
// stay valid until the batch is erased. Callers may change `attempts` and
// `dispatched_at`; the rest changes only through BatchStore.
struct Batch {
  std::string_view id;
  std::string_view payload;
  Name queue;
  Name owner;   // routing id of the producer that gets the result
  Name worker;  // worker id while running, "" while queued
  std::uint32_t attempts = 0;  // dispatches so far
  // While running: its index in its worker's Worker::held, kept by the
  // broker core, so a result finds and releases it without a search.
  std::uint32_t held_index = 0;
  BatchState state = BatchState::kQueued;
  // Durable mode, writing off the loop: its attempt count changed since the
  // last journal write began, and its dispatched record waits for the next
  // (BrokerCore).
  bool attempts_due = false;
  // IdIndex::HashOf(id), set by Add: the broker passes it on to the result
  // store, and Erase takes the batch out of the index without hashing or
  // comparing its id again.
  std::uint32_t id_hash = 0;
  TimePoint enqueued_at;
  TimePoint dispatched_at;
  // Durable mode: the journal segment holding its accepted record.
  std::uint64_t journal_segment = 0;

  // When it was added: 1, 2, ... (the order of acceptance).
  std::uint64_t order() const { return order_; }

 private:
  friend class BatchStore;
  std::unique_ptr<char[]> data_;  // id, then payload; null in a free slot
  std::uint64_t order_ = 0;       // when it was added (1, 2, ...); 0 in a free slot
  std::uint64_t generation_ : 36 = 0;  // bumped each time the slot is freed
  std::uint64_t queue_index_ : 28 = 0;
};

class BatchStore {
 public:
  // The batch with this producer-chosen id, if the store holds it.
  std::optional<BatchSeq> FindId(std::string_view id) const {
    return FindId(id, IdIndex::HashOf(id));
  }
  // The same with `hash` == IdIndex::HashOf(id) (computed once per id on
  // the broker's hot paths).
  std::optional<BatchSeq> FindId(std::string_view id, std::uint32_t hash) const;
  // Null if `seq` is not (or no longer) in the store.
  Batch* Get(BatchSeq seq);
  const Batch* Get(BatchSeq seq) const;

  // Adds a new batch at the back of its queue, or, when `pending`, held
  // outside it until Enqueue. Requires: FindId(id) empty.
  BatchSeq Add(std::string_view id, std::string_view queue,
               std::string_view payload, std::string_view owner, TimePoint now,
               bool pending = false) {
    return Add(id, IdIndex::HashOf(id), queue, payload, owner, now, pending);
  }
  // The same with `hash` == IdIndex::HashOf(id).
  BatchSeq Add(std::string_view id, std::uint32_t hash, std::string_view queue,
               std::string_view payload, std::string_view owner, TimePoint now,
               bool pending = false);
  // Puts a pending batch at the back of its queue.
  void Enqueue(BatchSeq seq);

  // Takes the oldest waiting batch from `queues` (every queue when empty),
  // turning round the queues so that none starves. Marks it running.
  std::optional<BatchSeq> Pop(const std::vector<std::string>& queues);

  // Puts a running batch back at the front of its queue (it is older than
  // everything behind it).
  void Requeue(BatchSeq seq);

  // Removes a finished batch, queued or running.
  void Erase(BatchSeq seq);

  // Records the worker a popped (running) batch went to; Requeue clears it.
  void SetWorker(BatchSeq seq, std::string_view worker);

  // Hands the batch's result to another producer (a re-send or fetch from
  // a new connection).
  void SetOwner(BatchSeq seq, std::string_view owner);
  // Batches held (queued or running) whose result goes to `owner`.
  std::size_t OwnedBy(std::string_view owner) const;

  // Every batch, queued or running, in the order they were added.
  std::vector<const Batch*> InOrder() const;
  // Calls f(const Batch&) for every batch held, in no particular order.
  template <typename F>
  void ForEach(F&& f) const {
    for (std::size_t s = 0; s < slots_; ++s) {
      if (Slot(s).order_ != 0) f(Slot(s));
    }
  }

  // Waiting in a queue (not counting pending ones).
  std::size_t queued() const { return queued_; }
  std::size_t pending() const { return pending_; }
  // Payload bytes of every batch held, queued or running.
  std::size_t bytes() const { return bytes_; }
  std::size_t size() const { return live_; }
  std::size_t running() const { return live_ - queued_ - pending_; }
  std::size_t Depth(std::string_view queue) const;
  // Depth of every queue that has ever held a batch, sorted by name.
  std::vector<std::pair<std::string, std::size_t>> Depths() const;

 private:
  // A BatchSeq is a slot index (low kSlotBits) and the slot's generation when
  // the batch was added (the high bits): a freed slot's generation moves on,
  // so an old BatchSeq no longer matches.
  static constexpr int kSlotBits = 28;
  static constexpr std::uint64_t kSlotMask = (std::uint64_t{1} << kSlotBits) - 1;
  static constexpr std::uint64_t kGenerationMask = (std::uint64_t{1} << 36) - 1;
  static constexpr std::size_t kChunkBits = 8;  // 256 slots per chunk
  static constexpr std::size_t kChunkSize = std::size_t{1} << kChunkBits;

  // `items` may hold seqs that were erased while waiting; they are skipped
  // when popped. `depth` is exact.
  struct Queue {
    std::string name;  // never moves: Batch::queue points at it
    std::deque<BatchSeq> items;
    std::size_t depth = 0;
  };

  Batch& Slot(std::size_t slot) { return chunks_[slot >> kChunkBits][slot & (kChunkSize - 1)]; }
  const Batch& Slot(std::size_t slot) const {
    return chunks_[slot >> kChunkBits][slot & (kChunkSize - 1)];
  }
  std::uint32_t NewSlot();
  void ReleaseStorage();
  std::optional<BatchSeq> PopFrom(Queue& q, std::uint32_t queue_index);
  std::uint32_t QueueFor(std::string_view name);

  // Slots in fixed chunks: a Batch never moves (Get's pointers stay valid
  // while more are added), and growing copies nothing.
  std::vector<std::unique_ptr<Batch[]>> chunks_;
  std::size_t slots_ = 0;            // slots made so far
  std::vector<std::uint32_t> free_;  // slots to reuse, last freed first
  std::uint64_t fresh_generation_ = 1;  // of new slots; 1 so that no seq is 0
  std::uint64_t max_generation_ = 0;    // highest generation handed out
  std::size_t live_ = 0;
  IdIndex by_id_;                // id -> slot
  std::deque<Queue> queues_;     // in order of first use, for round robin
  StringMap<std::uint32_t> queue_index_;
  std::size_t next_queue_ = 0;
  BatchSeq next_order_ = 1;
  std::size_t queued_ = 0;
  std::size_t pending_ = 0;
  std::size_t bytes_ = 0;
  NameTable owners_;  // its counts are the batches held per producer
  NameTable workers_;
};

}  // namespace fleet::broker

#include "broker/batch_store.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace fleet::broker {

// Layout, chosen for memory (issue 6: at most 200 bytes per queued batch
// beyond its payload). Rejected, measured at 330-376 bytes: an
// std::unordered_map<BatchSeq, Batch> of five std::strings per batch, a
// second copy of the id as the key of a StringMap index, and a per-producer
// count map beside it. Now:
// - slots in chunks, reused through a free list, with a generation in the
//   BatchSeq so a stale one is detected, not followed;
// - the id and payload in one allocation; the id index holds only a slot and
//   a hash, and reads the id back from the slot;
// - queue, producer and worker names shared: a batch holds Names, and the
//   producer table's counts are OwnedBy.
// The slots are kept while batches come and go (a hot slot is reused at
// once); they are freed when the store empties after holding many, which
// keeps a burst from pinning its peak once it has drained.

namespace {
// Below this many slots an empty store keeps them: a lightly loaded broker
// empties after nearly every batch.
constexpr std::size_t kKeepSlots = 4096;
}  // namespace

std::optional<BatchSeq> BatchStore::FindId(std::string_view id, std::uint32_t hash) const {
  const std::uint32_t slot =
      by_id_.Find(id, hash, [this](std::uint32_t s) { return Slot(s).id; });
  if (slot == IdIndex::kNone) return std::nullopt;
  return (static_cast<BatchSeq>(Slot(slot).generation_) << kSlotBits) | slot;
}

Batch* BatchStore::Get(BatchSeq seq) {
  return const_cast<Batch*>(static_cast<const BatchStore*>(this)->Get(seq));
}

const Batch* BatchStore::Get(BatchSeq seq) const {
  const std::size_t slot = seq & kSlotMask;
  if (slot >= slots_) return nullptr;
  const Batch& b = Slot(slot);
  if (b.order_ == 0 || b.generation_ != (seq >> kSlotBits)) return nullptr;
  return &b;
}

std::uint32_t BatchStore::QueueFor(std::string_view name) {
  auto it = queue_index_.find(name);
  if (it != queue_index_.end()) return it->second;
  const auto index = static_cast<std::uint32_t>(queues_.size());
  queues_.emplace_back().name.assign(name);
  queue_index_.emplace(std::string(name), index);
  return index;
}

std::uint32_t BatchStore::NewSlot() {
  if (!free_.empty()) {
    const std::uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  if (slots_ > kSlotMask) {
    throw std::length_error("BatchStore: more than 2^28 batches held");
  }
  if ((slots_ & (kChunkSize - 1)) == 0) {
    chunks_.push_back(std::make_unique<Batch[]>(kChunkSize));
    for (std::size_t i = 0; i < kChunkSize; ++i) chunks_.back()[i].generation_ = fresh_generation_;
  }
  return static_cast<std::uint32_t>(slots_++);
}

BatchSeq BatchStore::Add(std::string_view id, std::uint32_t hash, std::string_view queue,
                         std::string_view payload, std::string_view owner,
                         TimePoint now, bool pending) {
  const std::uint32_t slot = NewSlot();
  const std::uint32_t qi = QueueFor(queue);
  Batch& b = Slot(slot);
  b.data_ = std::make_unique_for_overwrite<char[]>(id.size() + payload.size());
  std::memcpy(b.data_.get(), id.data(), id.size());
  std::memcpy(b.data_.get() + id.size(), payload.data(), payload.size());
  b.id = std::string_view(b.data_.get(), id.size());
  b.payload = std::string_view(b.data_.get() + id.size(), payload.size());
  b.queue = Name(queues_[qi].name);
  b.owner = owners_.Acquire(owner);
  b.worker = Name();
  b.attempts = 0;
  b.attempts_due = false;
  b.state = pending ? BatchState::kPending : BatchState::kQueued;
  b.enqueued_at = now;
  b.dispatched_at = TimePoint();
  b.journal_segment = 0;
  b.order_ = next_order_++;
  b.queue_index_ = qi;
  max_generation_ = std::max<std::uint64_t>(max_generation_, b.generation_);
  b.id_hash = hash;
  by_id_.Insert(hash, slot);
  const BatchSeq seq = (static_cast<BatchSeq>(b.generation_) << kSlotBits) | slot;
  ++live_;
  bytes_ += payload.size();
  if (pending) {
    ++pending_;
  } else {
    Queue& q = queues_[qi];
    q.items.push_back(seq);
    ++q.depth;
    ++queued_;
  }
  return seq;
}

void BatchStore::Enqueue(BatchSeq seq) {
  Batch* b = Get(seq);
  if (b == nullptr || b->state != BatchState::kPending) return;
  b->state = BatchState::kQueued;
  --pending_;
  Queue& q = queues_[b->queue_index_];
  q.items.push_back(seq);
  ++q.depth;
  ++queued_;
}

std::optional<BatchSeq> BatchStore::PopFrom(Queue& q, std::uint32_t queue_index) {
  while (!q.items.empty()) {
    BatchSeq seq = q.items.front();
    q.items.pop_front();
    Batch* b = Get(seq);
    // Erased while waiting; or, should a slot's generation ever wrap round
    // to a stale seq, a batch of another queue.
    if (b == nullptr || b->state != BatchState::kQueued || b->queue_index_ != queue_index) {
      continue;
    }
    b->state = BatchState::kRunning;
    --q.depth;
    --queued_;
    return seq;
  }
  return std::nullopt;
}

std::optional<BatchSeq> BatchStore::Pop(const std::vector<std::string>& queues) {
  if (queued_ == 0) return std::nullopt;
  if (queues.empty()) {
    // Round robin over every queue, starting after the last one served.
    for (std::size_t i = 0; i < queues_.size(); ++i) {
      std::size_t k = (next_queue_ + i) % queues_.size();
      Queue& q = queues_[k];
      if (q.depth == 0) continue;
      if (auto seq = PopFrom(q, static_cast<std::uint32_t>(k))) {
        next_queue_ = k + 1;
        return seq;
      }
    }
    return std::nullopt;
  }
  for (std::size_t i = 0; i < queues.size(); ++i) {
    std::size_t k = (next_queue_ + i) % queues.size();
    auto it = queue_index_.find(queues[k]);
    if (it == queue_index_.end() || queues_[it->second].depth == 0) continue;
    if (auto seq = PopFrom(queues_[it->second], it->second)) {
      next_queue_ = k + 1;
      return seq;
    }
  }
  return std::nullopt;
}

void BatchStore::Requeue(BatchSeq seq) {
  Batch* b = Get(seq);
  if (b == nullptr || b->state != BatchState::kRunning) return;
  b->state = BatchState::kQueued;
  workers_.Release(b->worker);
  b->worker = Name();
  Queue& q = queues_[b->queue_index_];
  q.items.push_front(seq);
  ++q.depth;
  ++queued_;
}

void BatchStore::Erase(BatchSeq seq) {
  Batch* b = Get(seq);
  if (b == nullptr) return;
  if (b->state == BatchState::kQueued) {
    // Its seq stays in the deque and is skipped when popped.
    --queues_[b->queue_index_].depth;
    --queued_;
  } else if (b->state == BatchState::kPending) {
    --pending_;
  }
  bytes_ -= b->payload.size();
  by_id_.EraseValue(b->id_hash, static_cast<std::uint32_t>(seq & kSlotMask));
  owners_.Release(b->owner);
  workers_.Release(b->worker);
  b->owner = Name();
  b->worker = Name();
  b->queue = Name();
  b->id = {};
  b->payload = {};
  b->data_.reset();
  b->order_ = 0;
  b->generation_ = b->generation_ + 1;  // 36 bits: wraps after 6.9e10 reuses
  free_.push_back(static_cast<std::uint32_t>(seq & kSlotMask));
  if (--live_ == 0 && slots_ > kKeepSlots) ReleaseStorage();
}

void BatchStore::ReleaseStorage() {
  // Empty: every seq in a queue's items is stale, and every slot free. New
  // slots start past every generation handed out, so no old seq matches them.
  for (Queue& q : queues_) std::deque<BatchSeq>().swap(q.items);
  std::vector<std::unique_ptr<Batch[]>>().swap(chunks_);
  std::vector<std::uint32_t>().swap(free_);
  slots_ = 0;
  fresh_generation_ = (max_generation_ + 1) & kGenerationMask;
  by_id_.Clear();
}

std::size_t BatchStore::Depth(std::string_view queue) const {
  auto it = queue_index_.find(queue);
  return it == queue_index_.end() ? 0 : queues_[it->second].depth;
}

std::vector<std::pair<std::string, std::size_t>> BatchStore::Depths() const {
  std::vector<std::pair<std::string, std::size_t>> out;
  out.reserve(queues_.size());
  for (const Queue& q : queues_) out.emplace_back(q.name, q.depth);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<const Batch*> BatchStore::InOrder() const {
  std::vector<const Batch*> out;
  out.reserve(live_);
  for (std::size_t s = 0; s < slots_; ++s) {
    if (Slot(s).order_ != 0) out.push_back(&Slot(s));
  }
  std::sort(out.begin(), out.end(),
            [](const Batch* a, const Batch* b) { return a->order_ < b->order_; });
  return out;
}

void BatchStore::SetWorker(BatchSeq seq, std::string_view worker) {
  Batch* b = Get(seq);
  if (b == nullptr || b->worker == worker) return;
  Name name = workers_.Acquire(worker);  // before the release: `worker` may be its text
  workers_.Release(b->worker);
  b->worker = name;
}

void BatchStore::SetOwner(BatchSeq seq, std::string_view owner) {
  Batch* b = Get(seq);
  if (b == nullptr || b->owner == owner) return;
  Name name = owners_.Acquire(owner);  // before the release: `owner` may be its text
  owners_.Release(b->owner);
  b->owner = name;
}

std::size_t BatchStore::OwnedBy(std::string_view owner) const { return owners_.Count(owner); }

}  // namespace fleet::broker

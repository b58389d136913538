#include "broker/batch_store.h"

#include <algorithm>

namespace fleet::broker {

std::optional<BatchSeq> BatchStore::FindId(std::string_view id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

Batch* BatchStore::Get(BatchSeq seq) {
  auto it = batches_.find(seq);
  return it == batches_.end() ? nullptr : &it->second;
}

const Batch* BatchStore::Get(BatchSeq seq) const {
  auto it = batches_.find(seq);
  return it == batches_.end() ? nullptr : &it->second;
}

BatchStore::Queue& BatchStore::QueueFor(std::string_view name) {
  auto it = queues_.find(name);
  if (it != queues_.end()) return it->second;
  order_.emplace_back(name);
  return queues_.emplace(std::string(name), Queue{}).first->second;
}

BatchSeq BatchStore::Add(std::string_view id, std::string_view queue,
                         std::string_view payload, std::string_view owner,
                         TimePoint now) {
  BatchSeq seq = next_seq_++;
  Batch& b = batches_[seq];
  b.id.assign(id);
  b.queue.assign(queue);
  b.payload.assign(payload);
  b.owner.assign(owner);
  b.enqueued_at = now;
  by_id_.emplace(b.id, seq);
  Queue& q = QueueFor(queue);
  q.items.push_back(seq);
  ++q.depth;
  ++queued_;
  bytes_ += payload.size();
  ++per_owner_[b.owner];
  return seq;
}

std::optional<BatchSeq> BatchStore::PopFrom(Queue& q) {
  while (!q.items.empty()) {
    BatchSeq seq = q.items.front();
    q.items.pop_front();
    Batch* b = Get(seq);
    if (b == nullptr || b->state != BatchState::kQueued) continue;  // erased
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
    for (std::size_t i = 0; i < order_.size(); ++i) {
      std::size_t k = (next_queue_ + i) % order_.size();
      Queue& q = queues_.find(order_[k])->second;
      if (q.depth == 0) continue;
      if (auto seq = PopFrom(q)) {
        next_queue_ = k + 1;
        return seq;
      }
    }
    return std::nullopt;
  }
  for (std::size_t i = 0; i < queues.size(); ++i) {
    std::size_t k = (next_queue_ + i) % queues.size();
    auto it = queues_.find(queues[k]);
    if (it == queues_.end() || it->second.depth == 0) continue;
    if (auto seq = PopFrom(it->second)) {
      next_queue_ = k + 1;
      return seq;
    }
  }
  return std::nullopt;
}

void BatchStore::Requeue(BatchSeq seq) {
  Batch* b = Get(seq);
  if (b == nullptr || b->state == BatchState::kQueued) return;
  b->state = BatchState::kQueued;
  b->worker.clear();
  Queue& q = QueueFor(b->queue);
  q.items.push_front(seq);
  ++q.depth;
  ++queued_;
}

void BatchStore::Erase(BatchSeq seq) {
  auto it = batches_.find(seq);
  if (it == batches_.end()) return;
  if (it->second.state == BatchState::kQueued) {
    // Its seq stays in the deque and is skipped when popped.
    --QueueFor(it->second.queue).depth;
    --queued_;
  }
  bytes_ -= it->second.payload.size();
  if (auto o = per_owner_.find(it->second.owner); o != per_owner_.end() && --o->second == 0) {
    per_owner_.erase(o);
  }
  by_id_.erase(it->second.id);
  batches_.erase(it);
}

std::size_t BatchStore::Depth(std::string_view queue) const {
  auto it = queues_.find(queue);
  return it == queues_.end() ? 0 : it->second.depth;
}

std::vector<std::pair<std::string, std::size_t>> BatchStore::Depths() const {
  std::vector<std::pair<std::string, std::size_t>> out;
  out.reserve(queues_.size());
  for (const auto& [name, q] : queues_) out.emplace_back(name, q.depth);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<const Batch*> BatchStore::InOrder() const {
  std::vector<std::pair<BatchSeq, const Batch*>> all;
  all.reserve(batches_.size());
  for (const auto& [seq, b] : batches_) all.emplace_back(seq, &b);
  std::sort(all.begin(), all.end());
  std::vector<const Batch*> out;
  out.reserve(all.size());
  for (const auto& [seq, b] : all) out.push_back(b);
  return out;
}

void BatchStore::SetOwner(BatchSeq seq, std::string_view owner) {
  Batch* b = Get(seq);
  if (b == nullptr || b->owner == owner) return;
  if (auto o = per_owner_.find(b->owner); o != per_owner_.end() && --o->second == 0) {
    per_owner_.erase(o);
  }
  b->owner.assign(owner);
  ++per_owner_[b->owner];
}

std::size_t BatchStore::OwnedBy(std::string_view owner) const {
  auto it = per_owner_.find(owner);
  return it == per_owner_.end() ? 0 : it->second;
}

}  // namespace fleet::broker

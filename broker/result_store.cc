#include "broker/result_store.h"

#include <algorithm>

namespace fleet::broker {

ResultStore::ResultStore(Duration retention, std::size_t max_entries)
    : retention_(retention),
      max_entries_(std::clamp<std::size_t>(max_entries, 1, std::size_t{1} << 31)) {}

std::uint32_t ResultStore::IndexOf(std::string_view id) const {
  return index_.Find(id, [this](std::uint32_t v) { return std::string_view(At(v).id); });
}

const StoredResult* ResultStore::Find(std::string_view id) const {
  const std::uint32_t v = IndexOf(id);
  return v == IdIndex::kNone ? nullptr : &At(v).result;
}

const StoredResult* ResultStore::Put(std::string_view id, StoredResult result) {
  if (IndexOf(id) != IdIndex::kNone) return nullptr;
  const std::uint64_t seq = front_seq_ + entries_.size();
  // push_back leaves every other element of a deque where it is, so the
  // pointers handed out before stay valid.
  entries_.push_back(Entry{std::string(id), std::move(result)});
  index_.Insert(id, static_cast<std::uint32_t>(seq % kSeqMod));
  return &entries_.back().result;
}

void ResultStore::DropOldest() {
  if (entries_.empty()) return;
  index_.Erase(entries_.front().id,
               [this](std::uint32_t v) { return std::string_view(At(v).id); });
  entries_.pop_front();
  ++front_seq_;
}

std::size_t ResultStore::Trim(TimePoint now) {
  std::size_t dropped = 0;
  // Results are appended in finishing order, so the oldest are in front.
  while (!entries_.empty() && now - entries_.front().result.finished_at >= retention_) {
    DropOldest();
    ++dropped;
  }
  while (entries_.size() > max_entries_) {
    DropOldest();
    ++evicted_early_;
    ++dropped;
  }
  return dropped;
}

}  // namespace fleet::broker

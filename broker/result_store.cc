#include "broker/result_store.h"

#include <algorithm>

namespace fleet::broker {

ResultStore::ResultStore(Duration retention, std::size_t max_entries)
    : retention_(retention), max_entries_(std::max<std::size_t>(1, max_entries)) {}

std::shared_ptr<const StoredResult> ResultStore::Find(std::string_view id) const {
  auto it = results_.find(id);
  return it == results_.end() ? nullptr : it->second;
}

std::shared_ptr<const StoredResult> ResultStore::Put(std::string_view id, StoredResult result) {
  if (results_.find(id) != results_.end()) return nullptr;
  while (results_.size() >= max_entries_) {
    DropOldest();
    ++evicted_early_;
  }
  auto stored = std::make_shared<const StoredResult>(std::move(result));
  auto it = results_.emplace(std::string(id), stored).first;
  order_.push_back(it->first);
  return stored;
}

void ResultStore::DropOldest() {
  if (order_.empty()) return;
  results_.erase(order_.front());
  order_.pop_front();
}

std::size_t ResultStore::Expire(TimePoint now) {
  std::size_t dropped = 0;
  // Results are appended in finishing order, so the oldest are in front.
  while (!order_.empty()) {
    auto it = results_.find(order_.front());
    if (it != results_.end() && now - it->second->finished_at < retention_) break;
    DropOldest();
    ++dropped;
  }
  return dropped;
}

}  // namespace fleet::broker

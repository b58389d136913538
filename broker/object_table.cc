#include "broker/object_table.h"

#include <algorithm>

namespace fleet::broker {

bool ObjectTable::HasRoom(std::string_view worker, std::uint32_t slots) const {
  if (by_token_.size() >= kMaxTotal) return false;
  auto it = per_worker_.find(worker);
  return it == per_worker_.end() || it->second < kMaxPerSlot * std::max<std::uint32_t>(slots, 1);
}

std::uint64_t ObjectTable::Add(PendingObject p) {
  const std::uint64_t token = next_token_++;
  auto it = per_worker_.find(p.worker);
  if (it == per_worker_.end()) {
    per_worker_.emplace(p.worker, 1);
  } else {
    ++it->second;
  }
  by_token_.emplace(token, std::move(p));
  return token;
}

void ObjectTable::Uncount(const std::string& worker) {
  auto it = per_worker_.find(worker);
  if (it == per_worker_.end()) return;
  if (--it->second == 0) per_worker_.erase(it);
}

bool ObjectTable::Take(std::uint64_t token, PendingObject* out) {
  auto it = by_token_.find(token);
  if (it == by_token_.end()) return false;
  *out = std::move(it->second);
  by_token_.erase(it);
  Uncount(out->worker);
  return true;
}

void ObjectTable::Restore(std::uint64_t token, PendingObject p) {
  ++per_worker_[p.worker];
  by_token_.emplace(token, std::move(p));
}

template <typename Pred>
std::vector<PendingObject> ObjectTable::TakeIf(Pred pred) {
  // In token order (the order they were asked), so answers are too.
  std::vector<std::uint64_t> tokens;
  for (const auto& [token, p] : by_token_) {
    if (pred(p)) tokens.push_back(token);
  }
  std::sort(tokens.begin(), tokens.end());
  std::vector<PendingObject> out;
  out.reserve(tokens.size());
  for (std::uint64_t token : tokens) {
    out.emplace_back();
    Take(token, &out.back());
  }
  return out;
}

std::vector<PendingObject> ObjectTable::TakeExpired(TimePoint now) {
  if (by_token_.empty()) return {};
  return TakeIf([now](const PendingObject& p) { return p.deadline <= now; });
}

std::vector<PendingObject> ObjectTable::TakeOwnedBy(std::string_view owner) {
  if (by_token_.empty()) return {};
  return TakeIf([owner](const PendingObject& p) { return p.owner == owner; });
}

std::vector<PendingObject> ObjectTable::TakeWorker(std::string_view worker) {
  if (per_worker_.find(worker) == per_worker_.end()) return {};
  return TakeIf([worker](const PendingObject& p) { return p.worker == worker; });
}

}  // namespace fleet::broker

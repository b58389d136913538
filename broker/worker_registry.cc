#include "broker/worker_registry.h"

#include <algorithm>

namespace fleet::broker {

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle: return "idle";
    case WorkerState::kBusy: return "busy";
    case WorkerState::kRetiring: return "retiring";
  }
  return "unknown";
}

Worker* WorkerRegistry::Find(std::string_view id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

Worker* WorkerRegistry::FindByIdentity(std::string_view identity) {
  auto it = id_by_identity_.find(identity);
  return it == id_by_identity_.end() ? nullptr : Find(it->second);
}

Worker& WorkerRegistry::Add(std::string_view id, std::string_view identity,
                            TimePoint now) {
  Worker& w = by_id_[std::string(id)];
  w.id.assign(id);
  w.identity.assign(identity);
  w.registered_at = now;
  w.idle_since = now;
  w.last_seen = now;
  w.last_sent = now;
  id_by_identity_[w.identity] = w.id;
  return w;
}

void WorkerRegistry::Remove(std::string_view id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  auto ident = id_by_identity_.find(it->second.identity);
  if (ident != id_by_identity_.end() && ident->second == id) {
    id_by_identity_.erase(ident);
  }
  // Its entry in ready_, if any, is skipped by NextReady.
  by_id_.erase(it);
}

void WorkerRegistry::MarkReady(Worker& w) {
  if (w.in_ready || w.retiring || w.credit == 0) return;
  w.in_ready = true;
  ready_.push_back(w.id);
}

std::optional<std::string> WorkerRegistry::NextReady() {
  while (!ready_.empty()) {
    std::string id = std::move(ready_.front());
    ready_.pop_front();
    Worker* w = Find(id);
    // A worker removed and re-added under the same id while listed would be
    // listed twice; in_ready tells the live listing from the stale one.
    if (w == nullptr || !w->in_ready) continue;
    w->in_ready = false;
    return id;
  }
  return std::nullopt;
}

std::array<std::size_t, 3> WorkerRegistry::CountByState() const {
  std::array<std::size_t, 3> n{0, 0, 0};
  for (const auto& [id, w] : by_id_) ++n[static_cast<int>(w.state())];
  return n;
}

std::vector<std::string> WorkerRegistry::Ids() const {
  std::vector<std::string> ids;
  ids.reserve(by_id_.size());
  for (const auto& [id, w] : by_id_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace fleet::broker

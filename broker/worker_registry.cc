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
  Unlist(it->second);
  by_id_.erase(it);
}

void WorkerRegistry::Unlist(Worker& w) {
  if (!w.in_ready) return;
  ready_.erase(w.ready_pos);
  w.in_ready = false;
}

void WorkerRegistry::MarkReady(Worker& w, Recency recency) {
  if (w.retiring || w.credit == 0) {
    Unlist(w);
    return;
  }
  if (recency == Recency::kJustBusy) {
    if (w.in_ready) {
      ready_.splice(ready_.begin(), ready_, w.ready_pos);  // iterators stay valid
    } else {
      w.ready_pos = ready_.insert(ready_.begin(), w.id);
    }
  } else if (!w.in_ready) {
    w.ready_pos = ready_.insert(ready_.end(), w.id);
  }
  w.in_ready = true;
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

#include "broker/blacklist.h"

namespace fleet::broker {

void Blacklist::Add(std::string_view id, TimePoint now) {
  auto it = until_.find(id);
  if (it == until_.end()) {
    until_.emplace(std::string(id), now + ttl_);
  } else {
    it->second = now + ttl_;
  }
}

void Blacklist::Remove(std::string_view id) {
  auto it = until_.find(id);
  if (it != until_.end()) until_.erase(it);
}

bool Blacklist::Contains(std::string_view id, TimePoint now) const {
  auto it = until_.find(id);
  return it != until_.end() && now < it->second;
}

std::size_t Blacklist::Purge(TimePoint now) {
  std::size_t n = 0;
  for (auto it = until_.begin(); it != until_.end();) {
    if (now >= it->second) {
      it = until_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

}  // namespace fleet::broker

// Blacklist: ids of retired workers that must get no work until their entry
// expires. A worker that reconnects with a listed id is told to stop.
//
// Pure state: callers pass `now`. Not thread-safe; the broker loop owns it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/string_map.h"

namespace fleet::broker {

class Blacklist {
 public:
  explicit Blacklist(Duration ttl) : ttl_(ttl) {}

  // Lists `id` until now + ttl (extends an existing entry).
  void Add(std::string_view id, TimePoint now);
  void Remove(std::string_view id);
  // True while the entry of `id` has not expired.
  bool Contains(std::string_view id, TimePoint now) const;
  // Drops expired entries; returns how many.
  std::size_t Purge(TimePoint now);
  std::size_t size() const { return until_.size(); }
  Duration ttl() const { return ttl_; }

 private:
  Duration ttl_;
  StringMap<TimePoint> until_;
};

}  // namespace fleet::broker

// ResultStore: results of finished batches, kept for a retention time so a
// re-submitted or fetched id gets its one result again instead of running a
// second time. Bounded both in time and in count.
//
// Pure state: callers pass `now`. Not thread-safe; the broker loop owns it.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/protocol.h"
#include "common/string_map.h"

namespace fleet::broker {

struct StoredResult {
  proto::Outcome outcome = proto::Outcome::kOk;
  std::uint32_t attempts = 0;
  std::string result;
  std::string error;
  TimePoint finished_at;
};

class ResultStore {
 public:
  // retention: how long a result is kept (0 keeps none past the current
  // loop turn); max_entries >= 1: past it the oldest result goes first.
  ResultStore(Duration retention, std::size_t max_entries);

  // Null if the id has no stored result. Shared, so a result on its way to
  // a producer survives its eviction from the store.
  std::shared_ptr<const StoredResult> Find(std::string_view id) const;

  // Stores the result of `id` and returns it; the first result wins: a
  // second Put of the same id keeps the stored one and returns null.
  std::shared_ptr<const StoredResult> Put(std::string_view id, StoredResult result);

  // Drops results older than the retention. Returns how many went.
  std::size_t Expire(TimePoint now);

  std::size_t size() const { return results_.size(); }
  std::uint64_t evicted_early() const { return evicted_early_; }

 private:
  void DropOldest();

  Duration retention_;
  std::size_t max_entries_;
  StringMap<std::shared_ptr<const StoredResult>> results_;
  std::deque<std::string> order_;  // ids, oldest first
  std::uint64_t evicted_early_ = 0;
};

}  // namespace fleet::broker

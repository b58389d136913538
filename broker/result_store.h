// ResultStore: results of finished batches, kept for a retention time so a
// re-submitted or fetched id gets its one result again instead of running a
// second time. Bounded both in time and in count.
//
// Results leave in the order they came (both bounds drop the oldest), so
// they live in a FIFO, found by id through an IdIndex whose values are
// positions in that FIFO: every finished batch costs one Put and, once the
// store is full, one eviction, each a probe of a flat table instead of a
// walk through heap nodes (this store took a third of the broker's time
// per batch under load).
//
// Find and Put hand out plain pointers into the FIFO, valid until the next
// Trim: the broker sends the results of a loop turn, then trims, so no
// eviction can pull a result from under the outbox, without a reference
// count per result. Between trims the store may hold one turn's results
// beyond max_entries.
//
// Pure state: callers pass `now`. Not thread-safe; the broker loop owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

#include "broker/id_index.h"
#include "common/clock.h"
#include "common/protocol.h"

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

  // Null if the id has no stored result. Valid until the next Trim.
  const StoredResult* Find(std::string_view id) const;

  // Stores the result of `id` and returns it (valid until the next Trim);
  // the first result wins: a second Put of the same id keeps the stored one
  // and returns null.
  const StoredResult* Put(std::string_view id, StoredResult result);

  // Drops results older than the retention, then the oldest beyond
  // max_entries (counted in evicted_early). Returns how many went.
  std::size_t Trim(TimePoint now);

  std::size_t size() const { return entries_.size(); }
  std::uint64_t evicted_early() const { return evicted_early_; }

 private:
  struct Entry {
    std::string id;
    StoredResult result;
  };
  // Index values are sequence numbers modulo kSeqMod, which never reaches
  // IdIndex::kNone; the store holds far fewer than kSeqMod entries.
  static constexpr std::uint64_t kSeqMod = IdIndex::kNone;

  // The entry an index value names (it must be in the store).
  const Entry& At(std::uint32_t value) const {
    const std::uint64_t front = front_seq_ % kSeqMod;
    return entries_[(value + kSeqMod - front) % kSeqMod];
  }
  // The index value of `id`, or IdIndex::kNone.
  std::uint32_t IndexOf(std::string_view id) const;
  void DropOldest();

  Duration retention_;
  std::size_t max_entries_;
  std::deque<Entry> entries_;  // oldest first
  std::uint64_t front_seq_ = 0;  // sequence number of entries_.front()
  IdIndex index_;
  std::uint64_t evicted_early_ = 0;
};

}  // namespace fleet::broker

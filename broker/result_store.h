// ResultStore: results of finished batches, kept for a retention time so a
// re-submitted or fetched id gets its one result again instead of running a
// second time. Bounded both in time and in count.
//
// Results leave in the order they came (both bounds drop the oldest), so
// they live in a FIFO, found by id through an IdIndex whose values are
// positions in that FIFO: every finished batch costs one Put and, once the
// store is full, one eviction, each a probe of a flat table instead of a
// walk through heap nodes (this store took a third of the broker's time
// per batch under load). Put checks and inserts in one probe, and an
// eviction finds its entry by the hash kept with it.
//
// The bytes of each result (id, result, error) are copied into a byte ring
// of large chunks in the same FIFO order, so storing one is a copy, not a
// malloc, and dropping one frees nothing until its whole chunk is done
// (freeing each old result's string, cold in the cache, was a tenth of the
// broker's CPU per batch). One spare chunk is kept for reuse, so a store in
// steady state allocates nothing; an emptied store keeps only the spare.
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
#include <memory>
#include <string_view>

#include "common/id_index.h"
#include "common/clock.h"
#include "common/protocol.h"

namespace fleet::broker {

// As passed to Put, the views may point anywhere (Put copies them); as
// handed out by Put and Find, they point into the store.
struct StoredResult {
  proto::Outcome outcome = proto::Outcome::kOk;
  std::uint32_t attempts = 0;
  std::string_view result;
  std::string_view error;
  TimePoint finished_at;
};

class ResultStore {
 public:
  // retention: how long a result is kept (0 keeps none past the current
  // loop turn); max_entries >= 1: past it the oldest result goes first.
  ResultStore(Duration retention, std::size_t max_entries);

  // Null if the id has no stored result. Valid until the next Trim.
  const StoredResult* Find(std::string_view id) const {
    return Find(id, IdIndex::HashOf(id));
  }
  // The same with `hash` == IdIndex::HashOf(id) (computed once per id on
  // the broker's hot paths).
  const StoredResult* Find(std::string_view id, std::uint32_t hash) const;

  // Stores a copy of the result of `id` and returns it (valid until the
  // next Trim); the first result wins: a second Put of the same id keeps
  // the stored one and returns null.
  const StoredResult* Put(std::string_view id, const StoredResult& result) {
    return Put(id, IdIndex::HashOf(id), result);
  }
  const StoredResult* Put(std::string_view id, std::uint32_t hash, const StoredResult& result);

  // Drops results older than the retention, then the oldest beyond
  // max_entries (counted in evicted_early). Returns how many went.
  std::size_t Trim(TimePoint now);

  std::size_t size() const { return entries_.size(); }
  std::uint64_t evicted_early() const { return evicted_early_; }
  // Bytes of memory the byte ring holds (its chunks and the spare).
  std::size_t ring_bytes() const { return ring_bytes_; }

  // A chunk's size; a result larger than this gets a chunk of its own.
  static constexpr std::size_t kChunkBytes = 256u << 10;

 private:
  struct Entry {
    std::string_view id;  // in the ring
    StoredResult result;
    // IdIndex::HashOf(id): the oldest result leaves the index without its
    // id (cold in the cache by then) being read or hashed again.
    std::uint32_t hash = 0;
  };
  struct Chunk {
    std::unique_ptr<char[]> data;
    std::size_t capacity = 0;
    std::size_t used = 0;
    std::uint64_t last_seq = 0;  // the newest entry with bytes here
  };
  // Index values are sequence numbers modulo kSeqMod, which never reaches
  // IdIndex::kNone; the store holds far fewer than kSeqMod entries.
  static constexpr std::uint64_t kSeqMod = IdIndex::kNone;

  // The entry an index value names (it must be in the store).
  const Entry& At(std::uint32_t value) const {
    const std::uint64_t front = front_seq_ % kSeqMod;
    return entries_[(value + kSeqMod - front) % kSeqMod];
  }
  void DropOldest();
  // Room for `n` bytes of entry `seq` at the ring's tail.
  char* Reserve(std::size_t n, std::uint64_t seq);

  Duration retention_;
  std::size_t max_entries_;
  std::deque<Entry> entries_;  // oldest first
  std::uint64_t front_seq_ = 0;  // sequence number of entries_.front()
  IdIndex index_;
  std::deque<Chunk> chunks_;  // oldest first, as entries_
  Chunk spare_;               // a done kChunkBytes chunk, or empty
  std::size_t ring_bytes_ = 0;
  std::uint64_t evicted_early_ = 0;
};

}  // namespace fleet::broker

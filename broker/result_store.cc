#include "broker/result_store.h"

#include <algorithm>
#include <cstring>

namespace fleet::broker {

ResultStore::ResultStore(Duration retention, std::size_t max_entries)
    : retention_(retention),
      max_entries_(std::clamp<std::size_t>(max_entries, 1, std::size_t{1} << 31)) {}

const StoredResult* ResultStore::Find(std::string_view id, std::uint32_t hash) const {
  const std::uint32_t v = index_.Find(id, hash, [this](std::uint32_t v) { return At(v).id; });
  return v == IdIndex::kNone ? nullptr : &At(v).result;
}

char* ResultStore::Reserve(std::size_t n, std::uint64_t seq) {
  if (chunks_.empty() || chunks_.back().capacity - chunks_.back().used < n) {
    Chunk c;
    if (n <= kChunkBytes && spare_.data) {
      c = std::move(spare_);
      spare_ = Chunk();
    } else {
      c.capacity = std::max(n, kChunkBytes);
      c.data = std::make_unique_for_overwrite<char[]>(c.capacity);
      ring_bytes_ += c.capacity;
    }
    c.used = 0;
    chunks_.push_back(std::move(c));
  }
  Chunk& tail = chunks_.back();
  char* at = tail.data.get() + tail.used;
  tail.used += n;
  tail.last_seq = seq;
  return at;
}

const StoredResult* ResultStore::Put(std::string_view id, std::uint32_t hash,
                                     const StoredResult& result) {
  const std::uint64_t seq = front_seq_ + entries_.size();
  // Checked and filed in one probe, under the entry pushed below (the probe
  // reads back only entries already there).
  const auto value = static_cast<std::uint32_t>(seq % kSeqMod);
  if (index_.InsertIfAbsent(id, hash, value, [this](std::uint32_t v) { return At(v).id; }) !=
      IdIndex::kNone) {
    return nullptr;
  }
  try {
    char* at = Reserve(id.size() + result.result.size() + result.error.size(), seq);
    auto copy = [&at](std::string_view from) {
      if (!from.empty()) std::memcpy(at, from.data(), from.size());
      std::string_view to(at, from.size());
      at += from.size();
      return to;
    };
    Entry e;
    e.id = copy(id);
    e.result = result;
    e.result.result = copy(result.result);
    e.result.error = copy(result.error);
    e.hash = hash;
    // push_back leaves every other element of a deque where it is, so the
    // pointers handed out before stay valid.
    entries_.push_back(e);
  } catch (...) {
    index_.EraseValue(hash, value);  // no entry of a result that was not stored
    throw;
  }
  return &entries_.back().result;
}

void ResultStore::DropOldest() {
  if (entries_.empty()) return;
  index_.EraseValue(entries_.front().hash, static_cast<std::uint32_t>(front_seq_ % kSeqMod));
  entries_.pop_front();
  ++front_seq_;
  // Chunks hold entries in order: one is done once its newest entry is
  // gone (and all are once the store is empty, even one left empty by a
  // result too large for it).
  while (!chunks_.empty() && (entries_.empty() || chunks_.front().last_seq < front_seq_)) {
    Chunk done = std::move(chunks_.front());
    chunks_.pop_front();
    if (done.capacity == kChunkBytes && !spare_.data) {
      spare_ = std::move(done);
    } else {
      ring_bytes_ -= done.capacity;
    }
  }
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

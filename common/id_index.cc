#include "common/id_index.h"

#include <utility>

namespace fleet {

// Rejected: std::unordered_map<std::string_view, std::uint32_t>, a heap
// node of 40 bytes (48 with malloc's header) plus 8 to 16 bytes of buckets
// per key; and Robin Hood ordering, whose shorter worst case is not needed at
// this load and whose insert is more code to get right.

namespace {
constexpr std::size_t kMinCapacity = 16;
}  // namespace

void IdIndex::Reserve() {
  // At most 13/16 full: linear probing stays short (an unsuccessful lookup,
  // which every new submit makes, scans a few entries on average).
  if ((size_ + 1) * 16 > entries_.size() * 13) {
    Rehash(entries_.empty() ? kMinCapacity : entries_.size() * 2);
  }
}

void IdIndex::Insert(std::uint32_t hash, std::uint32_t value) {
  Reserve();
  Place(Entry{value, hash});
  ++size_;
}

void IdIndex::Place(Entry e) {
  std::size_t i = e.hash & mask_;
  while (entries_[i].value != kNone) i = (i + 1) & mask_;
  entries_[i] = e;
}

void IdIndex::EraseAt(std::size_t i) {
  // Backward shift: move each later entry of the run into the hole when its
  // home slot is not between the hole and itself, so every key stays
  // reachable from its home without tombstones.
  std::size_t hole = i;
  for (std::size_t j = (i + 1) & mask_; entries_[j].value != kNone; j = (j + 1) & mask_) {
    const std::size_t home = entries_[j].hash & mask_;
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      entries_[hole] = entries_[j];
      hole = j;
    }
  }
  entries_[hole] = Entry{};
  --size_;
}

void IdIndex::Rehash(std::size_t capacity) {
  std::vector<Entry> old(capacity);
  old.swap(entries_);
  mask_ = capacity - 1;
  for (const Entry& e : old) {
    if (e.value != kNone) Place(e);
  }
}

void IdIndex::Clear() {
  std::vector<Entry>().swap(entries_);
  mask_ = 0;
  size_ = 0;
}

}  // namespace fleet

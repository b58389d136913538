// IdIndex: a hash index from a string key to a 32-bit value, where the key
// is not stored in the index but read back through the value (the caller's
// `key_of(value)`), so a key that already lives elsewhere is not kept twice.
// The broker's BatchStore uses it to find a batch's slot by the batch's id,
// its ResultStore a retained result by its batch's id, and the producer's
// BatchTracker an outstanding batch by its id. The table grows, never
// shrinks (Clear frees it).
//
// Open addressing with linear probing: one 8-byte entry (the value and 32
// bits of the key's hash) per slot of a power-of-two table at most 13/16
// full, so about 10 to 20 bytes per key. Erase shifts later entries back
// rather than leaving tombstones, so lookups never slow down with churn.
// Pure state; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

namespace fleet {

class IdIndex {
 public:
  static constexpr std::uint32_t kNone = UINT32_MAX;

  // The hash the index files `key` under. A caller that looks one key up
  // in several places, or erases it later, computes it once and passes it
  // to the overloads that take it.
  static std::uint32_t HashOf(std::string_view key) {
    return static_cast<std::uint32_t>(std::hash<std::string_view>()(key));
  }

  // The value stored for `key`, or kNone. `key_of(value)` must return the
  // key each stored value was inserted with.
  template <typename KeyOf>
  std::uint32_t Find(std::string_view key, const KeyOf& key_of) const {
    return Find(key, HashOf(key), key_of);
  }
  // The same with `hash` == HashOf(key).
  template <typename KeyOf>
  std::uint32_t Find(std::string_view key, std::uint32_t hash, const KeyOf& key_of) const {
    if (entries_.empty()) return kNone;
    for (std::size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.value == kNone) return kNone;
      if (e.hash == hash && key_of(e.value) == key) return e.value;
    }
  }

  // Adds `value` under `key`. Requires: `key` not present, value != kNone.
  void Insert(std::string_view key, std::uint32_t value) { Insert(HashOf(key), value); }
  // The same with `hash` == HashOf(key).
  void Insert(std::uint32_t hash, std::uint32_t value);

  // Adds `value` under `key` (`hash` == HashOf(key)) unless `key` is there:
  // then returns its value and changes nothing; kNone when it was added.
  // One probe where Find and Insert take two. Requires: value != kNone.
  template <typename KeyOf>
  std::uint32_t InsertIfAbsent(std::string_view key, std::uint32_t hash, std::uint32_t value,
                               const KeyOf& key_of) {
    Reserve();
    std::size_t i = hash & mask_;
    for (;; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.value == kNone) break;
      if (e.hash == hash && key_of(e.value) == key) return e.value;
    }
    entries_[i] = Entry{value, hash};
    ++size_;
    return kNone;
  }

  // Removes the entry holding `value`, filed under `hash` (the HashOf its
  // key was inserted with): no key is read or hashed again, for a caller
  // that kept the hash. False if it was not there.
  bool EraseValue(std::uint32_t hash, std::uint32_t value) {
    if (entries_.empty()) return false;
    for (std::size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.value == kNone) return false;
      if (e.value == value && e.hash == hash) {
        EraseAt(i);
        return true;
      }
    }
  }

  // Removes `key`; false if it was not there.
  template <typename KeyOf>
  bool Erase(std::string_view key, const KeyOf& key_of) {
    if (entries_.empty()) return false;
    const std::uint32_t h = HashOf(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.value == kNone) return false;
      if (e.hash == h && key_of(e.value) == key) {
        EraseAt(i);
        return true;
      }
    }
  }

  IdIndex() = default;
  IdIndex(const IdIndex&) = default;
  IdIndex& operator=(const IdIndex&) = default;
  // A moved-from index is empty.
  IdIndex(IdIndex&& o) noexcept
      : entries_(std::move(o.entries_)),
        mask_(std::exchange(o.mask_, 0)),
        size_(std::exchange(o.size_, 0)) {}
  IdIndex& operator=(IdIndex&& o) noexcept {
    entries_ = std::move(o.entries_);
    o.entries_.clear();
    mask_ = std::exchange(o.mask_, 0);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  std::size_t size() const { return size_; }
  // Entries allocated (0 or a power of two).
  std::size_t capacity() const { return entries_.size(); }
  // Forgets every key and frees the table.
  void Clear();

 private:
  struct Entry {
    std::uint32_t value = kNone;
    std::uint32_t hash = 0;
  };

  // Grows the table if one more entry would make it more than 13/16 full.
  void Reserve();
  void Place(Entry e);
  void EraseAt(std::size_t i);
  void Rehash(std::size_t capacity);

  std::vector<Entry> entries_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace fleet

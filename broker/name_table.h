// Name and NameTable: short strings that many batches share (a queue, the
// routing id of a producer, a worker id), kept once and referred to by a
// pointer-sized Name instead of a std::string per batch.
//
// A NameTable owns each distinct text once, with a count of the Names handed
// out for it, and forgets the text when the count drops to zero. Pure state;
// not thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/string_map.h"

namespace fleet::broker {

// A read-only view of a shared text; "" when default-constructed. Cheap to
// copy. It stays valid while its owner keeps the text: a NameTable until the
// last Release, or the std::string it was made from (which must not move).
class Name {
 public:
  Name() = default;
  // Refers to `text`, which must outlive the Name and never move (a key of a
  // node-based map, a member of an element of a std::deque).
  explicit Name(const std::string& text) : text_(&text) {}

  std::string_view view() const { return text_ == nullptr ? std::string_view() : *text_; }
  operator std::string_view() const { return view(); }  // NOLINT: reads as a string
  bool empty() const { return view().empty(); }

  friend bool operator==(const Name& a, const Name& b) { return a.view() == b.view(); }
  friend bool operator==(const Name& a, std::string_view b) { return a.view() == b; }

 private:
  friend class NameTable;
  const std::string* text_ = nullptr;
};

class NameTable {
 public:
  NameTable() = default;
  NameTable(const NameTable&) = delete;  // its Names point into it
  NameTable& operator=(const NameTable&) = delete;

  // A Name for `text`, counted until Release. Requires nothing; "" is a text
  // like any other (it gets an entry and a count). The text acquired last
  // is taken again without a lookup (a SUBMIT's batches share a producer,
  // a DISPATCH's a worker).
  Name Acquire(std::string_view text);
  // Gives back a Name from this table's Acquire (a Name from anywhere else
  // is a bug); a default Name is ignored. Counts down without a lookup; only
  // the last release of a text looks it up, to forget it. The Name, and
  // every copy of it, may dangle once its text's count reaches zero.
  void Release(const Name& name);
  // Names handed out for `text` and not yet released; 0 if none.
  std::size_t Count(std::string_view text) const;
  // Distinct texts held.
  std::size_t size() const { return refs_.size(); }

 private:
  // Node-based: an entry never moves, so a Name may point at its key, and
  // the entry is found again from that pointer (the key is its first
  // member).
  using Entry = StringMap<std::size_t>::value_type;
  static Entry* EntryOf(const Name& name);

  StringMap<std::size_t> refs_;
  Entry* last_ = nullptr;  // the entry Acquire returned last, while it lives
};

}  // namespace fleet::broker

#include "broker/name_table.h"

#include <type_traits>

namespace fleet::broker {

// A Name points at the key of an unordered_map node, which stays put through
// rehashes; the key is the first member of the node's pair, so the table
// gets from a Name back to its count without hashing the text. Rejected: a
// vector of texts with Names as indexes, which would need the table to read
// a Name back, and a free list to reuse slots; a count pointer in each Name,
// which would add 8 bytes to each of a batch's names.
NameTable::Entry* NameTable::EntryOf(const Name& name) {
  static_assert(std::is_standard_layout_v<Entry>,
                "a Name's text must be pointer-interconvertible with its entry");
  return reinterpret_cast<Entry*>(const_cast<std::string*>(name.text_));
}

Name NameTable::Acquire(std::string_view text) {
  if (last_ == nullptr || last_->first != text) {
    auto it = refs_.find(text);
    if (it == refs_.end()) it = refs_.emplace(std::string(text), 0).first;
    last_ = &*it;
  }
  ++last_->second;
  return Name(last_->first);
}

void NameTable::Release(const Name& name) {
  if (name.text_ == nullptr) return;
  Entry* entry = EntryOf(name);
  if (--entry->second != 0) return;
  if (last_ == entry) last_ = nullptr;
  refs_.erase(refs_.find(entry->first));  // by iterator: the key dies with it
}

std::size_t NameTable::Count(std::string_view text) const {
  auto it = refs_.find(text);
  return it == refs_.end() ? 0 : it->second;
}

}  // namespace fleet::broker

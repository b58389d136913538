#include "broker/name_table.h"

namespace fleet::broker {

// A Name points at the key of an unordered_map node, which stays put through
// rehashes. Rejected: a vector of texts with Names as indexes, which would
// need the table to read a Name back, and a free list to reuse slots.

Name NameTable::Acquire(std::string_view text) {
  auto it = refs_.find(text);
  if (it == refs_.end()) it = refs_.emplace(std::string(text), 0).first;
  ++it->second;
  return Name(it->first);
}

void NameTable::Release(const Name& name) {
  if (name.text_ == nullptr) return;
  auto it = refs_.find(name.view());
  if (it == refs_.end()) return;  // not one of ours: nothing to count down
  if (--it->second == 0) refs_.erase(it);
}

std::size_t NameTable::Count(std::string_view text) const {
  auto it = refs_.find(text);
  return it == refs_.end() ? 0 : it->second;
}

}  // namespace fleet::broker

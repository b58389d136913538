// Appending MessagePack to a std::string: the sink msgpack::packer writes
// into, and str/bin with their lengths (the wire codec and the handler
// frames both build their messages this way).
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace fleet::mp {

struct StringSink {
  std::string* out;
  void write(const char* data, std::size_t size) { out->append(data, size); }
};
using Packer = msgpack::packer<StringSink>;

inline void PackStr(Packer& p, std::string_view s) {
  p.pack_str(static_cast<std::uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

inline void PackBin(Packer& p, std::string_view s) {
  p.pack_bin(static_cast<std::uint32_t>(s.size()));
  p.pack_bin_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

}  // namespace fleet::mp

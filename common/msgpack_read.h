// Reading MessagePack straight from a frame, without building objects: one
// validating walk over the headers (Validate), then a cursor that hands out
// one item at a time (Cursor), strings and bins pointing into the frame.
//
// Validate accepts and refuses exactly what msgpack-c's unpack does under
// the same limits (tests/common/msgpack_read_test.cc checks that against
// msgpack-c, and so does fuzz_protocol), and before that refuses what
// msgpack-c would have reserved memory for without the bytes to back it.
// The wire codec (codec.cc) uses it on every message; decoding through
// msgpack-c's unpack took 13-26% of the broker's instructions (callgrind;
// the more batches a message carried, the larger the share).
//
// Thread-safe: no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/protocol.h"

namespace fleet::mp {

enum class Kind : std::uint8_t {
  kPositive,  // an integer >= 0 in any format, signed ones included
  kNegative,
  kFloat32,
  kFloat64,
  kNil,
  kBool,
  kStr,
  kBin,
  kExt,
  kArray,
  kMap,
};

struct Item {
  Kind kind = Kind::kNil;
  std::uint32_t size = 0;  // str/bin bytes, array elements, map pairs
  union {
    std::uint64_t u = 0;  // kPositive, kBool (0 or 1)
    std::int64_t i;       // kNegative
    double f;             // kFloat32 (widened), kFloat64
    const char* ptr;      // kStr, kBin: `size` bytes in the frame; kExt: its type byte
  };

  bool container() const { return kind == Kind::kArray || kind == Kind::kMap; }
};

// msgpack-c's unpack_limit, plus the bound on announced elements that is
// checked before anything else.
struct ReadLimits {
  static constexpr std::uint32_t kMaxDepth = 16;
  std::uint64_t max_array = 0xffffffffu;  // elements of one array
  std::uint64_t max_map = 0xffffffffu;    // pairs of one map
  std::uint64_t max_str = 0xffffffffu;
  std::uint64_t max_bin = 0xffffffffu;
  std::uint64_t max_ext = 0xffffffffu;    // ext data plus its type byte
  std::uint32_t max_depth = 8;            // nested arrays/maps, the outermost counted; <= kMaxDepth
  std::uint64_t max_children = 0xffffffffu;  // a container's elements (2 per map pair)
};

// Checks that `data` starts with one complete msgpack object within the
// limits; *end gets the offset just past it. On failure *code and *why say
// why, in this order of precedence, as the codec always reported it:
//   - the first structural fault anywhere in the object: truncated, the
//     reserved byte 0xc1, a container announcing more elements than bytes
//     remain (kMalformed) or more than max_children (kTooLarge);
//   - else the first limit msgpack-c would throw on, in stream order:
//     "msgpack limit exceeded: array|map|str|bin|ext|depth size overflow"
//     (kTooLarge).
// Bytes after the object are not looked at.
bool Validate(const void* data, std::size_t size, const ReadLimits& limits, std::size_t* end,
              proto::ErrorCode* code, std::string* why);

// Walks an object Validate accepted, item by item in stream order: a
// container's elements (a map's as key, value, key, ...) come after it.
// Nothing is checked: use it only on validated bytes.
class Cursor {
 public:
  explicit Cursor(const void* data) : p_(static_cast<const unsigned char*>(data)) {}

  Item Next();

  // The next item, without moving past it.
  Item Peek() const { return Cursor(*this).Next(); }

  // Moves past the elements of `container`, just read by Next().
  void SkipElements(const Item& container);

  // Where the next item starts.
  const void* position() const { return p_; }

 private:
  static std::uint64_t Be(const unsigned char* p, int width) {
    std::uint64_t v = 0;
    for (int k = 0; k < width; ++k) v = (v << 8) | p[k];
    return v;
  }

  Item Bytes(Kind kind, int width) {
    Item it;
    it.kind = kind;
    it.size = static_cast<std::uint32_t>(Be(p_, width));
    it.ptr = reinterpret_cast<const char*>(p_ + width);
    p_ += width + it.size;
    return it;
  }

  Item Count(Kind kind, int width) {
    Item it;
    it.kind = kind;
    it.size = static_cast<std::uint32_t>(Be(p_, width));
    p_ += width;
    return it;
  }

  Item Unsigned(int width) {
    Item it;
    it.kind = Kind::kPositive;
    it.u = Be(p_, width);
    p_ += width;
    return it;
  }

  // int8..int64: msgpack-c gives a value >= 0 as a positive integer.
  Item Signed(int width) {
    const std::uint64_t raw = Be(p_, width);
    p_ += width;
    const int shift = 64 - 8 * width;
    const auto v = static_cast<std::int64_t>(raw << shift) >> shift;
    Item it;
    if (v >= 0) {
      it.kind = Kind::kPositive;
      it.u = static_cast<std::uint64_t>(v);
    } else {
      it.kind = Kind::kNegative;
      it.i = v;
    }
    return it;
  }

  Item Ext(std::uint32_t data_bytes, int width) {
    Item it;
    it.kind = Kind::kExt;
    it.size = width == 0 ? data_bytes : static_cast<std::uint32_t>(Be(p_, width));
    it.ptr = reinterpret_cast<const char*>(p_ + width);  // the type byte, then the data
    p_ += width + 1 + it.size;
    return it;
  }

  const unsigned char* p_;
};

inline Item Cursor::Next() {
  const unsigned char t = *p_++;
  Item it;
  if (t <= 0x7f) {
    it.kind = Kind::kPositive;
    it.u = t;
    return it;
  }
  if (t >= 0xe0) {
    it.kind = Kind::kNegative;
    it.i = static_cast<std::int8_t>(t);
    return it;
  }
  if (t >= 0xa0 && t <= 0xbf) {
    it.kind = Kind::kStr;
    it.size = t & 0x1fu;
    it.ptr = reinterpret_cast<const char*>(p_);
    p_ += it.size;
    return it;
  }
  if (t >= 0x90 && t <= 0x9f) {
    it.kind = Kind::kArray;
    it.size = t & 0x0fu;
    return it;
  }
  if (t <= 0x8f) {
    it.kind = Kind::kMap;
    it.size = t & 0x0fu;
    return it;
  }
  switch (t) {
    case 0xc2:
    case 0xc3:
      it.kind = Kind::kBool;
      it.u = t & 1u;
      return it;
    case 0xc4: return Bytes(Kind::kBin, 1);
    case 0xc5: return Bytes(Kind::kBin, 2);
    case 0xc6: return Bytes(Kind::kBin, 4);
    case 0xc7: return Ext(0, 1);
    case 0xc8: return Ext(0, 2);
    case 0xc9: return Ext(0, 4);
    case 0xca: {
      const auto bits = static_cast<std::uint32_t>(Be(p_, 4));
      p_ += 4;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      it.kind = Kind::kFloat32;
      it.f = f;
      return it;
    }
    case 0xcb: {
      const std::uint64_t bits = Be(p_, 8);
      p_ += 8;
      it.kind = Kind::kFloat64;
      std::memcpy(&it.f, &bits, sizeof it.f);
      return it;
    }
    case 0xcc: return Unsigned(1);
    case 0xcd: return Unsigned(2);
    case 0xce: return Unsigned(4);
    case 0xcf: return Unsigned(8);
    case 0xd0: return Signed(1);
    case 0xd1: return Signed(2);
    case 0xd2: return Signed(4);
    case 0xd3: return Signed(8);
    case 0xd4: return Ext(1, 0);
    case 0xd5: return Ext(2, 0);
    case 0xd6: return Ext(4, 0);
    case 0xd7: return Ext(8, 0);
    case 0xd8: return Ext(16, 0);
    case 0xd9: return Bytes(Kind::kStr, 1);
    case 0xda: return Bytes(Kind::kStr, 2);
    case 0xdb: return Bytes(Kind::kStr, 4);
    case 0xdc: return Count(Kind::kArray, 2);
    case 0xdd: return Count(Kind::kArray, 4);
    case 0xde: return Count(Kind::kMap, 2);
    case 0xdf: return Count(Kind::kMap, 4);
    default: return it;  // 0xc0 nil (0xc1 never passes Validate)
  }
}

inline void Cursor::SkipElements(const Item& container) {
  std::uint64_t pending = container.kind == Kind::kMap ? 2ull * container.size : container.size;
  while (pending > 0) {
    const Item it = Next();
    --pending;
    if (it.kind == Kind::kArray) pending += it.size;
    if (it.kind == Kind::kMap) pending += 2ull * it.size;
  }
}

}  // namespace fleet::mp

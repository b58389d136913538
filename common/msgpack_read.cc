#include "common/msgpack_read.h"

#include <algorithm>

namespace fleet::mp {

namespace {

// What a type byte announces: its class, the width of the length that
// follows it (0: none), and a count carried by the byte itself or fixed by
// the type (a fixstr's length, a fixarray's elements, a float64's 8 bytes,
// an ext's type byte).
enum Class : std::uint8_t { kScalar, kStr, kBin, kExt, kArray, kMap, kReserved };

struct TypeInfo {
  Class what = kScalar;
  std::uint8_t width = 0;
  std::uint8_t fixed = 0;  // scalars, ext: bytes after the header; fix*: the count
};

constexpr TypeInfo Info(unsigned t) {
  if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return {};
  if (t <= 0x8f) return {kMap, 0, static_cast<std::uint8_t>(t & 0x0f)};
  if (t <= 0x9f) return {kArray, 0, static_cast<std::uint8_t>(t & 0x0f)};
  if (t <= 0xbf) return {kStr, 0, static_cast<std::uint8_t>(t & 0x1f)};
  switch (t) {
    case 0xc4: return {kBin, 1, 0};
    case 0xc5: return {kBin, 2, 0};
    case 0xc6: return {kBin, 4, 0};
    case 0xc7: return {kExt, 1, 1};
    case 0xc8: return {kExt, 2, 1};
    case 0xc9: return {kExt, 4, 1};
    case 0xca: case 0xce: case 0xd2: return {kScalar, 0, 4};
    case 0xcb: case 0xcf: case 0xd3: return {kScalar, 0, 8};
    case 0xcc: case 0xd0: return {kScalar, 0, 1};
    case 0xcd: case 0xd1: return {kScalar, 0, 2};
    case 0xd4: return {kExt, 0, 2};
    case 0xd5: return {kExt, 0, 3};
    case 0xd6: return {kExt, 0, 5};
    case 0xd7: return {kExt, 0, 9};
    case 0xd8: return {kExt, 0, 17};
    case 0xd9: return {kStr, 1, 0};
    case 0xda: return {kStr, 2, 0};
    case 0xdb: return {kStr, 4, 0};
    case 0xdc: return {kArray, 2, 0};
    case 0xdd: return {kArray, 4, 0};
    case 0xde: return {kMap, 2, 0};
    case 0xdf: return {kMap, 4, 0};
    default: return {kReserved, 0, 0};  // 0xc1
  }
}

struct TypeTable {
  TypeInfo info[256];
  constexpr TypeTable() : info() {
    for (unsigned t = 0; t < 256; ++t) info[t] = Info(t);
  }
};

constexpr TypeTable kTypes;

}  // namespace

// One pass over the headers; payload bytes are skipped by their length.
// Structural faults end the walk at once. A broken limit is remembered and
// the walk goes on, since a structural fault further on takes precedence
// (msgpack-c never saw a frame that failed the structural check). Depth is
// tracked, with each open container's elements still to come, only until
// the first broken limit: after that no other limit can be reported.
bool Validate(const void* data, std::size_t n, const ReadLimits& limits, std::size_t* end,
              proto::ErrorCode* code, std::string* why) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::size_t pos = 0;
  std::uint64_t pending = 1;  // objects still to read
  const char* overflow = nullptr;
  std::uint64_t open_left[ReadLimits::kMaxDepth];
  std::uint32_t open = 0;
  const std::uint32_t max_depth = std::min(limits.max_depth, ReadLimits::kMaxDepth);
  // By class: the most bytes a str, bin or ext may hold, and what
  // msgpack-c says when one holds more.
  const std::uint64_t max_bytes[] = {0, limits.max_str, limits.max_bin, limits.max_ext};
  static constexpr const char* kBytesOverflow[] = {nullptr, "str size overflow",
                                                   "bin size overflow", "ext size overflow"};
  auto fail = [&](proto::ErrorCode c, std::string text) {
    *code = c;
    *why = std::move(text);
    return false;
  };
  while (pending > 0) {
    if (pos >= n) return fail(proto::ErrorCode::kMalformed, "truncated msgpack");
    const TypeInfo info = kTypes.info[p[pos++]];
    --pending;
    std::uint64_t length = info.fixed;  // a fix type's count, or a scalar's bytes
    if (info.width != 0) {
      if (info.width > n - pos) return fail(proto::ErrorCode::kMalformed, "truncated msgpack");
      switch (info.width) {
        case 1: length = p[pos]; break;
        case 2: length = (std::uint64_t{p[pos]} << 8) | p[pos + 1]; break;
        default:
          length = (std::uint64_t{p[pos]} << 24) | (std::uint64_t{p[pos + 1]} << 16) |
                   (std::uint64_t{p[pos + 2]} << 8) | p[pos + 3];
          break;
      }
      pos += info.width;
    }
    if (info.what < kArray) {  // scalar, str, bin, ext: bytes to skip
      // An ext's size, for its limit, counts its type byte: fixext's
      // `fixed` holds it with the data, ext8/16/32 add it to their length.
      const std::uint64_t skip = info.what == kExt && info.width != 0 ? length + 1 : length;
      if (skip > n - pos) return fail(proto::ErrorCode::kMalformed, "truncated msgpack");
      pos += skip;
      if (overflow != nullptr) continue;
      if (info.what != kScalar && skip > max_bytes[info.what]) {
        overflow = kBytesOverflow[info.what];
        continue;
      }
    } else if (info.what != kReserved) {  // array, map: elements to read
      const std::uint64_t children = info.what == kMap ? 2 * length : length;
      if (children > limits.max_children) {
        return fail(proto::ErrorCode::kTooLarge, "msgpack container of " +
                                                     std::to_string(children) +
                                                     " elements over the limit");
      }
      if (children > n - pos) {
        return fail(proto::ErrorCode::kMalformed,
                    "msgpack container announces " + std::to_string(children) +
                        " elements with " + std::to_string(n - pos) + " bytes left");
      }
      pending += children;
      if (overflow != nullptr) continue;
      if (length > (info.what == kMap ? limits.max_map : limits.max_array)) {
        overflow = info.what == kMap ? "map size overflow" : "array size overflow";
        continue;
      }
      if (open >= max_depth) {
        overflow = "depth size overflow";
        continue;
      }
      if (children != 0) {
        open_left[open++] = children;
        continue;
      }
    } else {
      return fail(proto::ErrorCode::kMalformed, "invalid msgpack: reserved type byte 0xc1");
    }
    // An item complete: so is every container it was the last element of.
    while (open > 0 && --open_left[open - 1] == 0) --open;
  }
  if (overflow != nullptr) {
    return fail(proto::ErrorCode::kTooLarge, std::string("msgpack limit exceeded: ") + overflow);
  }
  *end = pos;
  return true;
}

}  // namespace fleet::mp

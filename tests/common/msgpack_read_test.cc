// common/msgpack_read.h: the cursor's reading of each encoding, the order in
// which Validate reports faults, and random objects (valid, then broken) read
// by it and by msgpack-c's unpack under the same limits
// (fuzz::CheckMsgpackRead, which fuzz_protocol runs too).
#include "common/msgpack_read.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "fuzz/entry_points.h"

namespace fleet::mp {
namespace {

using proto::ErrorCode;

std::string Bytes(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

struct Outcome {
  bool ok;
  std::size_t end = 0;
  ErrorCode code = ErrorCode::kOk;
  std::string why;
};

Outcome Check(const std::string& s, const ReadLimits& limits = ReadLimits()) {
  Outcome o;
  o.ok = Validate(s.data(), s.size(), limits, &o.end, &o.code, &o.why);
  return o;
}

TEST(MsgpackReadTest, CursorReadsEachEncoding) {
  // [int8 5, int16 -2, uint64 2^63, float32 1.5, str8 "ab", bin8 "", nil,
  //  true, {fixstr "k": -1}]
  std::string s = Bytes({0x99, 0xd0, 0x05, 0xd1, 0xff, 0xfe, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0,
                         0xca, 0x3f, 0xc0, 0x00, 0x00, 0xd9, 0x02, 'a', 'b', 0xc4, 0x00, 0xc0,
                         0xc3, 0x81, 0xa1, 'k', 0xff});
  Outcome o = Check(s);
  ASSERT_TRUE(o.ok) << o.why;
  EXPECT_EQ(o.end, s.size());
  Cursor c(s.data());
  Item root = c.Next();
  EXPECT_EQ(root.kind, Kind::kArray);
  EXPECT_EQ(root.size, 9u);
  Item i8 = c.Next();  // a signed format holding a value >= 0 reads as positive
  EXPECT_EQ(i8.kind, Kind::kPositive);
  EXPECT_EQ(i8.u, 5u);
  Item i16 = c.Next();
  EXPECT_EQ(i16.kind, Kind::kNegative);
  EXPECT_EQ(i16.i, -2);
  Item u64 = c.Next();
  EXPECT_EQ(u64.kind, Kind::kPositive);
  EXPECT_EQ(u64.u, 1ull << 63);
  Item f = c.Next();
  EXPECT_EQ(f.kind, Kind::kFloat32);
  EXPECT_EQ(f.f, 1.5);
  Item str = c.Next();
  EXPECT_EQ(str.kind, Kind::kStr);
  EXPECT_EQ(std::string(str.ptr, str.size), "ab");
  EXPECT_EQ(str.ptr, s.data() + 22);  // borrowed from the frame
  Item bin = c.Next();
  EXPECT_EQ(bin.kind, Kind::kBin);
  EXPECT_EQ(bin.size, 0u);
  EXPECT_EQ(c.Next().kind, Kind::kNil);
  Item b = c.Next();
  EXPECT_EQ(b.kind, Kind::kBool);
  EXPECT_EQ(b.u, 1u);
  Item map = c.Next();
  EXPECT_EQ(map.kind, Kind::kMap);
  EXPECT_EQ(map.size, 1u);
  EXPECT_EQ(c.Peek().kind, Kind::kStr);
  EXPECT_EQ(c.Next().kind, Kind::kStr);
  Item neg = c.Next();
  EXPECT_EQ(neg.kind, Kind::kNegative);
  EXPECT_EQ(neg.i, -1);
  EXPECT_EQ(c.position(), s.data() + s.size());

  Cursor skip(s.data());
  skip.SkipElements(skip.Next());
  EXPECT_EQ(skip.position(), s.data() + s.size());
}

TEST(MsgpackReadTest, TrailingBytesAreLeftToTheCaller) {
  std::string s = Bytes({0x91, 0x01, 0x02, 0x03});
  Outcome o = Check(s);
  ASSERT_TRUE(o.ok) << o.why;
  EXPECT_EQ(o.end, 2u);
}

TEST(MsgpackReadTest, AStructuralFaultAnywhereOutranksAnEarlierLimit) {
  ReadLimits limits;
  limits.max_depth = 2;
  limits.max_str = 1;
  // Depth 3 (over the limit), then a str announcing more bytes than follow.
  Outcome o = Check(Bytes({0x92, 0x91, 0x91, 0xc0, 0xa5, 'x'}), limits);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.code, ErrorCode::kMalformed);
  EXPECT_EQ(o.why, "truncated msgpack");
  // The same, complete: the depth is reported.
  o = Check(Bytes({0x92, 0x91, 0x91, 0xc0, 0xa1, 'x'}), limits);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.code, ErrorCode::kTooLarge);
  EXPECT_EQ(o.why, "msgpack limit exceeded: depth size overflow");
  // Of two limits the first in the stream is reported.
  o = Check(Bytes({0x92, 0xa2, 'x', 'y', 0x91, 0x91, 0xc0}), limits);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.why, "msgpack limit exceeded: str size overflow");
  // A container announcing more elements than bytes remain, before a limit.
  o = Check(Bytes({0x92, 0xdc, 0x00, 0x09, 0xa2, 'x', 'y'}), limits);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.code, ErrorCode::kMalformed);
  EXPECT_EQ(o.why, "msgpack container announces 9 elements with 3 bytes left");
}

TEST(MsgpackReadTest, DepthCountsEmptyContainersAndClosesFinishedOnes) {
  ReadLimits limits;
  limits.max_depth = 2;
  // [[], [[]]]: the empty array at depth 3 is over the limit.
  Outcome o = Check(Bytes({0x92, 0x90, 0x91, 0x90}), limits);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.why, "msgpack limit exceeded: depth size overflow");
  // [[1], [2], {3: [4]}]: the array in the map is at depth 3, refused;
  // [[1], [2], {3: 4}]: each sibling closed before the next, depth 2.
  o = Check(Bytes({0x93, 0x91, 0x01, 0x91, 0x02, 0x81, 0x03, 0x91, 0x04}), limits);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.why, "msgpack limit exceeded: depth size overflow");
  o = Check(Bytes({0x93, 0x91, 0x01, 0x91, 0x02, 0x81, 0x03, 0x04}), limits);
  EXPECT_TRUE(o.ok) << o.why;
}

// ---- random objects against msgpack-c ----

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  std::string Object() {
    std::string out;
    Write(0, &out);
    return out;
  }

  // One of: cut short, a byte changed, the reserved byte 0xc1 put in, a
  // huge count written over a byte, bytes added at the end.
  std::string Broken(std::string s) {
    if (s.empty()) return s;
    std::size_t at = Below(s.size());
    switch (Below(5)) {
      case 0: s.resize(at); break;
      case 1: s[at] = static_cast<char>(Below(256)); break;
      case 2: s.insert(at, 1, '\xc1'); break;
      case 3: s.insert(at, Bytes({0xdd, 0x00, static_cast<int>(Below(256)), 0xff, 0xff})); break;
      default: s += Bytes({0x01, 0x02}); break;
    }
    return s;
  }

 private:
  std::size_t Below(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  static void Be(std::uint64_t v, int width, std::string* out) {
    for (int shift = 8 * (width - 1); shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
  }

  // A length in a random one of the formats that can hold it.
  void Header(std::size_t n, int fix_base, std::size_t fix_max, const int (&wide)[3],
              std::string* out) {
    const int widths[3] = {1, 2, 4};
    std::size_t first = 0;
    if (fix_base >= 0 && n <= fix_max && Below(2) == 0) {
      out->push_back(static_cast<char>(fix_base + n));
      return;
    }
    while (first < 3 && (wide[first] < 0 || (widths[first] < 4 && n >> (8 * widths[first]) != 0))) ++first;
    const std::size_t pick = first + Below(3 - first);
    out->push_back(static_cast<char>(wide[pick]));
    Be(n, widths[pick], out);
  }

  void Write(int depth, std::string* out) {
    const std::size_t kinds = depth < 10 ? 12 : 9;
    switch (Below(kinds)) {
      case 0: out->push_back(static_cast<char>(Below(0x80))); break;
      case 1: out->push_back(static_cast<char>(0xe0 + Below(32))); break;
      case 2:    // uint8..uint64, any value
      case 3: {  // int8..int64, either sign
        const std::size_t k = Below(4);
        out->push_back(static_cast<char>((Below(2) ? 0xcc : 0xd0) + k));
        Be(rng_(), 1 << k, out);
        break;
      }
      case 4: {
        const bool f32 = Below(2) == 0;
        out->push_back(f32 ? '\xca' : '\xcb');
        Be(rng_(), f32 ? 4 : 8, out);
        break;
      }
      case 5: out->push_back(static_cast<char>(Bytes({0xc0, 0xc2, 0xc3})[Below(3)])); break;
      case 6: {  // str
        const std::size_t n = Below(12);
        Header(n, 0xa0, 31, {0xd9, 0xda, 0xdb}, out);
        out->append(n, 'x');
        break;
      }
      case 7: {  // bin
        const std::size_t n = Below(12);
        Header(n, -1, 0, {0xc4, 0xc5, 0xc6}, out);
        out->append(n, 'b');
        break;
      }
      case 8: {  // ext: fixext or ext8/16/32, then the type byte and data
        static const std::size_t kFixed[] = {1, 2, 4, 8, 16};
        std::size_t n;
        if (Below(2) == 0) {
          const std::size_t k = Below(5);
          n = kFixed[k];
          out->push_back(static_cast<char>(0xd4 + k));
        } else {
          n = Below(12);
          Header(n, -1, 0, {0xc7, 0xc8, 0xc9}, out);
        }
        out->push_back('\x01');
        out->append(n, 'e');
        break;
      }
      case 9:
      case 10: {  // array
        const std::size_t n = Below(6);
        Header(n, 0x90, 15, {-1, 0xdc, 0xdd}, out);
        for (std::size_t i = 0; i < n; ++i) Write(depth + 1, out);
        break;
      }
      default: {  // map
        const std::size_t n = Below(4);
        Header(n, 0x80, 15, {-1, 0xde, 0xdf}, out);
        for (std::size_t i = 0; i < 2 * n; ++i) Write(depth + 1, out);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

TEST(MsgpackReadTest, AgreesWithMsgpackCOnRandomObjects) {
  const ReadLimits tight = fuzz::TightReadLimits();
  // Containers bounded as the codec's are: msgpack-c reserves a container's
  // elements as soon as it reads the header, bytes or not.
  ReadLimits no_ext;
  no_ext.max_array = no_ext.max_map = 1u << 16;
  no_ext.max_children = 1u << 17;
  no_ext.max_ext = 0;
  no_ext.max_depth = 6;
  ReadLimits loose = no_ext;
  loose.max_ext = ReadLimits().max_ext;
  loose.max_depth = ReadLimits::kMaxDepth;
  const ReadLimits sets[] = {tight, no_ext, loose};

  // How often each outcome came up, so that the test shows it reached them.
  static const char* const kOutcomes[] = {
      "ok", "truncated msgpack", "invalid msgpack: reserved", "msgpack container announces",
      "msgpack container of", "msgpack limit exceeded: array", "msgpack limit exceeded: map",
      "msgpack limit exceeded: str", "msgpack limit exceeded: bin",
      "msgpack limit exceeded: ext", "msgpack limit exceeded: depth"};
  std::map<std::string, int> seen;
  Generator gen(20261207);
  for (int i = 0; i < 4000; ++i) {
    const std::string valid = gen.Object();
    for (const std::string& s : {valid, gen.Broken(valid), gen.Broken(gen.Broken(valid))}) {
      for (const ReadLimits& limits : sets) {
        const auto* data = reinterpret_cast<const std::uint8_t*>(s.data());
        const std::string err = fuzz::CheckMsgpackRead(data, s.size(), limits);
        ASSERT_TRUE(err.empty()) << err << " (case " << i << ")";
        Outcome o = Check(s, limits);
        for (const char* outcome : kOutcomes) {
          if (o.ok ? std::strcmp(outcome, "ok") == 0 : o.why.rfind(outcome, 0) == 0) ++seen[outcome];
        }
      }
    }
  }
  for (const char* outcome : kOutcomes) {
    EXPECT_GT(seen[outcome], 0) << outcome;
  }
}

}  // namespace
}  // namespace fleet::mp

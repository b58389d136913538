// Runs every file of fuzz/corpus/<target>/ through the same entry points and
// invariant checks as the libFuzzer targets (fuzz/entry_points.h), in the
// normal gcc build: a crash input committed to the corpus stays a regression
// test without clang. fuzz/run.sh is what finds new ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/codec.h"
#include "common/prom_api.h"
#include "common/prom_text.h"
#include "fuzz/entry_points.h"

namespace fleet::fuzz {
namespace {

namespace fs = std::filesystem;

struct Seed {
  std::string name;
  std::string data;
};

fs::path CorpusDir(const char* target) {
  return fs::path(FLEET_SOURCE_DIR) / "fuzz" / "corpus" / target;
}

std::vector<Seed> ReadCorpus(const char* target) {
  std::vector<Seed> seeds;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(CorpusDir(target), ec)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    seeds.push_back(
        {entry.path().filename().string(), std::string(std::istreambuf_iterator<char>(in), {})});
  }
  std::sort(seeds.begin(), seeds.end(),
            [](const Seed& a, const Seed& b) { return a.name < b.name; });
  return seeds;
}

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

const std::uint8_t* DataOf(const std::string& s) {
  return reinterpret_cast<const std::uint8_t*>(s.data());
}

void RunCorpus(const char* target, std::string (*entry)(const std::uint8_t*, std::size_t)) {
  std::vector<Seed> seeds = ReadCorpus(target);
  // An empty list would pass silently: a moved or misspelled corpus fails.
  ASSERT_GE(seeds.size(), 10u) << "no corpus at " << CorpusDir(target);
  for (const Seed& seed : seeds) {
    std::string broken;
    EXPECT_NO_THROW(broken = entry(DataOf(seed.data), seed.data.size()))
        << target << "/" << seed.name;
    EXPECT_EQ(broken, "") << target << "/" << seed.name;
  }
}

TEST(FuzzCorpusTest, ProtocolCorpusKeepsDecoderInvariants) {
  RunCorpus("fuzz_protocol", FuzzProtocol);
}

TEST(FuzzCorpusTest, PromTextCorpusKeepsParserInvariants) {
  RunCorpus("fuzz_prom_text", FuzzPromText);
}

TEST(FuzzCorpusTest, PromApiCorpusKeepsReaderInvariants) {
  RunCorpus("fuzz_prom_api", FuzzPromApi);
}

// The seeds are what their names say, so the corpus keeps reaching both the
// accepting and the rejecting paths (make_corpus.py names them).
TEST(FuzzCorpusTest, SeedsNamedValidAreAcceptedAndHostileOnesRejected) {
  std::size_t valid = 0, hostile = 0;
  for (const Seed& s : ReadCorpus("fuzz_protocol")) {
    proto::Decoded d = proto::Decode(s.data.data(), s.data.size());
    if (StartsWith(s.name, "valid_")) {
      EXPECT_TRUE(d.ok()) << s.name << ": " << d.detail;
      ++valid;
    } else if (StartsWith(s.name, "hostile_") || StartsWith(s.name, "wrongtype_") ||
               StartsWith(s.name, "truncated_")) {
      EXPECT_FALSE(d.ok()) << s.name;
      ++hostile;
    }
  }
  EXPECT_GE(valid, 18u);  // every command
  EXPECT_GE(hostile, 30u);
  for (const Seed& s : ReadCorpus("fuzz_prom_text")) {
    if (!StartsWith(s.name, "valid_")) continue;
    prom::ParseResult r = prom::ParsePromText(s.data);
    EXPECT_TRUE(r.ok()) << s.name << ": " << (r.first_error ? r.first_error->reason : "");
    EXPECT_FALSE(r.samples.empty()) << s.name;
  }
  for (const Seed& s : ReadCorpus("fuzz_prom_api")) {
    prom::QueryResult r = prom::ParseQueryResponse(s.data);
    if (StartsWith(s.name, "valid_")) {
      EXPECT_TRUE(r.ok() || r.error_type == "bad_data" || s.name == "valid_error_no_message")
          << s.name << ": " << r.error;
    } else if (StartsWith(s.name, "deep_array_") || StartsWith(s.name, "truncated_") ||
               StartsWith(s.name, "wrong_")) {
      EXPECT_FALSE(r.ok()) << s.name;
    }
  }
}

// msgpack-c's pack_double casts to uint64_t to test for an integral value,
// which is undefined for exactly 2^64; UBSan flagged it on fuzz_protocol's
// first corpus run. The codec now writes that value as a float64 itself.
TEST(FuzzCorpusTest, EncodesIdleSecondsOfTwoToThe64AsFloat64) {
  const double two_to_64 = 18446744073709551616.0;
  proto::WorkersReply in;
  in.workers.push_back({"w", "idle", 1, 0, two_to_64, 0, 0});
  in.workers.push_back({"v", "idle", 1, 0, 12.5, 0, 0});
  std::string bytes = proto::Encode(in);
  EXPECT_NE(bytes.find(std::string("\xcb\x43\xf0\x00\x00\x00\x00\x00\x00", 9)), std::string::npos);
  proto::Decoded d = proto::Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.detail;
  const auto& out = std::get<proto::WorkersReply>(*d.message);
  ASSERT_EQ(out.workers.size(), 2u);
  EXPECT_EQ(out.workers[0].idle_seconds, two_to_64);
  EXPECT_EQ(out.workers[1].idle_seconds, 12.5);

  proto::StatsReply stats;
  stats.values.emplace_back("big", two_to_64);
  std::string stats_bytes = proto::Encode(stats);
  proto::Decoded ds = proto::Decode(stats_bytes.data(), stats_bytes.size());
  ASSERT_TRUE(ds.ok()) << ds.detail;
  EXPECT_EQ(std::get<proto::StatsReply>(*ds.message).values.at(0).second, two_to_64);
}

}  // namespace
}  // namespace fleet::fuzz

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "broker/blacklist.h"
#include "broker/result_store.h"
#include "common/clock.h"

namespace fleet::broker {
namespace {

TEST(BlacklistTest, ListsIdUntilTtlExpiresOnFakeClock) {
  FakeClock clock;
  Blacklist bl(std::chrono::seconds(120));
  bl.Add("w1", clock.Now());
  clock.Advance(std::chrono::seconds(119));
  EXPECT_TRUE(bl.Contains("w1", clock.Now()));
  EXPECT_FALSE(bl.Contains("w2", clock.Now()));
  EXPECT_EQ(bl.Purge(clock.Now()), 0u);
  clock.Advance(std::chrono::seconds(1));
  EXPECT_FALSE(bl.Contains("w1", clock.Now()));
  EXPECT_EQ(bl.Purge(clock.Now()), 1u);
  EXPECT_EQ(bl.size(), 0u);
}

TEST(BlacklistTest, AddAgainExtendsAndRemoveLifts) {
  FakeClock clock;
  Blacklist bl(std::chrono::seconds(10));
  bl.Add("w1", clock.Now());
  clock.Advance(std::chrono::seconds(8));
  bl.Add("w1", clock.Now());
  clock.Advance(std::chrono::seconds(8));
  EXPECT_TRUE(bl.Contains("w1", clock.Now()));
  bl.Remove("w1");
  EXPECT_FALSE(bl.Contains("w1", clock.Now()));
}

TEST(ResultStoreTest, FirstResultWinsAndExpiresAfterRetention) {
  FakeClock clock;
  ResultStore rs(std::chrono::seconds(60), 100);
  EXPECT_TRUE(rs.Put("b1", {proto::Outcome::kOk, 1, "first", "", clock.Now()}));
  EXPECT_FALSE(rs.Put("b1", {proto::Outcome::kOk, 2, "second", "", clock.Now()}));
  EXPECT_EQ(rs.Find("b1")->result, "first");
  clock.Advance(std::chrono::seconds(59));
  EXPECT_EQ(rs.Trim(clock.Now()), 0u);
  clock.Advance(std::chrono::seconds(1));
  EXPECT_EQ(rs.Trim(clock.Now()), 1u);
  EXPECT_EQ(rs.Find("b1"), nullptr);
}

TEST(ResultStoreTest, EvictsOldestPastMaxEntriesAtTheTrim) {
  FakeClock clock;
  ResultStore rs(std::chrono::seconds(60), 2);
  const StoredResult* a = rs.Put("a", {proto::Outcome::kOk, 1, "ra", "", clock.Now()});
  rs.Put("b", {proto::Outcome::kOk, 1, "", "", clock.Now()});
  rs.Put("c", {proto::Outcome::kOk, 1, "", "", clock.Now()});
  // Until the trim, every result handed out stays where it is.
  EXPECT_EQ(rs.Find("a"), a);
  EXPECT_EQ(a->result, "ra");
  EXPECT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs.Trim(clock.Now()), 1u);
  EXPECT_EQ(rs.Find("a"), nullptr);
  EXPECT_NE(rs.Find("c"), nullptr);
  EXPECT_EQ(rs.evicted_early(), 1u);
}

// The store against a plain model (a FIFO of ids and a map) through many
// thousands of puts, duplicate puts, finds, evictions and expiries, so the
// index's positions stay right as the FIFO's front moves and its table grows
// and shifts entries back on erase.
TEST(ResultStoreTest, MatchesAPlainModelThroughChurn) {
  FakeClock clock;
  const std::size_t cap = 500;
  ResultStore rs(std::chrono::seconds(10), cap);
  std::deque<std::pair<std::string, TimePoint>> order;  // the model
  std::map<std::string, std::string> values;
  std::mt19937 rng(7);
  std::uint64_t evicted = 0;
  for (int step = 0; step < 40000; ++step) {
    const std::string id = "b" + std::to_string(rng() % 3000);
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      const std::string value = "v" + std::to_string(step);
      const bool stored = rs.Put(id, {proto::Outcome::kOk, 1, value, "", clock.Now()}) != nullptr;
      ASSERT_EQ(stored, values.count(id) == 0) << "step " << step << " id " << id;
      if (stored) {
        order.emplace_back(id, clock.Now());
        values[id] = value;
      }
    } else if (op < 9) {
      auto found = rs.Find(id);
      auto it = values.find(id);
      ASSERT_EQ(found != nullptr, it != values.end()) << "step " << step << " id " << id;
      if (found) {
        ASSERT_EQ(found->result, it->second);
      }
    } else {
      clock.Advance(std::chrono::milliseconds(rng() % 200));
      std::size_t dropped = 0;
      while (!order.empty() && clock.Now() - order.front().second >= std::chrono::seconds(10)) {
        values.erase(order.front().first);
        order.pop_front();
        ++dropped;
      }
      while (order.size() > cap) {
        values.erase(order.front().first);
        order.pop_front();
        ++dropped;
        ++evicted;
      }
      ASSERT_EQ(rs.Trim(clock.Now()), dropped) << "step " << step;
    }
    ASSERT_EQ(rs.size(), order.size());
  }
  EXPECT_EQ(rs.evicted_early(), evicted);
  EXPECT_GT(evicted, 0u);  // the run reached the count bound
}


// Results are copied into the store's byte ring: the caller's buffers may
// go at once, results of every size (across chunk ends, larger than a
// chunk) read back intact until trimmed, and the ring's memory goes back
// to about one chunk and the spare once the store drains.
TEST(ResultStoreTest, KeepsCopiesAcrossChunksAndGivesTheMemoryBack) {
  FakeClock clock;
  ResultStore rs(std::chrono::seconds(10), 1000000);
  const std::size_t chunk = ResultStore::kChunkBytes;
  const std::vector<std::size_t> sizes = {0, 1, 100, chunk / 3, chunk - 5, chunk, chunk + 7,
                                          3 * chunk, 10 * 1024};
  std::map<std::string, std::string> want;
  for (int round = 0; round < 20; ++round) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::string id = "r" + std::to_string(round) + "-" + std::to_string(i);
      std::string value(sizes[i], static_cast<char>('a' + (round + i) % 26));
      std::string error = i % 2 ? "" : "e-" + id;
      ASSERT_NE(rs.Put(id, {proto::Outcome::kOk, 1, value, error, clock.Now()}), nullptr);
      want[id] = value + "|" + error;
      value.assign(value.size(), '#');  // the store must not share the caller's bytes
      error.assign(error.size(), '#');
    }
    clock.Advance(std::chrono::seconds(1));
  }
  for (const auto& [id, v] : want) {
    const StoredResult* r = rs.Find(id);
    ASSERT_NE(r, nullptr) << id;
    EXPECT_EQ(std::string(r->result) + "|" + std::string(r->error), v) << id;
  }
  const std::size_t full = rs.ring_bytes();
  EXPECT_GT(full, 20 * (5 * chunk));  // every round's bytes are held
  // Expire rounds 0-9 (put at 0-9 s; it is 20 s now, retention 10 s):
  // their chunks go, rounds 10-19 still read back.
  EXPECT_EQ(rs.Trim(clock.Now() - std::chrono::seconds(1)), 10 * sizes.size());
  EXPECT_LT(rs.ring_bytes(), full);
  for (const auto& [id, v] : want) {
    const int round = std::stoi(id.substr(1));
    const StoredResult* r = rs.Find(id);
    if (round < 10) {
      EXPECT_EQ(r, nullptr) << id;
    } else {
      ASSERT_NE(r, nullptr) << id;
      EXPECT_EQ(std::string(r->result) + "|" + std::string(r->error), v) << id;
    }
  }
  clock.Advance(std::chrono::seconds(60));
  EXPECT_EQ(rs.Trim(clock.Now()), 10 * sizes.size());
  EXPECT_EQ(rs.size(), 0u);
  EXPECT_LE(rs.ring_bytes(), 2 * chunk);  // the last chunk, kept, and the spare
  // An emptied store takes new results as before, and gives back the
  // memory of a result too large for its chunk once that result expires.
  ASSERT_NE(rs.Put("again", {proto::Outcome::kFailed, 2, "x", "why", clock.Now()}), nullptr);
  EXPECT_EQ(rs.Find("again")->error, "why");
  EXPECT_LE(rs.ring_bytes(), 2 * chunk);
  for (int i = 0; i < 5; ++i) {
    clock.Advance(std::chrono::seconds(60));
    EXPECT_EQ(rs.Trim(clock.Now()), 1u);
    EXPECT_EQ(rs.size(), 0u);
    EXPECT_LE(rs.ring_bytes(), chunk) << "round " << i;  // the spare only
    const std::string big(3 * chunk, 'b');
    ASSERT_NE(rs.Put("big" + std::to_string(i), {proto::Outcome::kOk, 1, big, "", clock.Now()}),
              nullptr);
    EXPECT_EQ(rs.Find("big" + std::to_string(i))->result, big);
  }
}

}  // namespace
}  // namespace fleet::broker

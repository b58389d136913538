#include "common/id_index.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace fleet::broker {
namespace {

// Keys live outside the index, as batch ids live in their slots.
struct Keys {
  std::vector<std::string> by_value;
  std::string_view operator()(std::uint32_t v) const { return by_value[v]; }
};

TEST(IdIndexTest, FindsWhatWasInsertedAndNothingElse) {
  Keys keys{{"a", "b", "c"}};
  IdIndex index;
  EXPECT_EQ(index.Find("a", keys), IdIndex::kNone);  // empty, no table yet
  for (std::uint32_t v = 0; v < 3; ++v) index.Insert(keys.by_value[v], v);
  EXPECT_EQ(index.Find("a", keys), 0u);
  EXPECT_EQ(index.Find("c", keys), 2u);
  EXPECT_EQ(index.Find("d", keys), IdIndex::kNone);
  EXPECT_EQ(index.size(), 3u);
}

TEST(IdIndexTest, EraseKeepsTheRestReachable) {
  Keys keys;
  IdIndex index;
  for (std::uint32_t v = 0; v < 1000; ++v) {
    keys.by_value.push_back("id-" + std::to_string(v));
    index.Insert(keys.by_value[v], v);
  }
  for (std::uint32_t v = 0; v < 1000; v += 3) EXPECT_TRUE(index.Erase(keys.by_value[v], keys));
  EXPECT_FALSE(index.Erase("id-0", keys));
  for (std::uint32_t v = 0; v < 1000; ++v) {
    EXPECT_EQ(index.Find(keys.by_value[v], keys), v % 3 == 0 ? IdIndex::kNone : v) << v;
  }
  EXPECT_EQ(index.size(), 666u);
}

TEST(IdIndexTest, StaysAtMostThirteenSixteenthsFull) {
  Keys keys;
  IdIndex index;
  for (std::uint32_t v = 0; v < 200000; ++v) {
    keys.by_value.push_back(std::to_string(v));
    index.Insert(keys.by_value[v], v);
    ASSERT_LE(index.size() * 16, index.capacity() * 13);
  }
  EXPECT_EQ(index.capacity(), 262144u);  // 8 bytes an entry: about 10 bytes a key
  index.Clear();
  EXPECT_EQ(index.capacity(), 0u);
  EXPECT_EQ(index.Find("1", keys), IdIndex::kNone);
}

// 4000 keys "k<n>", some of them repeated (a repeat is found at its first
// value).
Keys RandomKeys(std::mt19937& rng) {
  Keys keys;
  for (int i = 0; i < 4000; ++i) keys.by_value.push_back("k" + std::to_string(rng() % 100000));
  return keys;
}

// The index holds what `model` holds, and nothing else of `keys`.
void ExpectAgrees(const IdIndex& index, const Keys& keys,
                  const std::map<std::string, std::uint32_t>& model) {
  EXPECT_EQ(index.size(), model.size());
  for (const auto& k : keys.by_value) {
    auto it = model.find(k);
    const std::uint32_t want = it == model.end() ? IdIndex::kNone : it->second;
    EXPECT_EQ(index.Find(k, keys), want);
    EXPECT_EQ(index.Find(k, IdIndex::HashOf(k), keys), want);
  }
}

// Random inserts and erases against std::map, so that erasing inside long
// probe runs and across the end of the table (backward shift) is exercised.
TEST(IdIndexTest, AgreesWithAMapUnderRandomChurn) {
  std::mt19937 rng(6);
  Keys keys = RandomKeys(rng);
  IdIndex index;
  std::map<std::string, std::uint32_t> model;
  for (int step = 0; step < 40000; ++step) {
    const auto v = static_cast<std::uint32_t>(rng() % keys.by_value.size());
    const std::string& k = keys.by_value[v];
    auto it = model.find(k);
    if (it == model.end()) {
      index.Insert(k, v);
      model.emplace(k, v);
    } else if (rng() % 2 == 0) {
      ASSERT_TRUE(index.Erase(k, keys));
      model.erase(it);
    }
    if (step % 1000 == 0) {
      for (const auto& [key, value] : model) ASSERT_EQ(index.Find(key, keys), value);
    }
  }
  ExpectAgrees(index, keys, model);
}

}  // namespace
}  // namespace fleet::broker

namespace fleet::broker {
namespace {

// The broker's hot paths hash an id once (HashOf), file a result with
// InsertIfAbsent and take entries out by the hash they kept (EraseValue).
TEST(IdIndexTest, InsertIfAbsentAndEraseValueAgreeWithAMapUnderRandomChurn) {
  std::mt19937 rng(7);
  Keys keys = RandomKeys(rng);
  IdIndex index;
  std::map<std::string, std::uint32_t> model;
  for (int step = 0; step < 40000; ++step) {
    const auto v = static_cast<std::uint32_t>(rng() % keys.by_value.size());
    const std::string& k = keys.by_value[v];
    const std::uint32_t h = IdIndex::HashOf(k);
    auto it = model.find(k);
    if (it == model.end()) {
      ASSERT_EQ(index.InsertIfAbsent(k, h, v, keys), IdIndex::kNone);
      model.emplace(k, v);
    } else if (rng() % 2 == 0) {
      // Present: the stored value comes back and nothing changes.
      const std::size_t size = index.size();
      ASSERT_EQ(index.InsertIfAbsent(k, h, v, keys), it->second);
      ASSERT_EQ(index.size(), size);
    } else {
      ASSERT_TRUE(index.EraseValue(h, it->second));
      ASSERT_FALSE(index.EraseValue(h, it->second));
      model.erase(it);
    }
    if (step % 1000 == 0) {
      for (const auto& [key, value] : model) ASSERT_EQ(index.Find(key, keys), value);
    }
  }
  ExpectAgrees(index, keys, model);
}

// EraseValue takes out the entry of that value only, among entries of the
// same hash, and the others stay reachable.
TEST(IdIndexTest, EraseValueTakesOnlyThatValueAmongEqualHashes) {
  Keys keys{{"x0", "x1", "x2", "x3"}};
  IdIndex index;
  for (std::uint32_t v = 0; v < 4; ++v) index.Insert(/*hash=*/7, v);
  EXPECT_FALSE(index.EraseValue(7, 9));
  EXPECT_FALSE(index.EraseValue(8, 1));
  EXPECT_TRUE(index.EraseValue(7, 1));
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.Find("x0", 7, keys), 0u);
  EXPECT_EQ(index.Find("x1", 7, keys), IdIndex::kNone);
  EXPECT_EQ(index.Find("x2", 7, keys), 2u);
  EXPECT_EQ(index.Find("x3", 7, keys), 3u);
  EXPECT_EQ(index.InsertIfAbsent("x2", 7, 2, keys), 2u);
  EXPECT_EQ(index.InsertIfAbsent("x1", 7, 1, keys), IdIndex::kNone);
  EXPECT_EQ(index.Find("x1", 7, keys), 1u);
}

TEST(IdIndexTest, AMovedFromIndexIsEmptyAndTheMovedToOneFindsEverything) {
  std::vector<std::string> keys = {"a", "b", "c"};
  auto key_of = [&](std::uint32_t v) { return std::string_view(keys[v]); };
  IdIndex from;
  for (std::uint32_t i = 0; i < keys.size(); ++i) from.Insert(keys[i], i);
  IdIndex to(std::move(from));
  EXPECT_EQ(from.size(), 0u);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_EQ(from.Find("a", key_of), IdIndex::kNone);
  from.Insert("a", 0);  // usable again
  EXPECT_EQ(from.Find("a", key_of), 0u);
  EXPECT_EQ(to.size(), 3u);
  EXPECT_EQ(to.Find("c", key_of), 2u);
  IdIndex other;
  other = std::move(to);
  EXPECT_EQ(to.size(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(other.Find("b", key_of), 1u);
}

}  // namespace
}  // namespace fleet::broker

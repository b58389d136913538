#include <gtest/gtest.h>

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
  EXPECT_EQ(rs.Expire(clock.Now()), 0u);
  clock.Advance(std::chrono::seconds(1));
  EXPECT_EQ(rs.Expire(clock.Now()), 1u);
  EXPECT_EQ(rs.Find("b1"), nullptr);
}

TEST(ResultStoreTest, EvictsOldestPastMaxEntries) {
  FakeClock clock;
  ResultStore rs(std::chrono::seconds(60), 2);
  rs.Put("a", {proto::Outcome::kOk, 1, "", "", clock.Now()});
  rs.Put("b", {proto::Outcome::kOk, 1, "", "", clock.Now()});
  rs.Put("c", {proto::Outcome::kOk, 1, "", "", clock.Now()});
  EXPECT_EQ(rs.Find("a"), nullptr);
  EXPECT_NE(rs.Find("c"), nullptr);
  EXPECT_EQ(rs.evicted_early(), 1u);
}

}  // namespace
}  // namespace fleet::broker

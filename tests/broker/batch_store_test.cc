#include "broker/batch_store.h"

#include <gtest/gtest.h>

namespace fleet::broker {
namespace {

const TimePoint kNow = TimePoint() + std::chrono::hours(1);

TEST(BatchStoreTest, PopsFifoWithinAQueue) {
  BatchStore s;
  s.Add("a", "q", "1", "p", kNow);
  s.Add("b", "q", "2", "p", kNow);
  s.Add("c", "q", "3", "p", kNow);
  EXPECT_EQ(s.queued(), 3u);
  EXPECT_EQ(s.Get(*s.Pop({}))->id, "a");
  EXPECT_EQ(s.Get(*s.Pop({}))->id, "b");
  EXPECT_EQ(s.queued(), 1u);
  EXPECT_EQ(s.running(), 2u);
}

TEST(BatchStoreTest, RequeuedBatchGoesToTheFront) {
  BatchStore s;
  s.Add("a", "q", "", "p", kNow);
  s.Add("b", "q", "", "p", kNow);
  BatchSeq a = *s.Pop({});
  s.Requeue(a);
  EXPECT_EQ(s.Get(*s.Pop({}))->id, "a");
}

TEST(BatchStoreTest, ErasedQueuedBatchIsSkippedAndDepthExact) {
  BatchStore s;
  BatchSeq a = s.Add("a", "q", "", "p", kNow);
  s.Add("b", "q", "", "p", kNow);
  s.Erase(a);
  EXPECT_EQ(s.Depth("q"), 1u);
  EXPECT_FALSE(s.FindId("a").has_value());
  EXPECT_EQ(s.Get(*s.Pop({}))->id, "b");
  EXPECT_FALSE(s.Pop({}).has_value());
  EXPECT_EQ(s.queued(), 0u);
}

TEST(BatchStoreTest, ServesOnlyTheQueuesAskedForAndTurnsRoundThem) {
  BatchStore s;
  s.Add("x1", "x", "", "p", kNow);
  s.Add("x2", "x", "", "p", kNow);
  s.Add("y1", "y", "", "p", kNow);
  EXPECT_FALSE(s.Pop({"z"}).has_value());
  EXPECT_EQ(s.Get(*s.Pop({"y"}))->id, "y1");
  EXPECT_FALSE(s.Pop({"y"}).has_value());
  s.Add("y2", "y", "", "p", kNow);
  // Every queue: alternates rather than draining x first.
  std::string first = s.Get(*s.Pop({}))->queue;
  std::string second = s.Get(*s.Pop({}))->queue;
  EXPECT_NE(first, second);
  auto depths = s.Depths();
  ASSERT_EQ(depths.size(), 2u);
  EXPECT_EQ(depths[0].first, "x");
}

}  // namespace
}  // namespace fleet::broker

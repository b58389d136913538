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
  std::string first(s.Get(*s.Pop({}))->queue);
  std::string second(s.Get(*s.Pop({}))->queue);
  EXPECT_NE(first, second);
  auto depths = s.Depths();
  ASSERT_EQ(depths.size(), 2u);
  EXPECT_EQ(depths[0].first, "x");
}

TEST(BatchStoreTest, SeqOfAnErasedBatchStaysStaleWhenItsSlotIsReused) {
  BatchStore s;
  BatchSeq a = s.Add("a", "q", "1", "p", kNow);
  s.Erase(a);
  BatchSeq b = s.Add("b", "q", "2", "p", kNow);
  EXPECT_NE(a, b);
  EXPECT_EQ(s.Get(a), nullptr);
  ASSERT_NE(s.Get(b), nullptr);
  EXPECT_EQ(s.Get(b)->id, "b");
  s.Erase(a);  // stale: no effect
  EXPECT_EQ(s.size(), 1u);
  // The stale seq left in the queue is skipped, not taken for "b".
  EXPECT_EQ(*s.Pop({}), b);
  EXPECT_FALSE(s.Pop({}).has_value());
}

TEST(BatchStoreTest, KeepsIdPayloadAndNamesOfEachBatch) {
  BatchStore s;
  const std::string payload(1000, 'x');
  BatchSeq a = s.Add("id-a", "q1", payload, "prod", kNow);
  const Batch* b = s.Get(a);
  for (int i = 0; i < 5000; ++i) s.Add("id-" + std::to_string(i), "q2", "p", "other", kNow);
  EXPECT_EQ(s.Get(a), b);  // adding more moves no batch
  EXPECT_EQ(b->id, "id-a");
  EXPECT_EQ(b->payload, payload);
  EXPECT_EQ(b->queue, "q1");
  EXPECT_EQ(b->owner, "prod");
  EXPECT_EQ(b->worker, "");
  EXPECT_EQ(b->enqueued_at, kNow);
  EXPECT_EQ(s.bytes(), 1000u + 5000u);
  EXPECT_EQ(s.InOrder().back(), s.Get(*s.FindId("id-4999")));
}

TEST(BatchStoreTest, RunningBatchNamesItsWorkerUntilRequeued) {
  BatchStore s;
  s.Add("a", "q", "", "p", kNow);
  BatchSeq a = *s.Pop({});
  s.SetWorker(a, "w1");
  EXPECT_EQ(s.Get(a)->worker, "w1");
  EXPECT_EQ(s.Get(a)->state, BatchState::kRunning);
  s.Requeue(a);
  EXPECT_EQ(s.Get(a)->worker, "");
  EXPECT_EQ(s.Get(a)->state, BatchState::kQueued);
  EXPECT_EQ(*s.Pop({}), a);
  s.SetWorker(a, "w2");
  EXPECT_EQ(s.Get(a)->worker, "w2");
}

TEST(BatchStoreTest, CountsBatchesPerOwnerThroughHandOverAndErase) {
  BatchStore s;
  BatchSeq a = s.Add("a", "q", "", "p1", kNow);
  s.Add("b", "q", "", "p1", kNow);
  s.Add("c", "q", "", "", kNow);  // restored from the journal: no producer yet
  EXPECT_EQ(s.OwnedBy("p1"), 2u);
  EXPECT_EQ(s.OwnedBy(""), 1u);
  s.SetOwner(a, "p2");
  EXPECT_EQ(s.Get(a)->owner, "p2");
  EXPECT_EQ(s.OwnedBy("p1"), 1u);
  EXPECT_EQ(s.OwnedBy("p2"), 1u);
  s.Erase(a);
  EXPECT_EQ(s.OwnedBy("p2"), 0u);
  EXPECT_EQ(s.OwnedBy("nobody"), 0u);
}

TEST(BatchStoreTest, InOrderFollowsAddOrderWhenSlotsAreReused) {
  BatchStore s;
  BatchSeq a = s.Add("a", "q", "", "p", kNow);
  s.Add("b", "q", "", "p", kNow);
  s.Erase(a);
  s.Add("c", "q", "", "p", kNow);  // takes a's slot
  std::vector<std::string> ids;
  for (const Batch* b : s.InOrder()) ids.emplace_back(b->id);
  EXPECT_EQ(ids, (std::vector<std::string>{"b", "c"}));
}

TEST(BatchStoreTest, DrainedStoreFreesItsSlotsAndOldSeqsStayStale) {
  BatchStore s;
  std::vector<BatchSeq> seqs;
  for (int i = 0; i < 10000; ++i) {
    seqs.push_back(s.Add("id-" + std::to_string(i), i % 2 ? "x" : "y", "p", "o", kNow));
  }
  for (int i = 0; i < 5000; ++i) s.Pop({});
  for (BatchSeq seq : seqs) s.Erase(seq);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.queued(), 0u);
  EXPECT_EQ(s.Depth("x"), 0u);
  EXPECT_EQ(s.bytes(), 0u);
  BatchSeq fresh = s.Add("new", "x", "p", "o", kNow);
  for (BatchSeq seq : seqs) {
    EXPECT_NE(seq, fresh);
    ASSERT_EQ(s.Get(seq), nullptr);
  }
  EXPECT_FALSE(s.FindId("id-1").has_value());
  EXPECT_EQ(*s.FindId("new"), fresh);
  EXPECT_EQ(*s.Pop({"x"}), fresh);
  EXPECT_EQ(s.Depths().size(), 2u);  // queues are remembered
}

}  // namespace
}  // namespace fleet::broker

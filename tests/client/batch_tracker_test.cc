#include "client/batch_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace fleet::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

std::vector<std::string> Peek(const BatchTracker& t, std::size_t max_batches = 100,
                              std::size_t max_bytes = 1 << 20) {
  std::vector<const BatchTracker::Batch*> out;
  t.PeekSendable(max_batches, max_bytes, &out);
  std::vector<std::string> ids;
  for (const auto* b : out) ids.push_back(b->id);
  return ids;
}

BatchTracker Make(std::size_t window) {
  BatchTracker::Options o;
  o.window = window;
  o.resend_after = seconds(10);
  return BatchTracker(o);
}

TEST(BatchTrackerTest, PendingBatchesWaitForWindowSlots) {
  BatchTracker t = Make(2);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(t.Add(id, "", "p"));
  EXPECT_EQ(Peek(t), (std::vector<std::string>{"a", "b"}));
  t.MarkSent(2, kT0);
  EXPECT_TRUE(Peek(t).empty());
  EXPECT_EQ(t.in_flight(), 2u);
  EXPECT_EQ(t.pending(), 1u);
  ASSERT_TRUE(t.Complete("a"));
  EXPECT_EQ(Peek(t), (std::vector<std::string>{"c"}));
}

TEST(BatchTrackerTest, PeekStopsAtByteCapButTakesAtLeastOne) {
  BatchTracker t = Make(100);
  ASSERT_TRUE(t.Add("a", "", std::string(1000, 'x')));
  ASSERT_TRUE(t.Add("b", "", std::string(1000, 'x')));
  EXPECT_EQ(Peek(t, 100, 500), (std::vector<std::string>{"a"}));
  EXPECT_EQ(Peek(t, 100, 2100), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Peek(t, 1, 1 << 20), (std::vector<std::string>{"a"}));
}

TEST(BatchTrackerTest, ResultsForUnsentOrUnknownIdsAreNotTaken) {
  BatchTracker t = Make(10);
  ASSERT_TRUE(t.Add("a", "", "p"));
  EXPECT_FALSE(t.Complete("a"));  // never sent: someone else's result
  EXPECT_FALSE(t.Complete("zz"));
  EXPECT_FALSE(t.Add("a", "", "p"));
  t.MarkSent(1, kT0);
  EXPECT_TRUE(t.Complete("a"));
  EXPECT_FALSE(t.Complete("a"));
  EXPECT_EQ(t.outstanding(), 0u);
  EXPECT_FALSE(t.NextDeadline().has_value());
}

TEST(BatchTrackerTest, QueueFullBackoffDoublesUpToCapThenResubmitsFirst) {
  BatchTracker::Options o;
  o.window = 10;
  o.retry_initial = milliseconds(10);
  o.retry_max = milliseconds(25);
  BatchTracker t(o);
  ASSERT_TRUE(t.Add("a", "", "p"));
  ASSERT_TRUE(t.Add("b", "", "p"));
  t.MarkSent(1, kT0);  // a
  struct Step {
    milliseconds wait;
  };
  TimePoint now = kT0;
  std::vector<std::string> fetch;
  for (Step s : {Step{milliseconds(10)}, Step{milliseconds(20)},
                 Step{milliseconds(25)}, Step{milliseconds(25)}}) {
    ASSERT_TRUE(t.OnQueueFull("a", now));
    EXPECT_EQ(t.NextDeadline(), now + s.wait);
    t.Due(now + s.wait - milliseconds(1), &fetch);
    EXPECT_EQ(t.resubmits(), 0u);
    now += s.wait;
    t.Due(now, &fetch);
    EXPECT_EQ(t.resubmits(), 1u);
    EXPECT_EQ(Peek(t), (std::vector<std::string>{"a", "b"}));
    t.MarkSent(1, now);  // a again; b stays pending
  }
  EXPECT_TRUE(fetch.empty());
  ASSERT_TRUE(t.OnAccepted("a", now));
  ASSERT_TRUE(t.OnQueueFull("a", now));
  EXPECT_EQ(t.NextDeadline(), now + milliseconds(10)) << "accept resets backoff";
}

TEST(BatchTrackerTest, OverdueBatchIsFetchedAndRearmed) {
  BatchTracker t = Make(10);
  ASSERT_TRUE(t.Add("a", "", "p"));
  t.MarkSent(1, kT0);
  ASSERT_TRUE(t.OnAccepted("a", kT0 + seconds(1)));
  std::vector<std::string> fetch;
  t.Due(kT0 + seconds(10), &fetch);
  EXPECT_TRUE(fetch.empty());
  t.Due(kT0 + seconds(11), &fetch);
  EXPECT_EQ(fetch, std::vector<std::string>{"a"});
  EXPECT_EQ(t.NextDeadline(), kT0 + seconds(21));
  ASSERT_TRUE(t.OnUnknown("a"));
  EXPECT_FALSE(t.OnUnknown("a"));  // already waiting to go out again
  EXPECT_EQ(Peek(t), std::vector<std::string>{"a"});
  EXPECT_FALSE(t.NextDeadline().has_value());
  ASSERT_TRUE(t.Complete("a"));  // the result overtook the resubmit
  EXPECT_TRUE(Peek(t).empty());
}

TEST(BatchTrackerTest, ResendSentMovesOnlySentBatchesInSendOrder) {
  BatchTracker t = Make(4);
  for (const char* id : {"a", "b", "c", "d", "e", "f"}) ASSERT_TRUE(t.Add(id, "", "p"));
  t.MarkSent(2, kT0);                    // a, b
  t.MarkSent(2, kT0 + milliseconds(5));  // c, d
  ASSERT_TRUE(t.Complete("b"));          // has its result
  ASSERT_TRUE(t.OnQueueFull("c", kT0));  // waits out a backoff
  // e takes b's slot; f stays pending (window 4: a, c, d, e).
  t.MarkSent(1, kT0 + milliseconds(6));

  EXPECT_EQ(t.ResendSent(), 3u);
  EXPECT_EQ(t.resubmits(), 3u);
  EXPECT_EQ(Peek(t), (std::vector<std::string>{"a", "d", "e"}));
  EXPECT_EQ(t.in_flight(), 4u);
  EXPECT_EQ(t.pending(), 1u);
  // The retry keeps its deadline; the re-sent ones have none until sent.
  EXPECT_EQ(t.NextDeadline(), kT0 + milliseconds(10));
  t.MarkSent(3, kT0 + seconds(1));
  EXPECT_EQ(t.ResendSent(), 3u);  // sent again, so moved again
  EXPECT_EQ(t.ResendSent(), 0u);  // already waiting to go out
  // A result for a batch waiting to be re-sent takes it out of the line,
  // and its slot goes to the pending one.
  ASSERT_TRUE(t.Complete("d"));
  EXPECT_EQ(Peek(t), (std::vector<std::string>{"a", "e", "f"}));
}

}  // namespace
}  // namespace fleet::client

namespace fleet::client {
namespace {

TEST(BatchTrackerTest, FinishedBatchesWakeQueueFullRetriesBeforeTheirBackoffEnds) {
  BatchTracker t = Make(10);
  for (const char* id : {"a", "b", "c", "d"}) ASSERT_TRUE(t.Add(id, "", "p"));
  t.MarkSent(4, kT0);
  ASSERT_TRUE(t.OnAccepted("a", kT0));
  ASSERT_TRUE(t.OnQueueFull("b", kT0));
  ASSERT_TRUE(t.OnQueueFull("c", kT0 + milliseconds(1)));
  ASSERT_TRUE(t.OnQueueFull("d", kT0 + milliseconds(2)));
  EXPECT_TRUE(Peek(t).empty());  // all waiting out their backoff
  ASSERT_TRUE(t.Complete("a"));
  t.WakeRetries(2);  // two batches finished at the broker
  EXPECT_EQ(Peek(t), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(t.resubmits(), 2u);
}

// Many thousands of batches sent, accepted and finished leave stale resend
// timers behind; the ones still outstanding keep theirs through the
// clean-ups, and come due exactly once each.
TEST(BatchTrackerTest, OutstandingBatchesKeepTheirResendDeadlineThroughChurn) {
  BatchTracker t = Make(64);
  TimePoint now = kT0;
  std::vector<std::string> kept;
  for (int i = 0; i < 50000; ++i) {
    const std::string id = "b" + std::to_string(i);
    ASSERT_TRUE(t.Add(id, "", "p"));
    t.MarkSent(1, now);
    ASSERT_TRUE(t.OnAccepted(id, now));
    if (i % 5000 == 0) {
      kept.push_back(id);  // never finishes
    } else {
      ASSERT_TRUE(t.Complete(id));
    }
    now += std::chrono::microseconds(10);
  }
  EXPECT_EQ(t.outstanding(), kept.size());
  std::vector<std::string> fetch;
  t.Due(now, &fetch);
  EXPECT_TRUE(fetch.empty());
  t.Due(now + seconds(10), &fetch);
  std::sort(fetch.begin(), fetch.end());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(fetch, kept);
  for (const std::string& id : kept) ASSERT_TRUE(t.Complete(id));
  EXPECT_FALSE(t.NextDeadline().has_value());
}

}  // namespace
}  // namespace fleet::client

namespace fleet::client {
namespace {

// Entries are pooled and reused: a finished batch's stale resend timer must
// not fire for the next batch that takes its entry, a big pool left by a
// burst is released once nothing is outstanding, and the tracker works on
// after that with the same ids.
TEST(BatchTrackerTest, ReusedAndReleasedEntriesKeepTimersAndIdsApart) {
  BatchTracker t = Make(10000);
  ASSERT_TRUE(t.Add("a", "q", "first payload"));
  t.MarkSent(1, kT0);
  ASSERT_TRUE(t.Complete("a"));
  ASSERT_TRUE(t.Add("b", "", "second"));  // takes a's entry
  EXPECT_EQ(Peek(t), std::vector<std::string>{"b"});
  t.MarkSent(1, kT0 + seconds(5));
  std::vector<std::string> fetch;
  t.Due(kT0 + seconds(11), &fetch);  // a's deadline has passed, b's not
  EXPECT_TRUE(fetch.empty());
  t.Due(kT0 + seconds(15), &fetch);
  EXPECT_EQ(fetch, std::vector<std::string>{"b"});
  EXPECT_FALSE(t.Complete("a"));
  ASSERT_TRUE(t.Complete("b"));

  // A burst past the pool's keep size, all finished: released.
  for (int i = 0; i < 6000; ++i) ASSERT_TRUE(t.Add("x" + std::to_string(i), "", "p"));
  t.MarkSent(6000, kT0 + seconds(20));
  for (int i = 0; i < 6000; ++i) ASSERT_TRUE(t.Complete("x" + std::to_string(i)));
  EXPECT_EQ(t.outstanding(), 0u);
  EXPECT_FALSE(t.NextDeadline().has_value());
  ASSERT_TRUE(t.Add("x1", "", "again"));
  std::vector<const BatchTracker::Batch*> out;
  t.PeekSendable(10, 1 << 20, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]->id, "x1");
  EXPECT_EQ(out[0]->payload, "again");
  t.MarkSent(1, kT0 + seconds(30));
  fetch.clear();
  t.Due(kT0 + seconds(40), &fetch);
  EXPECT_EQ(fetch, std::vector<std::string>{"x1"});
}

}  // namespace
}  // namespace fleet::client

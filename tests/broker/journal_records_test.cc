#include "broker/journal_records.h"

#include <gtest/gtest.h>

#include <string>

namespace fleet::broker::records {
namespace {

TEST(JournalRecordsTest, AcceptedRecordRoundTripsItsIdQueueAndBinaryPayload) {
  std::string body = "left over from the last record";
  const std::string payload("\0\xff payload \0", 12);
  EncodeAccepted(&body, "batch-1", "gpu", payload);
  auto a = DecodeAccepted(body);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "batch-1");
  EXPECT_EQ(a->queue, "gpu");
  EXPECT_EQ(a->payload, payload);
  // The layout is the documented one: u32 LE length, id, u32 LE length, queue.
  EXPECT_EQ(body.substr(0, 11), std::string("\x07\0\0\0batch-1", 11));
  EncodeAccepted(&body, "b", "", "");
  a = DecodeAccepted(body);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->queue, "");
  EXPECT_EQ(a->payload, "");
}

TEST(JournalRecordsTest, DamagedOrEmptyIdRecordsAreRefused) {
  std::string body;
  EncodeAccepted(&body, "batch-1", "q", "p");
  for (std::size_t cut : {0u, 3u, 4u, 10u, 12u, 14u}) {
    EXPECT_FALSE(DecodeAccepted(std::string_view(body).substr(0, cut)).has_value()) << cut;
  }
  EncodeAccepted(&body, "", "q", "p");
  EXPECT_FALSE(DecodeAccepted(body).has_value());
  std::string huge("\xff\xff\xff\xff", 4);
  EXPECT_FALSE(DecodeAccepted(huge + "x").has_value());
}

TEST(JournalRecordsTest, DispatchedRecordKeepsTheAttemptCount) {
  std::string body;
  EncodeDispatched(&body, 3, "batch-9");
  auto d = DecodeDispatched(body);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->attempts, 3u);
  EXPECT_EQ(d->id, "batch-9");
  EXPECT_FALSE(DecodeDispatched(std::string_view(body).substr(0, 4)).has_value());
}

// What compaction keeps a record for: the batch it is about; none for a
// record it cannot read or a record of ids (the journal reads those).
TEST(JournalRecordsTest, BatchIdNamesTheBatchOfARecordAndNoneOfAnUnreadableOne) {
  std::string accepted;
  std::string dispatched;
  EncodeAccepted(&accepted, "a", "q", "payload");
  EncodeDispatched(&dispatched, 2, "c");
  EXPECT_EQ(BatchId(kAccepted, accepted), "a");
  EXPECT_EQ(BatchId(kFinished, "b"), "b");
  EXPECT_EQ(BatchId(kDispatched, dispatched), "c");
  EXPECT_EQ(BatchId(kFinishedIds, std::string("\1\0\0\0d", 5)), "");
  EXPECT_EQ(BatchId(kAccepted, "\5"), "");
  EXPECT_EQ(BatchId(kDispatched, "\1\0\0"), "");
  EXPECT_EQ(BatchId(99, "x"), "");
}

}  // namespace
}  // namespace fleet::broker::records

namespace fleet::broker::records {
namespace {

TEST(JournalRecordsTest, AcceptedHeadFollowedByThePayloadIsTheAcceptedBody) {
  std::string whole;
  std::string head;
  EncodeAccepted(&whole, "batch-7", "gpu", std::string("p\0q", 3));
  EncodeAcceptedHead(&head, "batch-7", "gpu");
  EXPECT_EQ(head + std::string("p\0q", 3), whole);
  const std::string body = head + "xyz";
  auto a = DecodeAccepted(body);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "batch-7");
  EXPECT_EQ(a->queue, "gpu");
  EXPECT_EQ(a->payload, "xyz");
}

TEST(JournalRecordsTest, AttemptsBytesFollowedByTheIdAreTheDispatchedBody) {
  std::string whole;
  EncodeDispatched(&whole, 0x01020304u, "batch-9");
  char attempts[4];
  StoreAttempts(attempts, 0x01020304u);
  EXPECT_EQ(std::string(attempts, 4) + "batch-9", whole);
}

}  // namespace
}  // namespace fleet::broker::records

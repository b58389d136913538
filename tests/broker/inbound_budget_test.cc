#include "broker/inbound_budget.h"

#include <gtest/gtest.h>

namespace fleet::broker {
namespace {

using std::chrono::milliseconds;

constexpr std::uint64_t kFrame = 100;

class InboundBudgetTest : public ::testing::Test {
 protected:
  // Room for three unproven connections; 1 s of grace.
  InboundBudget budget_{3 * kFrame, std::chrono::seconds(1)};
  FakeClock clock_;

  InboundBudget::Decision Accept(int fd, std::size_t endpoint = 0) {
    return budget_.OnAccepted(fd, endpoint, kFrame, clock_.Now());
  }
};

TEST_F(InboundBudgetTest, RefusesTheNewestPastTheBudgetWhileOthersAreYoung) {
  for (int fd : {10, 11, 12}) EXPECT_TRUE(Accept(fd).admitted);
  EXPECT_EQ(budget_.reserved_bytes(), 3 * kFrame);
  InboundBudget::Decision d = Accept(13);
  EXPECT_FALSE(d.admitted);
  EXPECT_TRUE(d.evict.empty());
  EXPECT_EQ(budget_.unproven(), 3u);
  // The refused one was never tracked: its close changes nothing.
  budget_.OnClosed(13, 0);
  EXPECT_EQ(budget_.connections(), 3u);
}

TEST_F(InboundBudgetTest, ProvenConnectionsAreNotCharged) {
  // Hundreds of workers, each proven by its first message, fit a budget of
  // three frames.
  for (int fd = 10; fd < 510; ++fd) {
    ASSERT_TRUE(Accept(fd, 1).admitted) << fd;
    EXPECT_TRUE(budget_.OnProven(fd));
  }
  EXPECT_EQ(budget_.connections(), 500u);
  EXPECT_EQ(budget_.unproven(), 0u);
  EXPECT_EQ(budget_.reserved_bytes(), 0u);
  EXPECT_FALSE(budget_.OnProven(10));  // already proven
  EXPECT_FALSE(budget_.OnProven(9999));  // unknown
}

TEST_F(InboundBudgetTest, ClosingReleasesTheCharge) {
  for (int fd : {10, 11, 12}) Accept(fd);
  budget_.OnClosed(11, 0);
  EXPECT_EQ(budget_.reserved_bytes(), 2 * kFrame);
  EXPECT_TRUE(Accept(13).admitted);
}

TEST_F(InboundBudgetTest, EvictsTheOldestSilentConnectionPastItsGrace) {
  Accept(10);
  clock_.Advance(milliseconds(600));
  Accept(11);
  Accept(12);
  clock_.Advance(milliseconds(500));  // 10 is 1.1 s old, 11 and 12 0.5 s
  InboundBudget::Decision d = Accept(13, 2);
  ASSERT_TRUE(d.admitted);
  ASSERT_EQ(d.evict.size(), 1u);
  EXPECT_EQ(d.evict[0].fd, 10);
  EXPECT_EQ(d.evict[0].endpoint, 0u);
  EXPECT_EQ(budget_.reserved_bytes(), 3 * kFrame);
  // The evicted one's close event, when it comes, is ignored.
  budget_.OnClosed(10, 0);
  EXPECT_EQ(budget_.unproven(), 3u);
  // Nothing else is old enough yet.
  EXPECT_FALSE(Accept(14).admitted);
}

TEST_F(InboundBudgetTest, ProvenConnectionsAreNeverEvicted) {
  Accept(10);
  budget_.OnProven(10);
  for (int fd : {11, 12, 13}) Accept(fd);
  clock_.Advance(std::chrono::seconds(5));
  InboundBudget::Decision d = Accept(14);
  ASSERT_TRUE(d.admitted);
  ASSERT_EQ(d.evict.size(), 1u);
  EXPECT_EQ(d.evict[0].fd, 11);
  EXPECT_EQ(budget_.connections(), 4u);  // 10 (proven), 12, 13, 14
}

TEST_F(InboundBudgetTest, AReusedFdEndsTheConnectionThatHeldIt) {
  Accept(10, 0);
  // fd 10 closed on the producers endpoint and was reused on the workers
  // endpoint before the producers' close event was read.
  EXPECT_TRUE(Accept(10, 1).admitted);
  EXPECT_EQ(budget_.connections(), 1u);
  EXPECT_EQ(budget_.reserved_bytes(), kFrame);
  // The late close of the producers' connection leaves the workers' one.
  budget_.OnClosed(10, 0);
  EXPECT_EQ(budget_.connections(), 1u);
  budget_.OnClosed(10, 1);
  EXPECT_EQ(budget_.connections(), 0u);
  EXPECT_EQ(budget_.reserved_bytes(), 0u);
}

TEST_F(InboundBudgetTest, QueueStaysProportionalUnderChurnBehindASilentConnection) {
  Accept(3);  // silent for ever, at the head of the eviction order
  for (int round = 0; round < 10000; ++round) {
    ASSERT_TRUE(Accept(4).admitted);
    budget_.OnProven(4);
    budget_.OnClosed(4, 0);
  }
  EXPECT_EQ(budget_.unproven(), 1u);
  EXPECT_EQ(budget_.connections(), 1u);
  EXPECT_EQ(budget_.reserved_bytes(), kFrame);
}

}  // namespace
}  // namespace fleet::broker

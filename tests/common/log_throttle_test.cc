#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "common/log.h"

namespace fleet {
namespace {

using std::chrono::seconds;

TEST(KeyedLogThrottleTest, OneLinePerPeerPerIntervalWithTheHeldBackCount) {
  KeyedLogThrottle t(seconds(10));
  const TimePoint t0{};
  std::uint64_t held = 99;
  EXPECT_TRUE(t.Allow("10.0.0.1", t0, &held));
  EXPECT_EQ(held, 0u);
  EXPECT_FALSE(t.Allow("10.0.0.1", t0 + seconds(1), &held));
  EXPECT_FALSE(t.Allow("10.0.0.1", t0 + seconds(2), &held));
  // Another peer is not hidden by the first.
  EXPECT_TRUE(t.Allow("10.0.0.2", t0 + seconds(2), &held));
  EXPECT_EQ(held, 0u);
  EXPECT_TRUE(t.Allow("10.0.0.1", t0 + seconds(10), &held));
  EXPECT_EQ(held, 2u);
}

TEST(KeyedLogThrottleTest, ExpireSummarizesWhatNoLineReportedAndForgetsQuietPeers) {
  KeyedLogThrottle t(seconds(10), /*max_keys=*/2);
  const TimePoint t0{};
  std::uint64_t held = 0;
  EXPECT_TRUE(t.Allow("a", t0, &held));
  EXPECT_FALSE(t.Allow("a", t0 + seconds(1), &held));
  EXPECT_TRUE(t.Allow("b", t0, &held));
  EXPECT_FALSE(t.Allow("c", t0, &held)) << "past max_keys: counted, not tracked";
  EXPECT_FALSE(t.Allow("d", t0, &held));
  KeyedLogThrottle::Summary s = t.Expire(t0 + seconds(5));
  EXPECT_EQ(s.events, 2u) << "the untracked ones";
  EXPECT_EQ(s.keys, 1u);
  EXPECT_EQ(t.size(), 2u);
  s = t.Expire(t0 + seconds(10));
  EXPECT_EQ(s.events, 1u) << "a's held-back event";
  EXPECT_EQ(s.keys, 1u);
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace fleet

#include "worker/slot_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace fleet::worker {
namespace {

// Receives one completion, waiting at most `timeout`.
std::optional<Completion> ReceiveWithin(zmq::socket_t& pull, std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{pull.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) <= 0) return std::nullopt;
  return Completion::Receive(pull);
}

struct PoolFixture {
  explicit PoolFixture(Handler& handler, int slots, Timeout timeout = Timeout(0),
                       std::size_t max_result = 1 << 20)
      : pull(context, zmq::socket_type::pull) {
    pull.set(zmq::sockopt::linger, 0);
    pull.bind("inproc://results");
    pool = std::make_unique<SlotPool>(context, "inproc://results", handler, slots,
                                      timeout, max_result, 1024);
  }
  zmq::context_t context;
  zmq::socket_t pull;
  std::unique_ptr<SlotPool> pool;
};

TEST(SlotPoolTest, ReportsEveryTaskOnceWithItsAttempt) {
  EchoHandler echo;
  PoolFixture f(echo, 3);
  for (int i = 0; i < 20; ++i) {
    f.pool->Submit(Task{"b" + std::to_string(i), "q", static_cast<std::uint32_t>(i + 1),
                        "payload" + std::to_string(i)});
  }
  std::map<std::string, int> seen;
  for (int i = 0; i < 20; ++i) {
    auto c = ReceiveWithin(f.pull, std::chrono::seconds(10));
    ASSERT_TRUE(c.has_value());
    const std::string id(c->id());
    ++seen[id];
    EXPECT_TRUE(c->ok());
    EXPECT_EQ(c->result(), "payload" + id.substr(1));
    EXPECT_EQ(c->attempt(), static_cast<std::uint32_t>(std::stoi(id.substr(1)) + 1));
  }
  EXPECT_EQ(seen.size(), 20u);
  for (auto& [id, n] : seen) EXPECT_EQ(n, 1) << id;
}

TEST(SlotPoolTest, AWholeDispatchSubmittedAtOnceComesBackOnceEach) {
  EchoHandler echo;
  PoolFixture f(echo, 4);
  std::vector<Task> tasks;
  for (int i = 0; i < 500; ++i) {
    tasks.push_back(Task{"t" + std::to_string(i), "", 7, "x" + std::to_string(i)});
  }
  f.pool->Submit(tasks);
  EXPECT_TRUE(tasks.empty());
  std::map<std::string, int> seen;
  for (int i = 0; i < 500; ++i) {
    auto c = ReceiveWithin(f.pull, std::chrono::seconds(10));
    ASSERT_TRUE(c.has_value()) << "after " << i << " results";
    const std::string id(c->id());
    ++seen[id];
    EXPECT_EQ(c->attempt(), 7u);
    EXPECT_EQ(c->result(), "x" + id.substr(1));
    EXPECT_EQ(c->error(), "");
  }
  EXPECT_EQ(seen.size(), 500u);
  for (auto& [id, n] : seen) EXPECT_EQ(n, 1) << id;
  EXPECT_FALSE(ReceiveWithin(f.pull, std::chrono::milliseconds(50)).has_value());
}

TEST(SlotPoolTest, OneSlotRunsTasksInOrder) {
  EchoHandler echo;
  PoolFixture f(echo, 1);
  for (int i = 0; i < 5; ++i) f.pool->Submit(Task{std::to_string(i), "", 1, ""});
  for (int i = 0; i < 5; ++i) {
    auto c = ReceiveWithin(f.pull, std::chrono::seconds(10));
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->id(), std::to_string(i));
  }
}

TEST(SlotPoolTest, FailedHandlerOutputCarriesError) {
  SleepHandler sleep;
  PoolFixture f(sleep, 1);
  f.pool->Submit(Task{"bad", "", 2, "not-a-number"});
  auto c = ReceiveWithin(f.pull, std::chrono::seconds(10));
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->ok());
  EXPECT_EQ(c->result(), "");
  EXPECT_NE(c->error().find("milliseconds"), std::string_view::npos);
}

TEST(SlotPoolTest, ResultOverTheLimitFails) {
  EchoHandler echo;
  PoolFixture f(echo, 1, Timeout(0), /*max_result=*/10);
  f.pool->Submit(Task{"big", "", 1, std::string(11, 'x')});
  auto c = ReceiveWithin(f.pull, std::chrono::seconds(10));
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->ok());
  EXPECT_NE(c->error().find("exceeds"), std::string_view::npos);
}

}  // namespace
}  // namespace fleet::worker

#include "client/demand_watch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/clock.h"
#include "tests/client/fake_router.h"

namespace fleet::client {
namespace {

using std::chrono::milliseconds;
using testing::ManualRouter;

class DemandWatchTest : public ::testing::Test {
 protected:
  DemandWatchTest() : router_(context_), watch_(context_, Options(router_.endpoint())) {}

  static DemandWatch::Options Options(const std::string& endpoint) {
    DemandWatch::Options o;
    o.endpoint = endpoint;
    o.socket.linger_ms = 0;
    o.wait = milliseconds(2000);
    return o;
  }

  // Arms at `now` once the connection is up, and returns the request the
  // router received.
  testing::Received ArmAndReceive(TimePoint now) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!watch_.Arm(now)) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "the watch never connected";
        return {};
      }
      zmq::pollitem_t item{watch_.socket().handle(), 0, ZMQ_POLLOUT, 0};
      zmq::poll(&item, 1, milliseconds(50));
    }
    router_.received().clear();
    while (router_.received().empty()) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "the router got no request";
        return {};
      }
      std::this_thread::sleep_for(milliseconds(5));
      router_.Drain();
    }
    return router_.received().back();
  }

  // Sends `reply` and returns what Receive makes of it once it arrived.
  std::optional<double> Answer(const proto::ControlReply& reply) {
    router_.Send(reply);
    zmq::pollitem_t item{watch_.socket().handle(), 0, ZMQ_POLLIN, 0};
    EXPECT_EQ(zmq::poll(&item, 1, milliseconds(10000)), 1);
    return watch_.Receive();
  }

  zmq::context_t context_{1};
  ManualRouter router_;
  DemandWatch watch_;
  FakeClock clock_;
};

TEST_F(DemandWatchTest, AsksWithItsWaitAndReturnsTheReportedDepth) {
  testing::Received r = ArmAndReceive(clock_.Now());
  EXPECT_EQ(r.command, proto::Command::kControl);
  EXPECT_EQ(r.op, "wait-demand");
  EXPECT_EQ(r.args, std::vector<std::string>{"2000"});
  // One request out at a time.
  EXPECT_FALSE(watch_.due(clock_.Now()));
  EXPECT_FALSE(watch_.Arm(clock_.Now()));
  // An answer to some other request is skipped.
  EXPECT_FALSE(Answer({r.request_id + 7, proto::ErrorCode::kOk, "demand queued=3"}));
  EXPECT_FALSE(watch_.due(clock_.Now()));
  EXPECT_EQ(Answer({r.request_id, proto::ErrorCode::kOk, "demand queued=42"}), 42.0);
  EXPECT_TRUE(watch_.due(clock_.Now()));
}

TEST_F(DemandWatchTest, NoDemandMakesItDueAtOnce) {
  testing::Received r = ArmAndReceive(clock_.Now());
  EXPECT_FALSE(Answer({r.request_id, proto::ErrorCode::kOk, "no demand"}));
  EXPECT_TRUE(watch_.due(clock_.Now()));
  testing::Received again = ArmAndReceive(clock_.Now());
  EXPECT_GT(again.request_id, r.request_id);
}

TEST_F(DemandWatchTest, ARefusalIsRetriedOnlyOnceOverdue) {
  for (proto::ErrorCode refusal : {proto::ErrorCode::kTooLarge, proto::ErrorCode::kInvalidArgument}) {
    testing::Received r = ArmAndReceive(clock_.Now());
    EXPECT_FALSE(Answer({r.request_id, refusal, "no"}));
    // Not at once (that would be a request per round trip) ...
    EXPECT_FALSE(watch_.due(clock_.Now()));
    EXPECT_EQ(watch_.overdue_at(), clock_.Now() + milliseconds(2000) + std::chrono::seconds(5));
    // ... but once its wait and the slack have passed.
    clock_.Advance(milliseconds(2000) + std::chrono::seconds(5));
    EXPECT_TRUE(watch_.due(clock_.Now()));
  }
}

TEST_F(DemandWatchTest, AnUnansweredRequestIsSentAgainOnceOverdue) {
  testing::Received r = ArmAndReceive(clock_.Now());
  clock_.Advance(milliseconds(6999));
  EXPECT_FALSE(watch_.due(clock_.Now()));
  clock_.Advance(milliseconds(1));  // a broker that restarted forgot it
  testing::Received again = ArmAndReceive(clock_.Now());
  EXPECT_GT(again.request_id, r.request_id);
  // The old request's late answer no longer counts.
  EXPECT_FALSE(Answer({r.request_id, proto::ErrorCode::kOk, "demand queued=1"}));
  EXPECT_EQ(Answer({again.request_id, proto::ErrorCode::kOk, "demand queued=2"}), 2.0);
}

}  // namespace
}  // namespace fleet::client

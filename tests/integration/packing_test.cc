// The pool follows the load down: with the broker packing work onto the
// most recently busy workers, the surplus ones go idle and the autoscaler
// retires them, under a steady load as well as after it. Real broker,
// autoscaler (process launcher) and workers on 127.0.0.1.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "tests/support/cluster.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class PackingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartBroker({"--heartbeat-ms", "250", "--retire-linger-ms", "200"});
    prefix_ = "pack-" + std::to_string(getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-";
    scaler_ = std::make_unique<Process>(
        std::vector<std::string>{
            Bin("fleet-autoscaler"), "--control", c_.control(), "--metrics-source", c_.metrics(),
            "--worker-args", "--broker " + c_.backend() + " --handler sleep --heartbeat-ms 250",
            "--min", "0", "--max", "8", "--target-per-worker", "1", "--idle-seconds", "1",
            "--cooldown-seconds", "0.5", "--stabilization-seconds", "1", "--poll-ms", "100",
            "--grace-seconds", "5", "--id-prefix", prefix_, "--metrics", ""},
        c_.dir().File("autoscaler.log"));
  }
  void TearDown() override {
    scaler_->Signal(SIGTERM);
    EXPECT_TRUE(scaler_->Wait(seconds(30)).has_value());
    EXPECT_TRUE(WaitFor([&] { return CountWorkers(prefix_) == 0; }, seconds(20)));
  }

  int Registered() {
    int n = 0;
    for (const auto& w : c_.Workers()) n += w.value("state", "") != "retiring";
    return n;
  }

  // A burst that grows the pool to its maximum of 8.
  void GrowToEight() {
    Process burst({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "400",
                   "--payload", "50", "--inflight", "400", "--timeout-seconds", "120"},
                  c_.dir().File("burst.log"));
    int most = 0;
    ASSERT_TRUE(WaitFor([&] {
      most = std::max(most, Registered());
      return most == 8;
    }, seconds(60))) << ReadFile(c_.dir().File("autoscaler.log"));
    ASSERT_EQ(burst.Wait(seconds(120)), 0) << burst.ReadLog();
  }

  // Runs a closed-loop producer of 20 ms batches, `inflight` at a time,
  // for `count` batches; from `settle` after its start until it ends, the
  // largest pool seen. Requires every batch ok.
  int PoolWhileSteady(int inflight, int count, milliseconds settle) {
    Process steady({Bin("fleet-submit"), "--broker", c_.frontend(), "--count",
                    std::to_string(count), "--payload", "20", "--inflight",
                    std::to_string(inflight), "--timeout-seconds", "120"},
                   c_.dir().File("steady.log"));
    const auto start = std::chrono::steady_clock::now();
    int most = 0;
    std::optional<int> code;
    WaitFor([&] {
      const int now = Registered();
      if (std::chrono::steady_clock::now() - start >= settle) most = std::max(most, now);
      code = steady.Wait(milliseconds(0));
      return code.has_value();
    }, seconds(180));
    EXPECT_EQ(code, std::optional<int>(0)) << steady.ReadLog();
    EXPECT_NE(steady.ReadLog().find("submitted=" + std::to_string(count) + " ok=" +
                                    std::to_string(count) + " failed=0 lost=0"),
              std::string::npos)
        << steady.ReadLog();
    return most;
  }

  Cluster c_;
  std::string prefix_;
  std::unique_ptr<Process> scaler_;
};

// Regression: after a burst grew the pool to 8, a trickle of one 20 ms
// batch at a time kept all 8 (round-robin dispatch gave each a batch every
// 160 ms, so none was ever idle for --idle-seconds). Now one or two do it.
TEST_F(PackingTest, SteadyTrickleAfterABurstShrinksThePoolToOneOrTwo) {
  GrowToEight();
  // 500 batches one at a time: about 12 s; judged after idle (1 s) +
  // stabilization (1 s) + cooldowns and polls, with room for a slow machine.
  const int most = PoolWhileSteady(1, 500, milliseconds(6000));
  EXPECT_LE(most, 2) << ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_EQ(c_.StatValue("completed_failed"), 0);
  EXPECT_EQ(c_.StatValue("requeued"), 0);
}

// Four batches in flight at all times need four workers: a pool of 8 settles
// at no more than five.
TEST_F(PackingTest, HalfLoadOnAPoolOfEightSettlesAtNeededPlusOne) {
  GrowToEight();
  const int most = PoolWhileSteady(4, 2000, milliseconds(6000));
  EXPECT_LE(most, 5) << ReadFile(c_.dir().File("autoscaler.log"));
  EXPECT_GE(most, 4);
  EXPECT_EQ(c_.StatValue("completed_failed"), 0);
  EXPECT_EQ(c_.StatValue("requeued"), 0);
}

}  // namespace
}  // namespace fleet::testing

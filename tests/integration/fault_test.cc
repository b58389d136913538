// Faults with the real programs: a batch that kills its worker every time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "tests/support/cluster.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

// A poison batch (its worker dies with SIGKILL each time it runs it) is
// dead-lettered after --max-attempts with a failed result that says so; it
// takes at most that many workers with it; every other batch completes; the
// autoscaler keeps the pool alive.
TEST(FaultTest, PoisonBatchIsDeadLetteredAfterMaxAttemptsAndKillsNoMoreWorkers) {
  Cluster c;
  c.StartBroker({"--heartbeat-ms", "250", "--max-attempts", "3", "--retire-linger-ms", "0"});
  const std::string handler = c.dir().File("handler.sh");
  {
    // Echo, except "poison": SIGKILL the fleet-worker running this.
    std::ofstream f(handler);
    f << "p=$(cat)\n"
         "if [ \"$p\" = poison ]; then\n"
         "  pid=$$\n"
         "  while [ \"$pid\" -gt 1 ]; do\n"
         "    case \"$(tr '\\0' ' ' </proc/$pid/cmdline)\" in\n"
         "      *fleet-worker*) kill -9 \"$pid\"; exit 1 ;;\n"
         "    esac\n"
         "    pid=$(awk '{print $4}' /proc/$pid/stat)\n"
         "  done\n"
         "fi\n"
         "printf '%s' \"$p\"\n";
  }
  const std::string prefix = "poison-" + std::to_string(getpid()) + "-";
  Process scaler({Bin("fleet-autoscaler"), "--control", c.control(), "--metrics-source",
                  c.metrics(), "--worker-args",
                  "--broker " + c.backend() + " --handler exec --exec 'sh " + handler +
                      "' --concurrency 1 --heartbeat-ms 250",
                  "--min", "2", "--max", "3", "--poll-ms", "200", "--idle-seconds", "30",
                  "--id-prefix", prefix, "--metrics", ""},
                 c.dir().File("autoscaler.log"));
  {
    std::ofstream in(c.dir().File("payloads.txt"));
    for (int i = 0; i < 40; ++i) in << (i == 10 ? std::string("poison") : "ok-" + std::to_string(i)) << "\n";
  }
  Cluster::Submitted s = c.Submit({"--input", c.dir().File("payloads.txt"), "--inflight", "40",
                                   "--timeout-seconds", "120"},
                                  seconds(180));
  EXPECT_EQ(s.summary["ok"], "39") << s.run.output;
  EXPECT_EQ(s.summary["failed"], "1");
  EXPECT_EQ(s.summary["lost"], "0");
  int dead_lettered = 0;
  std::set<std::string> echoed;
  for (const auto& r : s.results) {
    if (r.value("outcome", "") == "failed") {
      ++dead_lettered;
      EXPECT_THAT(r.value("error", ""), ::testing::HasSubstr("dead-lettered after 3 attempts"));
      EXPECT_EQ(r.value("attempts", 0), 3);
    } else {
      EXPECT_THAT(r.value("result", ""), ::testing::StartsWith("ok-"));
      echoed.insert(r.value("result", ""));
    }
  }
  EXPECT_EQ(dead_lettered, 1);
  EXPECT_EQ(echoed.size(), 39u);  // each innocent batch's own payload, once
  // Exactly one worker per attempt died for it, and none for anything else.
  EXPECT_EQ(c.StatValue("workers_dead"), 3) << c.BrokerLog();
  EXPECT_EQ(c.StatValue("dead_lettered"), 1);
  // The pool is back: the autoscaler replaced the dead workers.
  EXPECT_TRUE(WaitFor([&] { return c.Workers().size() >= 2; }, seconds(30)))
      << ReadFile(c.dir().File("autoscaler.log"));
  scaler.Signal(SIGTERM);
  ASSERT_TRUE(scaler.Wait(seconds(30)).has_value());
}

}  // namespace
}  // namespace fleet::testing

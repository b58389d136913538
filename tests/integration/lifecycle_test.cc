// Starting and stopping the programs as a user does: a broker restarted on
// its ports the moment it exits, a worker's stop signals told apart by who
// sent them, and every program's exit code for a bad command line.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Regression: a broker with /metrics took about 1.3 s to exit (the embedded
// HTTP server noticed its stop only between 2 s polls), so a restart 1.5 s
// after SIGTERM could find its ports taken.
TEST(LifecycleTest, BrokerRestartedAsSoonAsItExitsGetsItsPortsBack) {
  const std::vector<std::string> ports = FixedEndpointFlags(/*with_metrics=*/true);
  Cluster c;
  c.StartBroker(ports);
  c.StartWorker("w1");
  for (int round = 0; round < 3; ++round) {
    auto s = c.Submit({"--count", "20", "--timeout-seconds", "60"});
    EXPECT_EQ(s.summary["ok"], "20") << "round " << round << ": " << s.run.output;
    // A scrape leaves a closed connection on the metrics port.
    EXPECT_TRUE(Contains(HttpGet(c.metrics()), "fleet_queue_depth")) << "round " << round;
    c.broker().Signal(SIGTERM);
    auto code = c.broker().Wait(seconds(20));
    ASSERT_TRUE(code.has_value()) << c.BrokerLog();
    EXPECT_EQ(*code, 0) << c.BrokerLog();
    // At once: StartBroker throws if the broker cannot bind and start.
    ASSERT_NO_THROW(c.StartBroker(ports)) << "round " << round;
    EXPECT_FALSE(Contains(c.BrokerLog(), "Address already in use")) << c.BrokerLog();
  }
  auto s = c.Submit({"--count", "20", "--timeout-seconds", "60"});
  EXPECT_EQ(s.summary["ok"], "20") << s.run.output;
}

class WorkerSignalTest : public ::testing::Test {
 protected:
  void SetUp() override { c_.StartBroker({"--heartbeat-ms", "250"}); }

  // Starts worker `id` (a child of this test process) and a producer of
  // one batch of `ms` milliseconds, and waits until the worker holds it.
  Process& StartBusyWorker(const std::string& id, int ms) {
    Process& w = c_.StartWorker(id, {"--handler", "sleep"});
    submit_ = std::make_unique<Process>(
        std::vector<std::string>{Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "1",
                                 "--payload", std::to_string(ms), "--timeout-seconds", "120"},
        c_.dir().File("submit.log"));
    EXPECT_TRUE(WaitFor([&] {
      for (const auto& x : c_.Workers()) {
        if (x.value("id", "") == id && x.value("held", 0) == 1) return true;
      }
      return false;
    })) << c_.WorkerLog(id);
    return w;
  }

  bool LogSays(const std::string& id, const std::string& text) {
    return WaitFor([&] { return Contains(c_.WorkerLog(id), text); });
  }

  Cluster c_;
  std::unique_ptr<Process> submit_;
};

// Regression: after kill -9 of the autoscaler its workers got the
// parent-death SIGTERM once per thread of the dying autoscaler, took the
// second as "stop now" and left their batches to be requeued. SIGTERMs from
// the process that started a worker all mean "drain".
TEST_F(WorkerSignalTest, RepeatedSigtermFromItsParentStillDrains) {
  Process& w = StartBusyWorker("w1", 1500);
  w.Signal(SIGTERM);
  ASSERT_TRUE(LogSays("w1", "draining 1 held batches")) << c_.WorkerLog("w1");
  w.Signal(SIGTERM);  // from this test process, the worker's parent
  ASSERT_TRUE(LogSays("w1", "SIGTERM again from the process that started it"))
      << c_.WorkerLog("w1");
  w.Signal(SIGTERM);
  auto code = w.Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << c_.WorkerLog("w1");
  EXPECT_EQ(*code, 0) << c_.WorkerLog("w1");
  EXPECT_TRUE(Contains(c_.WorkerLog("w1"), "drained after 1 batches")) << c_.WorkerLog("w1");
  EXPECT_FALSE(Contains(c_.WorkerLog("w1"), "second stop signal")) << c_.WorkerLog("w1");
  ASSERT_EQ(submit_->Wait(seconds(60)), 0) << submit_->ReadLog();
  EXPECT_TRUE(Contains(submit_->ReadLog(), "submitted=1 ok=1 failed=0 lost=0"));
  EXPECT_EQ(c_.StatValue("requeued"), 0);
}

// A second stop signal from anyone else still means "exit now".
TEST_F(WorkerSignalTest, SecondSigtermFromAnotherProcessStopsAtOnce) {
  Process& w = StartBusyWorker("w2", 60000);
  w.Signal(SIGTERM);
  ASSERT_TRUE(LogSays("w2", "draining 1 held batches")) << c_.WorkerLog("w2");
  // /bin/kill is a child of this test, not the worker's parent.
  RunResult k = testing::Run({"/bin/kill", "-TERM", std::to_string(w.pid())}, seconds(10),
                    c_.dir().File("kill.log"));
  EXPECT_EQ(k.exit_code, 0) << k.output;
  auto code = w.Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << c_.WorkerLog("w2");
  EXPECT_EQ(*code, 1) << c_.WorkerLog("w2");
  EXPECT_TRUE(Contains(c_.WorkerLog("w2"), "second stop signal")) << c_.WorkerLog("w2");
}

TEST_F(WorkerSignalTest, SecondSigintStopsAtOnce) {
  Process& w = StartBusyWorker("w3", 60000);
  w.Signal(SIGINT);
  ASSERT_TRUE(LogSays("w3", "draining 1 held batches")) << c_.WorkerLog("w3");
  w.Signal(SIGINT);
  auto code = w.Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << c_.WorkerLog("w3");
  EXPECT_EQ(*code, 1) << c_.WorkerLog("w3");
}

// A second live process with a worker's id is refused (the first keeps its
// batch and finishes it); once the first leaves, the second gets in.
TEST(LifecycleTest, SecondWorkerWithALiveWorkersIdIsRefusedUntilTheFirstLeaves) {
  Cluster c;
  c.StartBroker({"--heartbeat-ms", "250"});
  Process& first = c.StartWorker("twin", {"--handler", "sleep"});
  ASSERT_TRUE(WaitFor([&] { return c.Workers().size() == 1; }));
  Process submit({Bin("fleet-submit"), "--broker", c.frontend(), "--count", "1", "--payload",
                  "1500", "--timeout-seconds", "60"},
                 c.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    return w.size() == 1 && w[0].value("held", 0) == 1;
  }));
  // The second one: refused while the first is alive.
  Process second({Bin("fleet-worker"), "--broker", c.backend(), "--id", "twin", "--handler",
                  "echo"},
                 c.dir().File("second.log"));
  ASSERT_TRUE(WaitFor([&] { return Contains(c.BrokerLog(), "refused a HELLO for worker twin"); }))
      << c.BrokerLog();
  EXPECT_TRUE(WaitFor([&] { return Contains(second.ReadLog(), "duplicate_worker"); }))
      << second.ReadLog();
  EXPECT_GE(c.StatValue("duplicate_worker_refusals"), 1);
  ASSERT_EQ(submit.Wait(seconds(60)), 0) << submit.ReadLog();
  EXPECT_TRUE(Contains(submit.ReadLog(), "ok=1 failed=0 lost=0")) << submit.ReadLog();
  EXPECT_EQ(c.StatValue("requeued"), 0);  // the first kept its batch
  // The first leaves: the second, retrying, gets in and works.
  first.Signal(SIGTERM);
  ASSERT_EQ(first.Wait(seconds(30)), std::optional<int>(0));
  auto s = c.Submit({"--count", "5", "--timeout-seconds", "60"});
  EXPECT_EQ(s.summary["ok"], "5") << s.run.output << second.ReadLog();
}

// A worker killed and restarted at once under the same id (its old
// connection dead, not yet timed out) gets in and its batch runs again.
TEST(LifecycleTest, WorkerRestartedAtOnceUnderItsIdGetsIn) {
  Cluster c;
  c.StartBroker({"--heartbeat-ms", "1000"});  // liveness 3 s: longer than the restart
  Process& old = c.StartWorker("phoenix", {"--handler", "sleep"});
  ASSERT_TRUE(WaitFor([&] { return c.Workers().size() == 1; }));
  // Long enough that it is still running when the kill lands, however
  // slowly this machine answers fleet-ctl (a 300 ms one could finish first
  // under the sanitizers).
  Process submit({Bin("fleet-submit"), "--broker", c.frontend(), "--count", "1", "--payload",
                  "3000", "--timeout-seconds", "60"},
                 c.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    return w.size() == 1 && w[0].value("held", 0) == 1;
  }));
  old.Signal(SIGKILL);
  ASSERT_TRUE(old.Wait(seconds(10)).has_value());
  Process again({Bin("fleet-worker"), "--broker", c.backend(), "--id", "phoenix", "--handler",
                 "sleep"},
                c.dir().File("again.log"));
  ASSERT_EQ(submit.Wait(seconds(60)), 0) << submit.ReadLog() << again.ReadLog();
  EXPECT_TRUE(Contains(submit.ReadLog(), "ok=1 failed=0 lost=0")) << submit.ReadLog();
  EXPECT_EQ(c.StatValue("requeued"), 1);
  auto w = c.Workers();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].value("id", ""), "phoenix");
  EXPECT_EQ(w[0].value("processed", 0), 1);
}

// Every program: --help exits 0, an unknown flag or a bad value exits 2
// with a message that names the flag.
TEST(LifecycleTest, EveryProgramExitsTwoOnABadCommandLine) {
  TempDir dir;
  int n = 0;
  for (const char* program : {"fleet-broker", "fleet-worker", "fleet-autoscaler",
                              "fleet-submit", "fleet-ctl", "fleet-autoscaler-sim"}) {
    const std::string log = dir.File("run-" + std::to_string(++n));
    RunResult help = testing::Run({Bin(program), "--help"}, seconds(20), log + "-help");
    EXPECT_EQ(help.exit_code, 0) << program << ": " << help.output;
    EXPECT_TRUE(Contains(help.output, "Options:")) << program << ": " << help.output;
    std::vector<std::string> argv{Bin(program), "--no-such-flag"};
    if (std::string(program) == "fleet-ctl") argv.insert(argv.begin() + 1, "workers");
    RunResult unknown = testing::Run(argv, seconds(20), log + "-unknown");
    EXPECT_EQ(unknown.exit_code, 2) << program << ": " << unknown.output;
    EXPECT_TRUE(Contains(unknown.output, "--no-such-flag")) << program << ": " << unknown.output;
  }
  for (const auto& [program, flag] : std::vector<std::pair<std::string, std::string>>{
           {"fleet-broker", "--max-attempts"},
           {"fleet-worker", "--concurrency"},
           {"fleet-autoscaler", "--poll-ms"},
           {"fleet-submit", "--inflight"}}) {
    RunResult bad = testing::Run({Bin(program), flag, "0"}, seconds(20), dir.File(program + "-bad"));
    EXPECT_EQ(bad.exit_code, 2) << program << " " << flag << ": " << bad.output;
    EXPECT_TRUE(Contains(bad.output, flag)) << program << ": " << bad.output;
  }
  // Settings refused before start: contradictory flags, a key file that is
  // not there.
  const std::string missing = dir.File("no-such.key");
  const std::vector<std::vector<std::string>> refused = {
      {"fleet-broker", "--max-batch-bytes", "4096", "--max-message-bytes", "2048"},
      {"fleet-broker", "--curve-secret-key", missing, "--curve-producers", missing,
       "--curve-workers", missing, "--curve-control", missing},
      {"fleet-autoscaler", "--launcher", "command", "--metrics", ""},
      {"fleet-autoscaler", "--curve-server-key", missing, "--curve-key", missing, "--metrics",
       ""},
      {"fleet-worker", "--curve-server-key", missing, "--curve-key", missing},
      {"fleet-submit", "--curve-server-key", missing, "--curve-key", missing},
      {"fleet-ctl", "--curve-server-key", missing, "--curve-key", missing, "stats"}};
  for (const auto& args : refused) {
    std::vector<std::string> argv{Bin(args[0])};
    argv.insert(argv.end(), args.begin() + 1, args.end());
    RunResult r = testing::Run(argv, seconds(20), dir.File("refused-" + std::to_string(++n)));
    EXPECT_EQ(r.exit_code, 2) << args[0] << " " << args[1] << ": " << r.output;
  }
}

}  // namespace
}  // namespace fleet::testing

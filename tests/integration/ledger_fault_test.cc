// Fault scenarios checked by the one ledger (tests/support/ledger.h): real
// broker, workers, autoscaler and fleet-submit processes on 127.0.0.1. The
// workers run an exec handler that logs every execution and echoes the
// payload, so the ledger can count runs and check every value. Short
// versions; `make soak` runs the long mixed one.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <set>

#include "tests/support/cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/ledger.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class LedgerFaultTest : public ::testing::Test {
 protected:
  // A worker running the logging echo handler; `sleep_ms` per batch.
  Process& StartWorker(const std::string& id, int concurrency, int sleep_ms,
                       std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--handler", "exec", "--exec",
                                      LoggingEchoCommand(executions_, sleep_ms),
                                      "--concurrency", std::to_string(concurrency)};
    // The programs refuse a flag given twice: the default only if not in `extra`.
    if (std::find(extra.begin(), extra.end(), "--heartbeat-ms") == extra.end()) {
      flags.insert(flags.end(), {"--heartbeat-ms", "200"});
    }
    flags.insert(flags.end(), extra.begin(), extra.end());
    return c_.StartWorker(id, flags);
  }

  // fleet-submit in the background with its own ledger.
  std::unique_ptr<Process> StartSubmit(int count, int inflight,
                                       std::vector<std::string> extra = {}) {
    const std::string n = std::to_string(ledgers_.size() + 1);
    ledgers_.push_back(c_.dir().File("ledger-" + n + ".txt"));
    std::vector<std::string> argv = {Bin("fleet-submit"), "--broker", c_.frontend(),
                                     "--count", std::to_string(count), "--size", "64",
                                     "--inflight", std::to_string(inflight),
                                     "--ledger", ledgers_.back()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Process>(argv, c_.dir().File("submit-" + n + ".log"));
  }

  static void ExpectFinishedClean(Process& submit, seconds timeout = seconds(180)) {
    auto code = submit.Wait(timeout);
    ASSERT_TRUE(code.has_value()) << "fleet-submit still running: " << submit.ReadLog();
    EXPECT_EQ(*code, 0) << submit.ReadLog();
  }

  LedgerReport ExpectLedgerPasses(const LedgerOptions& options = {}) {
    LedgerReport r = CheckLedger(ledgers_, {executions_}, options);
    EXPECT_TRUE(r.passed) << r.Describe() << "\n" << c_.BrokerLog();
    std::printf("%s\n", r.Describe().c_str());
    return r;
  }

  double Held(const std::string& id) {
    for (const auto& w : c_.Workers()) {
      if (w.value("id", "") == id) return w.at("held").get<double>();
    }
    return -1;
  }
  bool Listed(const std::string& id) { return Held(id) >= 0; }

  Cluster c_;
  std::string executions_ = c_.dir().File("executions.log");
  std::vector<std::string> ledgers_;
};

TEST_F(LedgerFaultTest, KillNineOneThenThreeOfEightWorkersWithAThousandInFlight) {
  c_.StartBroker({"--heartbeat-ms", "200", "--max-attempts", "3"});
  for (int i = 1; i <= 8; ++i) StartWorker("k" + std::to_string(i), 2, 20);
  auto submit = StartSubmit(1500, 1000);
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("submitted") >= 1000 && Held("k1") > 0; }))
      << c_.BrokerLog();
  c_.worker("k1").Signal(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return !Listed("k1"); })) << c_.BrokerLog();
  const double after_one = c_.StatValue("requeued");
  EXPECT_GT(after_one, 0);
  ASSERT_TRUE(WaitFor([&] { return Held("k2") > 0 && Held("k3") > 0 && Held("k4") > 0; }));
  for (const char* id : {"k2", "k3", "k4"}) c_.worker(id).Signal(SIGKILL);
  ExpectFinishedClean(*submit);
  LedgerReport r = ExpectLedgerPasses();
  EXPECT_EQ(r.submitted, 1500u);
  // A killed worker that had finished what it held before the kill does
  // not hold up the run: it is declared dead after liveness, maybe later.
  EXPECT_TRUE(WaitFor([&] { return c_.StatValue("workers_dead") == 4; }))
      << c_.StatValue("workers_dead");
  EXPECT_GT(c_.StatValue("requeued"), after_one);
  // The killed workers' batches ran again elsewhere (logged twice at most
  // here: each batch was on at most one of the two kills).
  EXPECT_GT(r.reexecuted, 0u) << r.Describe();
}

TEST_F(LedgerFaultTest, StoppedWorkerPastLivenessIsReplacedAndItsLateResultsCountOnce) {
  c_.StartBroker({"--heartbeat-ms", "100", "--liveness", "3"});
  StartWorker("s1", 2, 300, {"--heartbeat-ms", "100"});
  StartWorker("s2", 2, 50, {"--heartbeat-ms", "100"});
  auto submit = StartSubmit(120, 60);
  ASSERT_TRUE(WaitFor([&] { return Held("s1") > 0; }));
  c_.worker("s1").Signal(SIGSTOP);
  ASSERT_TRUE(WaitFor([&] { return !Listed("s1"); })) << c_.BrokerLog();
  EXPECT_GT(c_.StatValue("requeued"), 0);
  // Its batches run elsewhere first, then it wakes up and reports them too.
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("completed_ok") >= 100; }));
  c_.worker("s1").Signal(SIGCONT);
  ExpectFinishedClean(*submit);
  ExpectLedgerPasses();
  EXPECT_TRUE(WaitFor([&] { return Listed("s1"); })) << c_.WorkerLog("s1");
}

TEST_F(LedgerFaultTest, RetiringWorkersHoldingNoneOneOrAllSlotsAndAOneSecondGraceLosesNothing) {
  // A 1.5 s liveness: a sanitizer build on a loaded machine can miss three
  // 200 ms heartbeats, and "long" must stay listed until its SIGKILL.
  c_.StartBroker({"--heartbeat-ms", "500", "--retire-linger-ms", "0"});
  // main: a steady backlog; solo: one long batch; none: nothing at all;
  // slow: two batches longer than the grace.
  StartWorker("all", 2, 100, {"--queues", "main"});
  StartWorker("one", 2, 6000, {"--queues", "solo"});
  StartWorker("zero", 2, 100, {"--queues", "none"});
  // 30 s: well past the retire calls, the grace and the checks even when
  // each control call takes a second or more (a sanitizer build under load).
  StartWorker("long", 2, 30000, {"--queues", "slow"});
  StartWorker("m1", 2, 100, {"--queues", "main"});
  StartWorker("m2", 2, 100, {"--queues", "main"});
  auto main_load = StartSubmit(600, 50, {"--queue", "main"});
  auto solo = StartSubmit(1, 1, {"--queue", "solo"});
  auto slow = StartSubmit(2, 2, {"--queue", "slow"});
  ASSERT_TRUE(WaitFor([&] {
    return Held("all") == 2 && Held("one") == 1 && Held("zero") == 0 && Held("long") == 2;
  })) << c_.Workers().dump();
  for (const char* id : {"zero", "one", "all", "long"}) {
    RunResult r = c_.Ctl({"retire", id});
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  // The launcher's stop with a 1 s grace: SIGTERM (drain), then SIGKILL a
  // second later while it still holds its 30 s batches.
  usleep(1000 * 1000);
  c_.worker("long").Signal(SIGTERM);
  usleep(1000 * 1000);
  // Its 30 s batches are still running (a control call that times out on a
  // loaded machine is asked again; the batches outlast these few seconds).
  ASSERT_TRUE(WaitFor([&] { return Held("long") > 0; }, seconds(4)))
      << "the long batches should still be running";
  c_.worker("long").Signal(SIGKILL);
  // The drained ones exit by themselves, status 0.
  for (const char* id : {"zero", "one", "all"}) {
    auto code = c_.worker(id).Wait(seconds(60));
    ASSERT_TRUE(code.has_value()) << id << ": " << c_.WorkerLog(id);
    EXPECT_EQ(*code, 0) << c_.WorkerLog(id);
  }
  // Somebody has to take the SIGKILLed worker's slow batches.
  StartWorker("long2", 2, 500, {"--queues", "slow"});
  ExpectFinishedClean(*main_load);
  ExpectFinishedClean(*solo);
  ExpectFinishedClean(*slow);
  LedgerReport r = ExpectLedgerPasses();
  EXPECT_EQ(r.submitted, 603u);
  const std::string page = HttpGet(c_.metrics());
  EXPECT_NE(page.find("\nfleet_dispatched_to_retiring_total 0\n"), std::string::npos) << page;
  EXPECT_EQ(c_.StatValue("workers_dead"), 1);
  // The SIGKILLed worker's two batches ran twice, nothing else did.
  EXPECT_EQ(r.reexecuted, 2u) << r.Describe();
}

// Durable mode: the broker is SIGKILLed under load and started again on the
// same ports and data directory; producers and workers find it by
// themselves and every accepted batch completes.
TEST_F(LedgerFaultTest, DurableBrokerKilledUnderLoadCompletesEveryAcceptedBatch) {
  std::vector<std::string> flags = FixedEndpointFlags();
  flags.insert(flags.end(), {"--heartbeat-ms", "200", "--data-dir", c_.dir().File("data")});
  c_.StartBroker(flags);
  for (int i = 1; i <= 3; ++i) StartWorker("d" + std::to_string(i), 2, 10);
  auto first = StartSubmit(600, 300, {"--resend-after-seconds", "1"});
  auto second = StartSubmit(600, 300, {"--resend-after-seconds", "1"});
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("completed_ok") >= 100; }));
  c_.broker().Signal(SIGKILL);
  ASSERT_TRUE(c_.broker().Wait(seconds(10)).has_value());
  c_.StartBroker(flags);
  EXPECT_NE(c_.BrokerLog().find("unfinished batches back in their queues"), std::string::npos)
      << c_.BrokerLog();
  ExpectFinishedClean(*first);
  ExpectFinishedClean(*second);
  // Attempts restart after a replay, so a batch may run once more than the
  // broker's count: still at most twice here (one kill).
  LedgerOptions options;
  options.max_attempts = 2;
  LedgerReport r = ExpectLedgerPasses(options);
  EXPECT_EQ(r.submitted, 1200u);
}

}  // namespace
}  // namespace fleet::testing

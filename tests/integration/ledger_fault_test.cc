// Fault scenarios checked by the one ledger (tests/support/ledger.h): real
// broker, workers, autoscaler and fleet-submit processes on 127.0.0.1. The
// workers run an exec handler that logs every execution and echoes the
// payload, so the ledger can count runs and check every value. Short
// versions; `make soak` runs the long mixed one.
#include <gtest/gtest.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
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
                                     "--count", std::to_string(count),
                                     "--inflight", std::to_string(inflight),
                                     "--ledger", ledgers_.back()};
    if (std::find(extra.begin(), extra.end(), "--size") == extra.end()) {
      argv.insert(argv.end(), {"--size", "64"});
    }
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

// The files of the journal in `dir`, newest last.
std::vector<std::string> JournalFiles(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("journal-", 0) == 0) out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A file system of `size` (tmpfs) at a new directory; empty when this
// machine does not let the test mount one (not root).
class SmallDisk {
 public:
  SmallDisk(const std::string& path, const std::string& size) : path_(path) {
    ::mkdir(path.c_str(), 0755);
    const std::string cmd =
        "mount -t tmpfs -o size=" + size + " fleet-test-disk " + path + " 2>/dev/null";
    mounted_ = std::system(cmd.c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) std::system(("umount -l " + path_ + " 2>/dev/null").c_str());
  }
  bool mounted() const { return mounted_; }

 private:
  std::string path_;
  bool mounted_ = false;
};

// Regression: on a full disk the broker exited at its first failed write,
// left the producers without an answer, and died again on every restart.
// Here it runs on a 2 MiB disk with 1 MiB segments: it fills the disk,
// refuses new batches with disk_full (the producer waits them out), is
// killed and restarted on the full disk, and serves what it holds; with a
// worker draining, finished segments are deleted and it accepts again by
// itself, and then runs 400 more batches of 10 KB (twice the disk).
TEST_F(LedgerFaultTest, DurableBrokerOnATwoMiBDiskRefusesWithDiskFullAndRunsTwiceTheDisk) {
  SmallDisk disk(c_.dir().File("disk"), "2m");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a 2 MiB tmpfs here (needs root)";
  const std::string data = c_.dir().File("disk") + "/data";
  std::vector<std::string> flags = FixedEndpointFlags();
  flags.insert(flags.end(), {"--heartbeat-ms", "200", "--data-dir", data,
                             "--journal-segment-mb", "1"});
  c_.StartBroker(flags);
  auto first = StartSubmit(400, 400, {"--size", "10000", "--resend-after-seconds", "1"});
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("rejected_disk_full") > 0; }, seconds(60)))
      << c_.BrokerLog() << first->ReadLog() << c_.Stats().dump();
  EXPECT_EQ(c_.StatValue("journal_disk_full"), 1.0);
  const double accepted = c_.StatValue("submitted");
  EXPECT_GT(accepted, 100.0);
  EXPECT_LT(accepted, 400.0);
  EXPECT_TRUE(c_.broker().Running());
  const std::string log = c_.BrokerLog();
  std::size_t episodes = 0;
  for (std::size_t at = log.find("the disk is full"); at != std::string::npos;
       at = log.find("the disk is full", at + 1)) {
    ++episodes;
  }
  // Once per episode, not per batch (a burst larger than the space left
  // can make a second, short one).
  EXPECT_GE(episodes, 1u) << log;
  EXPECT_LE(episodes, 5u) << log;

  // Killed and started again on the full disk: it starts, with what it held.
  c_.broker().Signal(SIGKILL);
  ASSERT_TRUE(c_.broker().Wait(seconds(10)).has_value());
  c_.StartBroker(flags);
  EXPECT_EQ(c_.StatValue("queued"), accepted) << c_.BrokerLog();

  StartWorker("drain", 2, 0);
  ExpectFinishedClean(*first);
  EXPECT_NE(c_.BrokerLog().find("accepting new batches"), std::string::npos) << c_.BrokerLog();
  EXPECT_EQ(c_.StatValue("journal_disk_full"), 0.0);
  auto second = StartSubmit(400, 64, {"--size", "10000", "--resend-after-seconds", "1"});
  ExpectFinishedClean(*second);
  LedgerOptions options;
  options.max_attempts = 2;  // one broker kill
  LedgerReport r = ExpectLedgerPasses(options);
  EXPECT_EQ(r.submitted, 800u);
  EXPECT_EQ(r.ok, 800u);
  EXPECT_TRUE(c_.broker().Running());
}

// A batch parked in a queue no worker serves pins the oldest segment while
// thousands of others pass: the broker compacts (on its own thread), the
// journal stays small, nothing is lost, and after a restart the parked
// batch is still there, with the others not run again.
TEST_F(LedgerFaultTest, DurableBrokerCompactsAroundAParkedBatchUnderLoad) {
  const std::string data = c_.dir().File("data");
  std::vector<std::string> flags = FixedEndpointFlags();
  flags.insert(flags.end(), {"--heartbeat-ms", "200", "--data-dir", data,
                             "--journal-segment-mb", "1"});
  c_.StartBroker(flags);
  auto parked = StartSubmit(1, 1, {"--queue", "parked", "--resend-after-seconds", "1"});
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("submitted") >= 1; }));
  StartWorker("w", 4, 0, {"--queues", "default"});
  auto load = StartSubmit(1000, 200, {"--size", "5000", "--resend-after-seconds", "1"});
  ExpectFinishedClean(*load);
  ASSERT_TRUE(WaitFor([&] {
    return c_.BrokerLog().find("journal: compacted segments") != std::string::npos;
  })) << c_.BrokerLog();
  std::uint64_t bytes = 0;
  for (const std::string& f : JournalFiles(data)) bytes += ReadFile(f).size();
  EXPECT_LT(bytes, 3u << 20) << "5 MB went through; the journal kept it";
  c_.broker().Signal(SIGKILL);
  ASSERT_TRUE(c_.broker().Wait(seconds(10)).has_value());
  c_.StartBroker(flags);
  EXPECT_EQ(c_.StatValue("queued"), 1.0) << c_.BrokerLog();
  StartWorker("p", 1, 0, {"--queues", "parked"});
  ExpectFinishedClean(*parked);
  LedgerOptions options;
  options.max_attempts = 1;  // nothing ran twice
  LedgerReport r = ExpectLedgerPasses(options);
  EXPECT_EQ(r.submitted, 1001u);
}

// Regression: a byte flipped in the last complete record was taken for a
// torn write and dropped, silently losing an acknowledged batch. Now the
// start stops with the file and offset; --journal-recover starts past it,
// and the producer, which never got that batch's result, sends it again.
TEST_F(LedgerFaultTest, DamagedJournalStopsTheStartAndRecoverGoesOnWithoutLosingAnAnsweredBatch) {
  const std::string data = c_.dir().File("data");
  std::vector<std::string> flags = FixedEndpointFlags();
  flags.insert(flags.end(), {"--heartbeat-ms", "200", "--data-dir", data});
  c_.StartBroker(flags);
  auto submit = StartSubmit(50, 50, {"--resend-after-seconds", "1"});
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("submitted") >= 50; }));
  c_.broker().Signal(SIGTERM);
  ASSERT_TRUE(c_.broker().Wait(seconds(10)).has_value());
  std::string newest;
  for (const std::string& f : JournalFiles(data)) {
    if (!ReadFile(f).empty()) newest = f;
  }
  ASSERT_FALSE(newest.empty());
  std::string bytes = ReadFile(newest);
  bytes.back() ^= 0x40;  // in the last record's payload
  std::ofstream(newest, std::ios::binary | std::ios::trunc) << bytes;

  std::vector<std::string> argv = {Bin("fleet-broker")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"--metrics", ""});
  RunResult refused = fleet::testing::Run(argv, seconds(20), c_.dir().File("refused.log"));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("failing its checksum at offset"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find(newest), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("--journal-recover"), std::string::npos) << refused.output;

  flags.push_back("--journal-recover");
  c_.StartBroker(flags);
  EXPECT_NE(c_.BrokerLog().find("--journal-recover: dropped"), std::string::npos)
      << c_.BrokerLog();
  StartWorker("w", 2, 0);
  ExpectFinishedClean(*submit);
  LedgerReport r = ExpectLedgerPasses();
  EXPECT_EQ(r.submitted, 50u);
}

}  // namespace
}  // namespace fleet::testing

// End-to-end behaviour of the data path: real broker, workers and CLIs over
// tcp://127.0.0.1 on ephemeral ports. Waits are bounded conditions.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <set>

#include "tests/support/cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

// Every submitted id has exactly one result line; returns outcome counts.
std::map<std::string, int> CheckEachResultOnce(const Cluster::Submitted& s, size_t want) {
  std::set<std::string> ids;
  std::map<std::string, int> outcomes;
  for (const auto& r : s.results) {
    EXPECT_TRUE(ids.insert(r.at("id").get<std::string>()).second)
        << "result delivered twice: " << r.dump();
    ++outcomes[r.at("outcome").get<std::string>()];
  }
  EXPECT_EQ(ids.size(), want);
  return outcomes;
}

double WorkerField(Cluster& c, const std::string& id, const std::string& field) {
  for (const auto& w : c.Workers()) {
    if (w.value("id", "") == id) return w.at(field).get<double>();
  }
  return -1;
}

bool WorkerListed(Cluster& c, const std::string& id) {
  for (const auto& w : c.Workers()) {
    if (w.value("id", "") == id) return true;
  }
  return false;
}

TEST(DataPathTest, TwentyThousandBatchesThroughFourWorkersEachResultOnce) {
  Cluster c;
  c.StartBroker();
  for (int i = 1; i <= 4; ++i) c.StartWorker("w" + std::to_string(i), {"--concurrency", "4"});
  auto s = c.Submit({"--count", "20000", "--size", "100", "--inflight", "4000"}, seconds(240));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  EXPECT_EQ(s.summary["submitted"], "20000");
  EXPECT_EQ(s.summary["ok"], "20000");
  EXPECT_EQ(s.summary["lost"], "0");
  auto outcomes = CheckEachResultOnce(s, 20000);
  EXPECT_EQ(outcomes["ok"], 20000);
  EXPECT_EQ(c.StatValue("completed_ok"), 20000);
  EXPECT_EQ(c.StatValue("duplicates"), 0);
}

TEST(DataPathTest, KillNineOneOfThreeWorkersEveryBatchStillCompletesOnce) {
  Cluster c;
  c.StartBroker({"--heartbeat-ms", "200"});
  for (auto id : {"k1", "k2", "k3"}) c.StartWorker(id, {"--handler", "sleep", "--concurrency", "4"});
  // 300 x 100 ms on 12 slots: about 2.5 s of work, so the kill lands mid-run
  // even when a control call (the held check) is slow.
  Process submit({Bin("fleet-submit"), "--broker", c.frontend(), "--count", "300",
                  "--payload", "100", "--inflight", "300", "--output", c.dir().File("out.jsonl")},
                 c.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] { return WorkerField(c, "k2", "held") > 0; }));
  c.worker("k2").Signal(SIGKILL);
  auto code = submit.Wait(seconds(120));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  std::string log = submit.ReadLog();
  EXPECT_NE(log.find("submitted=300 ok=300 failed=0 lost=0"), std::string::npos) << log;
  Cluster::Submitted s;
  std::ifstream in(c.dir().File("out.jsonl"));
  std::string line;
  while (std::getline(in, line)) s.results.push_back(nlohmann::json::parse(line));
  auto outcomes = CheckEachResultOnce(s, 300);
  EXPECT_EQ(outcomes["ok"], 300);
  EXPECT_GT(c.StatValue("requeued"), 0) << c.BrokerLog();
}

TEST(DataPathTest, StoppedWorkerIsDeclaredDeadAndItsLateResultsAreNotDeliveredTwice) {
  Cluster c;
  c.StartBroker({"--heartbeat-ms", "100", "--liveness", "3"});
  c.StartWorker("s1", {"--handler", "sleep", "--concurrency", "2"});
  c.StartWorker("s2", {"--handler", "sleep", "--concurrency", "2"});
  Process submit({Bin("fleet-submit"), "--broker", c.frontend(), "--count", "40",
                  "--payload", "150", "--inflight", "40", "--output", c.dir().File("out.jsonl")},
                 c.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] { return WorkerField(c, "s1", "held") > 0; }));
  c.worker("s1").Signal(SIGSTOP);
  ASSERT_TRUE(WaitFor([&] { return !WorkerListed(c, "s1"); })) << c.BrokerLog();
  EXPECT_GT(c.StatValue("requeued"), 0);
  EXPECT_GT(c.StatValue("workers_dead"), 0);
  c.worker("s1").Signal(SIGCONT);
  auto code = submit.Wait(seconds(120));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  Cluster::Submitted s;
  std::ifstream in(c.dir().File("out.jsonl"));
  std::string line;
  while (std::getline(in, line)) s.results.push_back(nlohmann::json::parse(line));
  auto outcomes = CheckEachResultOnce(s, 40);
  EXPECT_EQ(outcomes["ok"], 40);
  // The woken worker comes back and registers again.
  EXPECT_TRUE(WaitFor([&] { return WorkerListed(c, "s1"); })) << c.WorkerLog("s1");
}

TEST(DataPathTest, RetiredBusyWorkerFinishesGetsNothingNewExitsZeroAndStaysBlacklisted) {
  Cluster c;
  c.StartBroker();
  c.StartWorker("r1", {"--handler", "sleep", "--concurrency", "2"});
  Process submit({Bin("fleet-submit"), "--broker", c.frontend(), "--count", "4",
                  "--payload", "1500", "--inflight", "4", "--output", c.dir().File("out.jsonl")},
                 c.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] { return WorkerField(c, "r1", "held") == 2; }));
  RunResult refused = c.Ctl({"retire", "r1", "--if-idle"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("busy"), std::string::npos) << refused.output;
  RunResult retired = c.Ctl({"retire", "r1"});
  EXPECT_EQ(retired.exit_code, 0) << retired.output;
  c.StartWorker("r2", {"--handler", "sleep", "--concurrency", "2"});
  auto code = c.worker("r1").Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << c.WorkerLog("r1");
  EXPECT_EQ(*code, 0) << c.WorkerLog("r1");
  auto scode = submit.Wait(seconds(60));
  ASSERT_TRUE(scode.has_value());
  EXPECT_EQ(*scode, 0) << submit.ReadLog();
  EXPECT_NE(submit.ReadLog().find("ok=4 failed=0 lost=0"), std::string::npos) << submit.ReadLog();
  // r1 ran only the two it held; the other two went to r2.
  EXPECT_EQ(WorkerField(c, "r2", "processed"), 2);
  EXPECT_EQ(c.StatValue("completed_failed"), 0);
  // The retired id comes back within the TTL: told to stop, gets no work.
  Process again({Bin("fleet-worker"), "--broker", c.backend(), "--id", "r1"},
                c.dir().File("worker-r1-again.log"));
  auto again_code = again.Wait(seconds(20));
  ASSERT_TRUE(again_code.has_value());
  EXPECT_EQ(*again_code, 0);
  EXPECT_NE(again.ReadLog().find("blacklisted"), std::string::npos) << again.ReadLog();
  EXPECT_GE(c.StatValue("blacklist_refusals"), 1);
}

TEST(DataPathTest, QueueFullIsRejectedClearlyAndClientRetriesCompleteEveryBatch) {
  Cluster c;
  c.StartBroker({"--max-queue", "5"});
  c.StartWorker("q1", {"--concurrency", "2"});
  auto s = c.Submit({"--count", "2000", "--inflight", "500"}, seconds(120));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  EXPECT_EQ(s.summary["ok"], "2000");
  EXPECT_EQ(s.summary["lost"], "0");
  CheckEachResultOnce(s, 2000);
  EXPECT_GT(c.StatValue("rejected_queue_full"), 0);
}

TEST(DataPathTest, ExecHandlerReportsFailureWithReasonAndKillsHangingCommandAtTimeout) {
  Cluster c;
  c.StartBroker();
  c.StartWorker("e1", {"--handler", "exec", "--concurrency", "3", "--batch-timeout", "1",
                       "--exec",
                       "read p; case $p in fail) echo broken-input >&2; exit 3;; "
                       "hang) sleep 60;; *) echo out-$p;; esac"});
  std::string input = c.dir().File("input.txt");
  std::ofstream(input) << "fail\nhang\nfine\n";
  auto s = c.Submit({"--input", input}, seconds(60));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  EXPECT_EQ(s.summary["ok"], "1");
  EXPECT_EQ(s.summary["failed"], "2");
  ASSERT_EQ(s.results.size(), 3u);
  int seen = 0;
  for (const auto& r : s.results) {
    std::string error = r.value("error", "");
    if (r.value("outcome", "") == "ok") {
      EXPECT_EQ(r.value("result", ""), "out-fine\n");
      ++seen;
    } else if (error.find("broken-input") != std::string::npos) {
      ++seen;
    } else if (error.find("timed out") != std::string::npos) {
      ++seen;
    } else {
      ADD_FAILURE() << "unexpected result " << r.dump();
    }
  }
  EXPECT_EQ(seen, 3);
}

}  // namespace
}  // namespace fleet::testing

namespace fleet::testing {
namespace {

// A fleet-submit run in the background (--output `out`) ends with every one
// of its `n` batches ok and each result in `out` once.
void ExpectAllOkEachOnce(Process& submit, const std::string& out, int n) {
  auto code = submit.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  const std::string want = "submitted=" + std::to_string(n) + " ok=" + std::to_string(n) +
                           " failed=0 lost=0";
  EXPECT_NE(submit.ReadLog().find(want), std::string::npos) << submit.ReadLog();
  Cluster::Submitted s;
  std::ifstream in(out);
  std::string line;
  while (std::getline(in, line)) s.results.push_back(nlohmann::json::parse(line));
  CheckEachResultOnce(s, n);
}

// Picks the broker's ports once, so a restarted broker listens where the
// producer and workers reconnect.
TEST(DataPathTest, BrokerRestartMidRunLosesNoBatchWorkersReRegisterProducerResends) {
  std::vector<std::string> flags = FixedEndpointFlags();
  const std::string fe = flags[1];
  flags.insert(flags.end(), {"--heartbeat-ms", "200"});
  Cluster c;
  c.StartBroker(flags);
  c.StartWorker("b1", {"--handler", "sleep", "--concurrency", "4", "--heartbeat-ms", "200"});
  c.StartWorker("b2", {"--handler", "sleep", "--concurrency", "4", "--heartbeat-ms", "200"});
  // 200 x 100 ms on 8 slots: about 2.5 s of work, so the broker dies mid-run.
  Process submit({Bin("fleet-submit"), "--broker", fe, "--count", "200", "--payload", "100",
                  "--inflight", "200", "--resend-after-seconds", "1",
                  "--output", c.dir().File("out.jsonl")},
                 c.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] { return c.StatValue("completed_ok") >= 20; }));
  c.broker().Signal(SIGKILL);
  ASSERT_TRUE(c.broker().Wait(std::chrono::seconds(10)).has_value());
  c.StartBroker(flags);
  ExpectAllOkEachOnce(submit, c.dir().File("out.jsonl"), 200);
  // The new broker got only what the old one had not finished: re-sent.
  double resent = c.StatValue("submitted");
  EXPECT_GT(resent, 0);
  EXPECT_LT(resent, 200);
  // Both workers found the new broker on their own.
  EXPECT_TRUE(WaitFor([&] { return WorkerListed(c, "b1") && WorkerListed(c, "b2"); }))
      << c.WorkerLog("b1");
}

// The producer notices the reconnect itself: with --resend-after-seconds 600
// its timer cannot fire within this test's waits, so only the re-send on
// reconnect can bring back what the killed in-memory broker lost.
TEST(DataPathTest, InMemoryBrokerKilledProducerResendsOnReconnectNotOnTimer) {
  std::vector<std::string> flags = FixedEndpointFlags();
  const std::string fe = flags[1];
  flags.insert(flags.end(), {"--heartbeat-ms", "200"});
  Cluster c;
  c.StartBroker(flags);
  EXPECT_NE(c.BrokerLog().find("in-memory queue"), std::string::npos) << c.BrokerLog();
  c.StartWorker("m1", {"--handler", "sleep", "--concurrency", "4", "--heartbeat-ms", "200"});
  c.StartWorker("m2", {"--handler", "sleep", "--concurrency", "4", "--heartbeat-ms", "200"});
  Process submit({Bin("fleet-submit"), "--broker", fe, "--count", "200", "--payload", "50",
                  "--inflight", "200", "--resend-after-seconds", "600",
                  "--output", c.dir().File("out.jsonl")},
                 c.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] { return c.StatValue("completed_ok") >= 20; }));
  c.broker().Signal(SIGKILL);
  ASSERT_TRUE(c.broker().Wait(std::chrono::seconds(10)).has_value());
  c.StartBroker(flags);
  // Waits 120 s at most, well before the 600 s timer.
  ExpectAllOkEachOnce(submit, c.dir().File("out.jsonl"), 200);
  const std::string log = submit.ReadLog();
  const std::string said = "reconnected to broker; re-sending ";
  auto at = log.find(said);
  ASSERT_NE(at, std::string::npos) << log;
  const int resent = std::atoi(log.c_str() + at + said.size());
  EXPECT_GT(resent, 0) << log;
  EXPECT_LT(resent, 200) << log;  // not those whose result had come
  EXPECT_EQ(log.find(said, at + 1), std::string::npos) << "one reconnect, one line: " << log;
  // The new broker ran what the producer re-sent, nothing more.
  EXPECT_EQ(c.StatValue("submitted"), resent) << c.BrokerLog();
  EXPECT_TRUE(WaitFor([&] { return WorkerListed(c, "m1") && WorkerListed(c, "m2"); }))
      << c.WorkerLog("m1");
}

}  // namespace
}  // namespace fleet::testing

namespace fleet::testing {
namespace {

TEST(DataPathTest, DurableBrokerRefusesBatchesLargerThanAJournalRecord) {
  TempDir dir;
  RunResult r = fleet::testing::Run({Bin("fleet-broker"), "--frontend", "tcp://127.0.0.1:*", "--backend",
                     "tcp://127.0.0.1:*", "--control", "tcp://127.0.0.1:*", "--metrics", "",
                     "--data-dir", dir.File("data"), "--max-batch-bytes", "300000000",
                     "--max-message-bytes", "400000000"},
                    std::chrono::seconds(20), dir.File("broker.log"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("lower --max-batch-bytes"), std::string::npos) << r.output;
}

// Durable mode: a broker killed with batches accepted and unfinished brings
// them back from its journal; the producer only has to ask for the results.
TEST(DataPathTest, DurableBrokerKilledMidRunReplaysEveryAcceptedBatch) {
  Cluster first;
  first.StartBroker();
  std::string fe = first.frontend(), be = first.backend(), ctl = first.control();
  EXPECT_NE(first.BrokerLog().find("in-memory queue"), std::string::npos) << first.BrokerLog();
  first.broker().Signal(SIGKILL);  // only its ports were wanted
  ASSERT_TRUE(first.broker().Wait(std::chrono::seconds(10)).has_value());

  Cluster c;
  const std::string data = c.dir().File("data");
  const std::vector<std::string> flags = {"--frontend", fe, "--backend", be, "--control", ctl,
                                          "--heartbeat-ms", "200", "--data-dir", data};
  c.StartBroker(flags);
  EXPECT_NE(c.BrokerLog().find("durable queue in " + data), std::string::npos) << c.BrokerLog();
  c.StartWorker("d1", {"--handler", "sleep", "--concurrency", "2", "--heartbeat-ms", "200"});
  // 200 x 100 ms on 8 slots: about 2.5 s of work, so the broker dies mid-run.
  Process submit({Bin("fleet-submit"), "--broker", fe, "--count", "200", "--payload", "100",
                  "--inflight", "200", "--resend-after-seconds", "1",
                  "--output", c.dir().File("out.jsonl")},
                 c.dir().File("submit.log"));
  // Every batch accepted, some finished. (Accepted counts a batch once it
  // is in the journal's next write; one not yet on disk when the broker
  // dies was never acknowledged, and the producer sends it again.)
  ASSERT_TRUE(WaitFor([&] {
    return c.StatValue("submitted") >= 200 && c.StatValue("completed_ok") >= 10;
  }));
  c.broker().Signal(SIGKILL);
  ASSERT_TRUE(c.broker().Wait(std::chrono::seconds(10)).has_value());
  c.StartBroker(flags);
  const std::string log = c.BrokerLog();
  auto at = log.rfind("unfinished batches back in their queues");
  ASSERT_NE(at, std::string::npos) << log;
  auto colon = log.rfind(": ", at);
  const int restored = std::atoi(log.c_str() + colon + 2);
  EXPECT_GT(restored, 0) << log;
  EXPECT_LT(restored, 200) << log;

  ExpectAllOkEachOnce(submit, c.dir().File("out.jsonl"), 200);
  // No unfinished batch had to be accepted again: the journal had them, and
  // the producer's fetches found them (or their results) by id. Only a batch
  // that finished just before the kill, its result not yet received, is
  // unknown to the new broker and re-sent (results are not journaled).
  const double again = c.StatValue("submitted");
  EXPECT_LE(again + restored, 200);
  EXPECT_LT(again, restored);
  // The journal's own series: what was replayed, and it keeps writing.
  std::string page;
  EXPECT_TRUE(WaitFor([&] {
    page = HttpGet(c.metrics());
    return page.find("fleet_journal_commits_total") != std::string::npos;
  })) << page;
  auto value = [&](const std::string& series) {
    auto at = page.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::atof(page.c_str() + at + series.size() + 2);
  };
  EXPECT_GT(value("fleet_journal_replayed_records"), restored);  // accepted + finished records
  EXPECT_GT(value("fleet_journal_commits_total"), 0);
  EXPECT_NE(value("fleet_journal_syncs_total"), -1.0);  // present
}

}  // namespace
}  // namespace fleet::testing

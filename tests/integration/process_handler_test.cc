// Persistent handlers (fleet-worker --handler process, docs/handler-protocol.md)
// with a real broker, worker and producer: the Python example of the docs,
// handlers that die, misbehave or start slowly, and no process left behind
// on any way the worker ends.
#include <gtest/gtest.h>
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <iterator>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

bool HasText(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The states (R, S, Z, ...) of the live children of `parent`, from /proc.
std::string ChildStates(pid_t parent) {
  std::string states;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return "?";
  while (const dirent* e = ::readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) {
      states.push_back(state);
    }
  }
  ::closedir(proc);
  return states;
}

void WriteLines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
}

class ProcessHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartBroker({"--heartbeat-ms", "250", "--retire-linger-ms", "100"});
    marker_ = "ph-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // A worker running fleet-test-handler, named by this test's marker.
  Process& StartWorker(const std::string& id, int concurrency,
                       const std::string& handler_args = "",
                       std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        "--handler", "process", "--concurrency", std::to_string(concurrency),
        "--heartbeat-ms", "250", "--exec",
        Bin("fleet-test-handler") + " --marker " + marker_ + " " + handler_args};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return c_.StartWorker(id, argv);
  }

  // Live handlers of this test: processes that are fleet-test-handler with
  // this test's --marker (the worker's own command line names it too).
  int Handlers() {
    return static_cast<int>(
        PidsMatching("^[^ ]*/fleet-test-handle[r] --marker " + marker_ + "( |$)").size());
  }

  bool Registered(const std::string& id) {
    for (const auto& w : c_.Workers()) {
      if (w.value("id", "") == id) return true;
    }
    return false;
  }

  // Submits the lines of `payloads` (one batch each) and returns the run.
  Cluster::Submitted SubmitLines(const std::vector<std::string>& payloads) {
    const std::string input = c_.dir().File("input-" + std::to_string(++inputs_) + ".txt");
    WriteLines(input, payloads);
    return c_.Submit({"--input", input, "--timeout-seconds", "60"});
  }

  static const nlohmann::json* Find(const Cluster::Submitted& s, const std::string& result) {
    for (const auto& r : s.results) {
      if (r.value("result", "") == result) return &r;
    }
    return nullptr;
  }

  Cluster c_;
  std::string marker_;
  int inputs_ = 0;
};

// The docs' Python example (written from the spec alone) under load: every
// batch comes back upper-cased, none lost; an exception fails its batch.
TEST_F(ProcessHandlerTest, ThePythonExampleRunsTenThousandBatchesAndLosesNone) {
  Process& w = c_.StartWorker(
      "py", {"--handler", "process", "--concurrency", "2", "--exec",
             "/usr/bin/python3 " + std::string(FLEET_SOURCE_DIR) +
                 "/docs/examples/handlers/upper.py"});
  auto s = c_.Submit({"--count", "10000", "--size", "24", "--inflight", "500",
                      "--timeout-seconds", "120"});
  ASSERT_EQ(s.summary["ok"], "10000") << s.run.output << c_.WorkerLog("py");
  EXPECT_EQ(s.summary["lost"], "0");
  ASSERT_EQ(s.results.size(), 10000u);
  for (const auto& r : s.results) {
    const std::string id = r.value("id", "");
    const std::string result = r.value("result", "");
    // fleet-submit's generated payload starts with the batch's id.
    ASSERT_EQ(result.size(), 24u) << r.dump();
    std::string upper_id = id.substr(0, 24);
    for (char& ch : upper_id) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    ASSERT_EQ(result.substr(0, upper_id.size()), upper_id) << r.dump();
    ASSERT_EQ(r.value("attempts", 0), 1) << r.dump();
  }
  auto f = SubmitLines({"fail:no such thing", "still here"});
  ASSERT_EQ(s.run.exit_code, 0);
  EXPECT_NE(Find(f, "STILL HERE"), nullptr) << f.run.output;
  bool failed = false;
  for (const auto& r : f.results) {
    if (r.value("outcome", "") == "failed") {
      failed = true;
      EXPECT_TRUE(HasText(r.value("error", ""), "ValueError: no such thing")) << r.dump();
      EXPECT_EQ(r.value("attempts", 0), 1) << r.dump();
    }
  }
  EXPECT_TRUE(failed) << f.run.output;
  w.Signal(SIGTERM);
  EXPECT_EQ(w.Wait(seconds(20)), std::optional<int>(0)) << c_.WorkerLog("py");
  // Its --depth: several batches at once from the prefetched ones.
  Process& deep = c_.StartWorker(
      "py-depth", {"--handler", "process", "--concurrency", "2", "--prefetch", "16", "--exec",
                   "/usr/bin/python3 " + std::string(FLEET_SOURCE_DIR) +
                       "/docs/examples/handlers/upper.py --depth 8"});
  auto d = c_.Submit({"--count", "3000", "--size", "24", "--inflight", "500",
                      "--timeout-seconds", "120"});
  ASSERT_EQ(d.summary["ok"], "3000") << d.run.output << c_.WorkerLog("py-depth");
  EXPECT_TRUE(HasText(c_.WorkerLog("py-depth"), "takes 8 batches at once"));
  deep.Signal(SIGTERM);
  EXPECT_EQ(deep.Wait(seconds(20)), std::optional<int>(0)) << c_.WorkerLog("py-depth");
  EXPECT_TRUE(WaitFor([&] {
    return PidsMatching("[d]ocs/examples/handlers/upper.py").empty();
  }, seconds(10)));
}

// kill -9 of a handler in the middle of a batch: the batch is tried again
// and succeeds, the handler is restarted, the worker carries on.
TEST_F(ProcessHandlerTest, AHandlerKilledMidBatchCostsOneAttemptAndIsRestarted) {
  Process& w = StartWorker("w1", 1);
  const std::string flag = c_.dir().File("killed-once");
  auto s = SubmitLines({"once:" + flag + ":kill"});
  ASSERT_EQ(s.summary["ok"], "1") << s.run.output << c_.WorkerLog("w1");
  ASSERT_EQ(s.results.size(), 1u);
  EXPECT_EQ(s.results[0].value("result", ""), "again");
  EXPECT_EQ(s.results[0].value("attempts", 0), 2) << s.results[0].dump();
  EXPECT_TRUE(HasText(c_.WorkerLog("w1"), "killed by signal 9")) << c_.WorkerLog("w1");
  EXPECT_TRUE(w.Running());
  // The restarted handler serves the next ones.
  auto again = SubmitLines({"a", "b", "c"});
  EXPECT_EQ(again.summary["ok"], "3") << again.run.output;
  EXPECT_EQ(Handlers(), 1);
  // The killed one was reaped: one child, and it is no zombie.
  std::string states;
  EXPECT_TRUE(WaitFor([&] {
    states = ChildStates(w.pid());
    return states.size() == 1 && states.find('Z') == std::string::npos;
  })) << "children of the worker in states \"" << states << "\"";
}

// A handler whose ready names a depth takes several batches at once from
// the worker's prefetched ones: none lost, every one a first try; killed
// with -9 in the middle of one, only that one costs an attempt.
TEST_F(ProcessHandlerTest, AHandlerWithADepthRunsTenThousandBatchesAndAKillCostsOneAttempt) {
  Process& w = StartWorker("d1", 2, "--depth 8", {"--prefetch", "32"});
  auto s = c_.Submit({"--count", "10000", "--size", "24", "--inflight", "500",
                      "--timeout-seconds", "120"});
  ASSERT_EQ(s.summary["ok"], "10000") << s.run.output << c_.WorkerLog("d1");
  EXPECT_EQ(s.summary["lost"], "0");
  ASSERT_EQ(s.results.size(), 10000u);
  for (const auto& r : s.results) {
    ASSERT_EQ(r.value("result", "").substr(0, 8), r.value("id", "").substr(0, 8)) << r.dump();
    ASSERT_EQ(r.value("attempts", 0), 1) << r.dump();
  }
  EXPECT_TRUE(HasText(c_.WorkerLog("d1"), "takes 8 batches at once")) << c_.WorkerLog("d1");
  const std::string flag = c_.dir().File("killed-once");
  std::vector<std::string> lines = {"once:" + flag + ":kill"};
  for (int i = 0; i < 20; ++i) lines.push_back("after-" + std::to_string(i));
  auto k = SubmitLines(lines);
  ASSERT_EQ(k.summary["ok"], "21") << k.run.output << c_.WorkerLog("d1");
  for (const auto& r : k.results) {
    const bool killed = r.value("result", "") == "again";
    EXPECT_EQ(r.value("attempts", 0), killed ? 2 : 1) << r.dump();
  }
  EXPECT_NE(Find(k, "again"), nullptr) << k.run.output;
  EXPECT_TRUE(w.Running());
  w.Signal(SIGTERM);
  EXPECT_EQ(w.Wait(seconds(20)), std::optional<int>(0)) << c_.WorkerLog("d1");
  EXPECT_TRUE(WaitFor([&] { return Handlers() == 0; }, seconds(10)));
}

// A handler that writes garbage or answers for another batch: a retry, a
// restart, and the worker survives. An error answer is final.
TEST_F(ProcessHandlerTest, ProtocolErrorsAreRetriedAndErrorAnswersAreFinal) {
  Process& w = StartWorker("w1", 2);
  auto s = SubmitLines({"once:" + c_.dir().File("g") + ":garbage",
                        "once:" + c_.dir().File("x") + ":wrongid", "error:bad input", "plain"});
  EXPECT_EQ(s.summary["ok"], "3") << s.run.output << c_.WorkerLog("w1");
  EXPECT_EQ(s.summary["failed"], "1") << s.run.output;
  int retried = 0;
  for (const auto& r : s.results) {
    if (r.value("outcome", "") == "failed") {
      EXPECT_EQ(r.value("error", ""), "bad input") << r.dump();
      EXPECT_EQ(r.value("attempts", 0), 1) << r.dump();
    } else if (r.value("result", "") == "again") {
      EXPECT_EQ(r.value("attempts", 0), 2) << r.dump();
      ++retried;
    }
  }
  EXPECT_EQ(retried, 2) << s.run.output;
  EXPECT_TRUE(HasText(c_.WorkerLog("w1"), "protocol error")) << c_.WorkerLog("w1");
  EXPECT_TRUE(w.Running());
}

// A handler that always dies: the batch is dead-lettered after
// --max-attempts with the handler's reason, never lost.
TEST_F(ProcessHandlerTest, ABatchThatAlwaysKillsItsHandlerIsDeadLetteredWithTheReason) {
  Cluster c;
  c.StartBroker({"--heartbeat-ms", "250", "--max-attempts", "3"});
  c.StartWorker("w1", {"--handler", "process", "--exec",
                       Bin("fleet-test-handler") + " --marker " + marker_});
  auto s = c.Submit({"--payload", "exit:7", "--count", "1", "--timeout-seconds", "60"});
  ASSERT_EQ(s.results.size(), 1u) << s.run.output << c.WorkerLog("w1");
  EXPECT_EQ(s.results[0].value("outcome", ""), "failed");
  EXPECT_EQ(s.results[0].value("attempts", 0), 3) << s.results[0].dump();
  const std::string error = s.results[0].value("error", "");
  EXPECT_TRUE(HasText(error, "dead-lettered after 3 attempts")) << error;
  EXPECT_TRUE(HasText(error, "handler exited (exit status 7)")) << error;
}

// --batch-timeout kills the handler that overran; its batch fails, the
// handler is restarted and takes the next batch.
TEST_F(ProcessHandlerTest, ABatchPastTheTimeoutFailsAndItsHandlerIsReplaced) {
  StartWorker("w1", 1, "", {"--batch-timeout", "0.3"});
  auto s = SubmitLines({"sleep:30000"});
  ASSERT_EQ(s.results.size(), 1u) << s.run.output;
  EXPECT_EQ(s.results[0].value("outcome", ""), "failed");
  EXPECT_TRUE(HasText(s.results[0].value("error", ""), "timed out after")) << s.results[0].dump();
  auto next = SubmitLines({"pid"});
  EXPECT_EQ(next.summary["ok"], "1") << next.run.output;
  EXPECT_EQ(Handlers(), 1);
}

// No HELLO, and so no batch, until a handler says ready; then its work.
TEST_F(ProcessHandlerTest, NoWorkReachesAWorkerBeforeItsHandlerIsReady) {
  const std::string go = c_.dir().File("go");
  StartWorker("slow", 1, "--ready-when " + go);
  ASSERT_TRUE(WaitFor([&] { return Handlers() == 1; }));
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--count", "3",
                  "--timeout-seconds", "60"},
                 c_.dir().File("submit.log"));
  // The batches are queued at the broker and the handler is running, and
  // still the worker has not registered.
  ASSERT_TRUE(WaitFor([&] { return c_.StatValue("queued") == 3; }));
  EXPECT_FALSE(Registered("slow")) << c_.WorkerLog("slow");
  EXPECT_EQ(c_.StatValue("queued"), 3);
  WriteLines(go, {"go"});
  EXPECT_EQ(submit.Wait(seconds(60)), std::optional<int>(0)) << submit.ReadLog();
  EXPECT_TRUE(Registered("slow"));
}

// What a handler writes to stderr is in the worker's log with its slot.
TEST_F(ProcessHandlerTest, AHandlersStderrIsLoggedWithItsSlot) {
  StartWorker("w1", 1);
  auto s = SubmitLines({"stderr:loading the model took 3 s"});
  EXPECT_EQ(s.summary["ok"], "1") << s.run.output;
  EXPECT_TRUE(WaitFor([&] {
    return HasText(c_.WorkerLog("w1"), "handler slot 0: loading the model took 3 s");
  })) << c_.WorkerLog("w1");
}

// Every way a worker ends leaves no handler and no zombie behind.
TEST_F(ProcessHandlerTest, SigtermDrainsTheRunningBatchThenEndsEveryHandler) {
  Process& w = StartWorker("w1", 3);
  ASSERT_TRUE(WaitFor([&] { return Registered("w1"); }));
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--payload", "sleep:800",
                  "--count", "1", "--output", c_.dir().File("drain.jsonl"),
                  "--timeout-seconds", "60"},
                 c_.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& x : c_.Workers()) {
      if (x.value("id", "") == "w1" && x.value("held", 0) == 1) return true;
    }
    return false;
  }));
  EXPECT_EQ(Handlers(), 3);
  w.Signal(SIGTERM);
  EXPECT_EQ(w.Wait(seconds(30)), std::optional<int>(0)) << c_.WorkerLog("w1");
  EXPECT_EQ(submit.Wait(seconds(30)), std::optional<int>(0)) << submit.ReadLog();
  EXPECT_TRUE(HasText(ReadFile(c_.dir().File("drain.jsonl")), "\"attempts\":1"))
      << ReadFile(c_.dir().File("drain.jsonl"));
  EXPECT_TRUE(WaitFor([&] { return Handlers() == 0; }, seconds(5))) << Handlers();
}

TEST_F(ProcessHandlerTest, HandlersThatIgnoreEndOfFileAreKilledAfterTheGrace) {
  Process& w = StartWorker("w1", 2, "--ignore-eof", {"--handler-grace-seconds", "0.5"});
  ASSERT_TRUE(WaitFor([&] { return Registered("w1"); }));
  EXPECT_EQ(Handlers(), 2);
  w.Signal(SIGTERM);
  EXPECT_EQ(w.Wait(seconds(30)), std::optional<int>(0)) << c_.WorkerLog("w1");
  EXPECT_EQ(Handlers(), 0);
  EXPECT_TRUE(HasText(c_.WorkerLog("w1"), "killed")) << c_.WorkerLog("w1");
}

TEST_F(ProcessHandlerTest, ARetiredWorkerEndsItsHandlers) {
  Process& w = StartWorker("w1", 2);
  ASSERT_TRUE(WaitFor([&] { return Registered("w1"); }));
  EXPECT_EQ(Handlers(), 2);
  RunResult r = c_.Ctl({"retire", "w1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(w.Wait(seconds(30)), std::optional<int>(0)) << c_.WorkerLog("w1");
  EXPECT_TRUE(WaitFor([&] { return Handlers() == 0; }, seconds(5))) << Handlers();
}

// A second SIGINT stops the worker at once: the running batch goes back to
// the broker, and the handlers (one of them busy) are killed, not waited for.
TEST_F(ProcessHandlerTest, StopNowKillsBusyHandlersAndTheBrokerRequeuesTheBatch) {
  Process& w = StartWorker("w1", 2, "", {"--handler-grace-seconds", "60"});
  ASSERT_TRUE(WaitFor([&] { return Registered("w1"); }));
  Process submit({Bin("fleet-submit"), "--broker", c_.frontend(), "--payload", "sleep:60000",
                  "--count", "1", "--timeout-seconds", "60"},
                 c_.dir().File("submit.log"));
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& x : c_.Workers()) {
      if (x.value("id", "") == "w1" && x.value("held", 0) == 1) return true;
    }
    return false;
  }));
  w.Signal(SIGINT);
  ASSERT_TRUE(WaitFor([&] { return HasText(c_.WorkerLog("w1"), "draining"); }))
      << c_.WorkerLog("w1");
  w.Signal(SIGINT);
  EXPECT_EQ(w.Wait(seconds(10)), std::optional<int>(1)) << c_.WorkerLog("w1");
  EXPECT_TRUE(WaitFor([&] { return Handlers() == 0; }, seconds(5))) << Handlers();
  // Nothing is lost: the broker queues the batch again for the next worker.
  EXPECT_TRUE(WaitFor([&] { return c_.StatValue("queued") == 1; }, seconds(20)))
      << c_.BrokerLog();
  submit.Signal(SIGKILL);
}

TEST_F(ProcessHandlerTest, AWorkerKilledWithSigkillTakesItsHandlersWithIt) {
  Process& w = StartWorker("w1", 2, "", {"--handler-grace-seconds", "60"});
  ASSERT_TRUE(WaitFor([&] { return Registered("w1"); }));
  EXPECT_EQ(Handlers(), 2);
  w.Signal(SIGKILL);
  EXPECT_EQ(w.Wait(seconds(10)), std::optional<int>(128 + SIGKILL));
  EXPECT_TRUE(WaitFor([&] { return Handlers() == 0; }, seconds(5))) << Handlers();
}

}  // namespace
}  // namespace fleet::testing

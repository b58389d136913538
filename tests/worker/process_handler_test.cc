// The process handler against real handler processes (fleet-test-handler,
// which misbehaves on request), and the frames of docs/handler-protocol.md.
#include "worker/process_handler.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "tests/support/process.h"
#include "tests/support/wait.h"
#include "tests/worker/drive_loop.h"
#include "worker/handler_frames.h"

namespace fleet::worker {
namespace {

using fleet::testing::Bin;
using fleet::testing::TempDir;
using fleet::testing::WaitFor;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Timeout kNoTimeout{0};

// ---- frames ----

std::string Body(const std::string& frame) { return frame.substr(frames::kHeaderBytes); }

TEST(HandlerFramesTest, RoundTripsEveryMessageAndTheSpecsExampleBytes) {
  std::string f;
  frames::AppendReady(&f);
  // The spec's example: 00 00 00 08 92 a5 "ready" 01.
  EXPECT_EQ(f, std::string("\x00\x00\x00\x08\x92\xa5ready\x01", 12));
  frames::HandlerMessage m;
  std::string why;
  ASSERT_TRUE(frames::DecodeHandlerMessage(Body(f), &m, &why)) << why;
  EXPECT_EQ(m.kind, frames::HandlerMessage::Kind::kReady);
  EXPECT_EQ(m.version, 1u);

  f.clear();
  frames::AppendBatch(&f, "b-1", "hi", 1, "q");
  EXPECT_EQ(f, std::string("\x00\x00\x00\x12\x95\xa5" "batch\xa3" "b-1\xc4\x02hi\x01\xa1q", 22));
  std::string id, payload;
  ASSERT_TRUE(frames::DecodeBatchForTests(Body(f), &id, &payload));
  EXPECT_EQ(id, "b-1");
  EXPECT_EQ(payload, "hi");

  f.clear();
  frames::AppendOk(&f, "b-1", "HI");
  EXPECT_EQ(f, std::string("\x00\x00\x00\x0c\x93\xa2ok\xa3" "b-1\xc4\x02HI", 16));
  std::string body = Body(f);  // the message points into it
  ASSERT_TRUE(frames::DecodeHandlerMessage(body, &m, &why)) << why;
  EXPECT_EQ(m.kind, frames::HandlerMessage::Kind::kOk);
  EXPECT_EQ(m.id, "b-1");
  EXPECT_EQ(m.data, "HI");

  f.clear();
  frames::AppendError(&f, "b-2", "ValueError: boom");
  body = Body(f);
  ASSERT_TRUE(frames::DecodeHandlerMessage(body, &m, &why)) << why;
  EXPECT_EQ(m.kind, frames::HandlerMessage::Kind::kError);
  EXPECT_EQ(m.id, "b-2");
  EXPECT_EQ(m.data, "ValueError: boom");
}

TEST(HandlerFramesTest, ReadyMayNameADepthOfAtLeastOneAndLargeOnesAreCapped) {
  std::string f;
  frames::AppendReady(&f, frames::kVersion, 16);
  EXPECT_EQ(f, std::string("\x00\x00\x00\x09\x93\xa5ready\x01\x10", 13));
  frames::HandlerMessage m;
  std::string why;
  std::string body = Body(f);
  ASSERT_TRUE(frames::DecodeHandlerMessage(body, &m, &why)) << why;
  EXPECT_EQ(m.version, 1u);
  EXPECT_EQ(m.depth, 16u);
  // Without one, a handler takes one batch at a time.
  f.clear();
  frames::AppendReady(&f);
  body = Body(f);
  ASSERT_TRUE(frames::DecodeHandlerMessage(body, &m, &why)) << why;
  EXPECT_EQ(m.depth, 1u);
  f.clear();
  frames::AppendReady(&f, frames::kVersion, 100000);
  body = Body(f);
  ASSERT_TRUE(frames::DecodeHandlerMessage(body, &m, &why)) << why;
  EXPECT_EQ(m.depth, frames::kMaxDepth);
  // Depth 0, a depth that is not an integer, a fourth element: refused.
  for (const std::string& bad : {std::string("\x93\xa5ready\x01\x00", 9),
                                 std::string("\x93\xa5ready\x01\xa1x", 10),
                                 std::string("\x94\xa5ready\x01\x02\x03", 10)}) {
    EXPECT_FALSE(frames::DecodeHandlerMessage(bad, &m, &why)) << ::testing::PrintToString(bad);
    EXPECT_FALSE(why.empty());
  }
}

TEST(HandlerFramesTest, ScanWaitsForWholeFramesAndRefusesOversizedOnes) {
  std::string f;
  frames::AppendOk(&f, "b", std::string(100, 'x'));
  std::size_t body = 0;
  EXPECT_EQ(frames::ScanFrame(f.substr(0, 3), 1000, &body), frames::Scan::kNeedMore);
  EXPECT_EQ(frames::ScanFrame(f.substr(0, f.size() - 1), 1000, &body), frames::Scan::kNeedMore);
  EXPECT_EQ(frames::ScanFrame(f, 1000, &body), frames::Scan::kFrame);
  EXPECT_EQ(body, f.size() - 4);
  EXPECT_EQ(frames::ScanFrame(f, 50, &body), frames::Scan::kTooLarge);
  // A hostile length is refused from the header alone.
  EXPECT_EQ(frames::ScanFrame(std::string("\xff\xff\xff\xff", 4), 1 << 20, &body),
            frames::Scan::kTooLarge);
}

TEST(HandlerFramesTest, RefusesWhatIsNotAHandlerMessageWithAReason) {
  const std::string cases[] = {
      "",                                    // empty
      "\xc0",                                // nil, not an array
      "\x91\x01",                            // array without a name
      std::string("\x92\xa5ready\xa1x", 9),  // version not an integer
      std::string("\x93\xa2ok\xa1x", 6),     // truncated
      std::string("\x92\xa4" "done\x01", 7),  // unknown name
      std::string("\x92\xa5ready\x01\x01", 10),  // trailing bytes
      std::string("\x92\xa2ok\xa1x", 6),     // ok without a result
  };
  for (const auto& c : cases) {
    frames::HandlerMessage m;
    std::string why;
    EXPECT_FALSE(frames::DecodeHandlerMessage(c, &m, &why)) << ::testing::PrintToString(c);
    EXPECT_FALSE(why.empty());
  }
}

// ---- the handler ----

std::unique_ptr<ProcessHandler> MakeHandler(int slots, const std::string& args = "",
                                     double grace = 2.0,
                                     milliseconds ready_wait = milliseconds(30000)) {
  ProcessHandler::Options o;
  o.ready_wait = ready_wait;
  o.command = Bin("fleet-test-handler") + " " + args;
  o.slots = slots;
  o.worker_id = "w-test";
  o.grace = Timeout(grace);
  o.backoff_initial = milliseconds(20);
  o.backoff_max = milliseconds(200);
  return std::make_unique<ProcessHandler>(o);
}

bool AllReady(ProcessHandler& h, int n) {
  return WaitFor([&] { return h.ready_slots() == n; }, seconds(20));
}

HandlerOutput RunOne(ProcessHandler& h, const std::string& id, const std::string& payload,
                     Timeout timeout = kNoTimeout) {
  return h.RunBatch(BatchInfo{id, "default", 1}, payload, timeout);
}

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Live processes whose command line holds "--marker <marker>": the
// handlers, and the shells that started them if those did not exec.
int CountMarked(const std::string& marker) {
  return static_cast<int>(fleet::testing::PidsMatching("[-]-marker " + marker).size());
}

TEST(ProcessHandlerTest, OneProcessPerSlotAnswersWithTheSlotAndWorkerInItsEnvironment) {
  auto h = MakeHandler(2);
  ASSERT_TRUE(AllReady(*h, 2));
  HandlerOutput echo = RunOne(*h, "b-1", "hello");
  ASSERT_TRUE(echo.ok) << echo.error;
  EXPECT_EQ(echo.result, "hello");
  HandlerOutput env = RunOne(*h, "b-2", "env");
  ASSERT_TRUE(env.ok) << env.error;
  EXPECT_TRUE(env.result == "0 w-test" || env.result == "1 w-test") << env.result;
  HandlerOutput error = RunOne(*h, "b-3", "error:bad input");
  EXPECT_FALSE(error.ok);
  EXPECT_FALSE(error.retry);  // an error answer is final
  EXPECT_EQ(error.error, "bad input");
  // None of that restarted anything.
  EXPECT_EQ(h->starts(), 2);
  EXPECT_EQ(h->ready_slots(), 2);
}

TEST(ProcessHandlerTest, AHandlerKilledMidBatchGivesItBackForARetryAndIsRestarted) {
  auto h = MakeHandler(1);
  ASSERT_TRUE(AllReady(*h, 1));
  HandlerOutput killed = RunOne(*h, "b-1", "kill");
  EXPECT_FALSE(killed.ok);
  EXPECT_TRUE(killed.retry);
  EXPECT_NE(killed.error.find("handler exited (killed by signal 9"), std::string::npos)
      << killed.error;
  ASSERT_TRUE(WaitFor([&] { return h->starts() == 2 && h->ready_slots() == 1; }, seconds(20)));
  HandlerOutput next = RunOne(*h, "b-2", "after");
  ASSERT_TRUE(next.ok) << next.error;
  EXPECT_EQ(next.result, "after");

  HandlerOutput exited = RunOne(*h, "b-3", "exit:7");
  EXPECT_TRUE(exited.retry);
  EXPECT_NE(exited.error.find("handler exited (exit status 7)"), std::string::npos)
      << exited.error;
}

TEST(ProcessHandlerTest, GarbageOrAnAnswerForAnotherBatchIsAProtocolErrorAndARestart) {
  auto h = MakeHandler(1);
  ASSERT_TRUE(AllReady(*h, 1));
  HandlerOutput garbage = RunOne(*h, "b-1", "garbage");
  EXPECT_FALSE(garbage.ok);
  EXPECT_TRUE(garbage.retry);
  EXPECT_EQ(garbage.error.rfind("protocol error", 0), 0u) << garbage.error;
  ASSERT_TRUE(WaitFor([&] { return h->starts() == 2 && h->ready_slots() == 1; }, seconds(20)));
  HandlerOutput wrong = RunOne(*h, "b-2", "wrongid");
  EXPECT_TRUE(wrong.retry);
  EXPECT_NE(wrong.error.find("an answer for batch \"b-2-other\""), std::string::npos)
      << wrong.error;
  ASSERT_TRUE(WaitFor([&] { return h->starts() == 3 && h->ready_slots() == 1; }, seconds(20)));
  EXPECT_TRUE(RunOne(*h, "b-3", "fine").ok);
}

TEST(ProcessHandlerTest, ABatchPastItsTimeoutFailsAndTheHandlerIsKilledAndRestarted) {
  auto h = MakeHandler(1);
  ASSERT_TRUE(AllReady(*h, 1));
  HandlerOutput pid = RunOne(*h, "b-0", "pid");
  ASSERT_TRUE(pid.ok);
  HandlerOutput slow = RunOne(*h, "b-1", "sleep:30000", Timeout(0.2));
  EXPECT_FALSE(slow.ok);
  EXPECT_FALSE(slow.retry);  // a timeout is final, as with every handler
  EXPECT_EQ(slow.error, TimeoutError(Timeout(0.2)));
  // The old process is gone (killed and reaped), a new one answers.
  const pid_t old = std::stoi(pid.result);
  EXPECT_TRUE(WaitFor([&] { return !Alive(old); }, seconds(10)));
  ASSERT_TRUE(WaitFor([&] { return h->starts() == 2 && h->ready_slots() == 1; }, seconds(20)));
  HandlerOutput again = RunOne(*h, "b-2", "pid");
  ASSERT_TRUE(again.ok) << again.error;
  EXPECT_NE(again.result, pid.result);
}

TEST(ProcessHandlerTest, NoSlotIsReadyUntilItsHandlerSaysSo) {
  TempDir dir;
  const std::string go = dir.File("go");
  auto h = MakeHandler(2, "--ready-when " + go);
  // The handlers wait for the file, so nothing can be ready yet.
  EXPECT_EQ(h->ready_slots(), 0);
  EXPECT_TRUE(WaitFor([&] { return h->starts() == 2; }, seconds(10)));
  EXPECT_EQ(h->ready_slots(), 0);
  std::ofstream(go) << "1";
  ASSERT_TRUE(AllReady(*h, 2));
  EXPECT_TRUE(RunOne(*h, "b-1", "x").ok);
}

TEST(ProcessHandlerTest, AHandlerThatExitsBeforeReadyIsRestartedWithBackoff) {
  auto h = MakeHandler(1, "--exit-before-ready 3");
  EXPECT_TRUE(WaitFor([&] { return h->starts() >= 3; }, seconds(20)));
  EXPECT_EQ(h->ready_slots(), 0);
}

TEST(ProcessHandlerTest, AnIdleHandlerThatDiesCostsNoBatch) {
  auto h = MakeHandler(1);
  ASSERT_TRUE(AllReady(*h, 1));
  HandlerOutput pid = RunOne(*h, "b-1", "pid");
  ASSERT_TRUE(pid.ok);
  ::kill(std::stoi(pid.result), SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return h->starts() == 2 && h->ready_slots() == 1; }, seconds(20)));
  HandlerOutput next = RunOne(*h, "b-2", "pid");
  ASSERT_TRUE(next.ok) << next.error;
  EXPECT_NE(next.result, pid.result);
}

TEST(ProcessHandlerTest, ClosingEndsEveryHandlerAndKillsThoseThatIgnoreIt) {
  const std::string marker = "phtest-" + std::to_string(::getpid());
  std::vector<pid_t> pids;
  {
    auto polite = MakeHandler(2, "--marker " + marker + "-polite");
    ASSERT_TRUE(AllReady(*polite, 2));
    EXPECT_GE(CountMarked(marker + "-polite"), 2);
  }
  // Its stdin closed, each exited, and was reaped: none is left.
  EXPECT_EQ(CountMarked(marker + "-polite"), 0);
  {
    auto stubborn = MakeHandler(2, "--ignore-eof --marker " + marker + "-stubborn", /*grace=*/0.3);
    ASSERT_TRUE(AllReady(*stubborn, 2));
    for (const char* id : {"a", "b"}) {
      HandlerOutput p = RunOne(*stubborn, id, "pid");
      ASSERT_TRUE(p.ok);
      pids.push_back(std::stoi(p.result));
    }
  }
  // Killed after the grace period and reaped (not zombies: kill(pid, 0)
  // succeeds on a zombie).
  EXPECT_EQ(CountMarked(marker + "-stubborn"), 0);
  for (pid_t p : pids) EXPECT_FALSE(Alive(p)) << p;
}

TEST(ProcessHandlerTest, AbortKillsEveryHandlerAtOnce) {
  const std::string marker = "phabort-" + std::to_string(::getpid());
  auto h = MakeHandler(2, "--ignore-eof --marker " + marker, /*grace=*/30);
  ASSERT_TRUE(AllReady(*h, 2));
  h->Abort();
  EXPECT_TRUE(WaitFor([&] { return CountMarked(marker) == 0; }, seconds(10)));
  h.reset();  // reaps them; no 30 s grace needed for the dead
}

// ---- the loop's way: Submit, PollItems, Service ----

Task MakeTask(const std::string& id, const std::string& payload) {
  return Task{id, "default", 1, payload};
}

TEST(ProcessHandlerLoopTest, QueuedBatchesRunOnEveryProcessAndAKilledOneIsGivenBack) {
  TempDir dir;
  auto h = MakeHandler(3);
  ASSERT_TRUE(AllReady(*h, 3));
  std::vector<Task> tasks;
  for (int i = 0; i < 30; ++i) tasks.push_back(MakeTask("b-" + std::to_string(i), "x" + std::to_string(i)));
  tasks.push_back(MakeTask("k", "once:" + dir.File("k") + ":kill"));
  tasks.push_back(MakeTask("s", "sleep:50"));
  auto got = DriveLoop(*h, std::move(tasks), 32);
  ASSERT_EQ(got.size(), 32u);
  for (int i = 0; i < 30; ++i) {
    const Completion& c = got.at("b-" + std::to_string(i));
    EXPECT_TRUE(c.ok()) << c.error();
    EXPECT_EQ(c.result(), "x" + std::to_string(i));
  }
  EXPECT_FALSE(got.at("k").ok());
  EXPECT_TRUE(got.at("k").retry());
  EXPECT_EQ(std::string(got.at("k").error()).rfind("handler exited (killed by signal 9", 0), 0u)
      << got.at("k").error();
  EXPECT_TRUE(got.at("s").ok());
  EXPECT_EQ(h->queued(), 0u);
  EXPECT_EQ(h->running(), 0u);
  // The killed one comes back and takes the retry.
  ASSERT_TRUE(AllReady(*h, 3));
  std::vector<Task> again{MakeTask("k", "once:" + dir.File("k") + ":kill")};
  auto retried = DriveLoop(*h, std::move(again), 1);
  ASSERT_EQ(retried.size(), 1u);
  EXPECT_TRUE(retried.at("k").ok()) << retried.at("k").error();
  EXPECT_EQ(retried.at("k").result(), "again");
}

TEST(ProcessHandlerLoopTest, ATimeoutFailsTheBatchAndErrorsAndGarbageAreReported) {
  auto h = MakeHandler(2);
  ASSERT_TRUE(AllReady(*h, 2));
  ProcessHandler::Limits limits;
  limits.timeout = Timeout(0.2);
  std::vector<Task> tasks{MakeTask("slow", "sleep:30000"), MakeTask("err", "error:bad input"),
                          MakeTask("junk", "garbage")};
  ASSERT_TRUE(h->NextDeadline() == std::nullopt);
  auto got = DriveLoop(*h, std::move(tasks), 3, limits);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got.at("slow").ok());
  EXPECT_FALSE(got.at("slow").retry());
  EXPECT_EQ(got.at("slow").error(), "timed out after 0.2s");
  EXPECT_FALSE(got.at("err").ok());
  EXPECT_FALSE(got.at("err").retry());
  EXPECT_EQ(got.at("err").error(), "bad input");
  EXPECT_TRUE(got.at("junk").retry());
  // A long error text reaches the producer cut to the limit.
  std::vector<Task> long_error{MakeTask("long", "error:" + std::string(20000, 'e'))};
  ASSERT_TRUE(AllReady(*h, 2));
  auto cut = DriveLoop(*h, std::move(long_error), 1, limits);
  ASSERT_EQ(cut.size(), 1u);
  EXPECT_FALSE(cut.at("long").ok());
  EXPECT_EQ(cut.at("long").error().size(), limits.max_error_bytes + 3);  // + "..."
  EXPECT_EQ(cut.at("long").error().substr(0, 5), "eeeee");
  EXPECT_EQ(std::string(got.at("junk").error()).rfind("protocol error", 0), 0u)
      << got.at("junk").error();
}

// A handler whose ready names a depth gets that many batches at once, in
// one write, and answers them in order.
TEST(ProcessHandlerLoopTest, AHandlerWithADepthHoldsThatManyBatchesAndAnswersThemAll) {
  for (const int depth : {1, 8}) {
    SCOPED_TRACE("depth " + std::to_string(depth));
    auto h = MakeHandler(1, "--depth " + std::to_string(depth));
    ASSERT_TRUE(AllReady(*h, 1));
    std::vector<Task> tasks{MakeTask("first", "sleep:300")};
    for (int i = 0; i < 39; ++i) tasks.push_back(MakeTask("b-" + std::to_string(i), "x" + std::to_string(i)));
    std::vector<Completion> done;
    h->Submit(tasks, ProcessHandler::Limits{}, &done);
    // The first sleeps, so nothing is answered yet: `depth` batches are
    // with the process, the rest wait in the worker.
    EXPECT_EQ(done.size(), 0u);
    EXPECT_EQ(h->running(), 1u);
    EXPECT_EQ(h->queued(), 40u - static_cast<std::size_t>(depth));
    auto got = DriveLoop(*h, {}, 40);
    ASSERT_EQ(got.size(), 40u);
    for (const auto& [id, c] : got) {
      EXPECT_TRUE(c.ok()) << id << ": " << c.error();
      EXPECT_EQ(c.attempt(), 1u);
    }
    EXPECT_EQ(got.at("b-38").result(), "x38");
    EXPECT_EQ(h->queued(), 0u);
    EXPECT_EQ(h->running(), 0u);
  }
}

// The batches behind the running one never ran: when the handler dies,
// times out or breaks the protocol, only the running batch pays; the
// others run on the restarted process, as first tries.
TEST(ProcessHandlerLoopTest, WithADepthOnlyTheRunningBatchPaysForAFailure) {
  TempDir dir;
  auto h = MakeHandler(1, "--depth 8");
  ASSERT_TRUE(AllReady(*h, 1));
  ProcessHandler::Limits limits;
  limits.timeout = Timeout(0.5);
  std::vector<Task> tasks{MakeTask("k", "once:" + dir.File("k") + ":kill")};
  for (int i = 0; i < 7; ++i) tasks.push_back(MakeTask("a-" + std::to_string(i), "a" + std::to_string(i)));
  auto got = DriveLoop(*h, std::move(tasks), 8, limits);
  ASSERT_EQ(got.size(), 8u);
  EXPECT_TRUE(got.at("k").retry()) << got.at("k").error();
  for (int i = 0; i < 7; ++i) {
    const Completion& c = got.at("a-" + std::to_string(i));
    EXPECT_TRUE(c.ok()) << c.error();
    EXPECT_EQ(c.result(), "a" + std::to_string(i));
  }
  EXPECT_EQ(h->starts(), 2);

  // A timeout: the running batch fails for good, the ones behind it run.
  ASSERT_TRUE(AllReady(*h, 1));
  tasks = {MakeTask("slow", "sleep:30000"), MakeTask("t-0", "t0"), MakeTask("t-1", "t1")};
  got = DriveLoop(*h, std::move(tasks), 3, limits);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got.at("slow").retry());
  EXPECT_EQ(got.at("slow").error(), "timed out after 0.5s");
  EXPECT_TRUE(got.at("t-0").ok()) << got.at("t-0").error();
  EXPECT_TRUE(got.at("t-1").ok()) << got.at("t-1").error();

  // Each batch's timeout counts from the answer before it, not from when it
  // was sent: three of 300 ms in a row, 900 ms in all, none past 0.5 s.
  ASSERT_TRUE(AllReady(*h, 1));
  tasks = {MakeTask("s-0", "sleep:300"), MakeTask("s-1", "sleep:300"), MakeTask("s-2", "sleep:300")};
  got = DriveLoop(*h, std::move(tasks), 3, limits);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& [id, c] : got) EXPECT_TRUE(c.ok()) << id << ": " << c.error();

  // An answer for a batch other than the running one is a protocol error.
  ASSERT_TRUE(AllReady(*h, 1));
  tasks = {MakeTask("w", "wrongid"), MakeTask("after", "fine")};
  got = DriveLoop(*h, std::move(tasks), 2, limits);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got.at("w").retry());
  EXPECT_EQ(std::string(got.at("w").error()).rfind("protocol error: an answer for batch", 0), 0u)
      << got.at("w").error();
  EXPECT_TRUE(got.at("after").ok()) << got.at("after").error();
}

TEST(ProcessHandlerLoopTest, BatchesAreGivenBackWhenNoProcessIsReadyForTheReadyWait) {
  auto h = MakeHandler(1, "--exit-before-ready 3", 2.0, milliseconds(300));
  std::vector<Task> tasks{MakeTask("a", "x"), MakeTask("b", "y")};
  auto got = DriveLoop(*h, std::move(tasks), 2);
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [id, c] : got) {
    EXPECT_TRUE(c.retry()) << id;
    EXPECT_EQ(c.error(), "no handler process was ready within 0.3s") << id;
  }
  EXPECT_EQ(h->queued(), 0u);
}

TEST(ProcessHandlerLoopTest, DestroyedWithABatchRunningItKillsThatProcessAndReturns) {
  const std::string marker = "phbusy-" + std::to_string(::getpid());
  auto h = MakeHandler(1, "--marker " + marker, /*grace=*/30);
  ASSERT_TRUE(AllReady(*h, 1));
  std::vector<Task> tasks{MakeTask("long", "sleep:60000")};
  std::vector<Completion> done;
  h->Submit(tasks, ProcessHandler::Limits{}, &done);
  ASSERT_EQ(h->running(), 1u);
  h.reset();  // must not wait for the batch, nor for the grace
  EXPECT_TRUE(WaitFor([&] { return CountMarked(marker) == 0; }, seconds(10)));
}

// A handler whose child keeps its stdout open: when the handler dies in a
// batch, its process group goes too, so the batch is not left waiting for
// an end of file that would never come.
TEST(ProcessHandlerTest, AHandlersChildHoldingItsStdoutCannotKeepABatchWaiting) {
  ProcessHandler::Options o;
  o.command = "sleep 1000 & exec " + Bin("fleet-test-handler");  // through sh -c
  o.slots = 1;
  o.backoff_initial = milliseconds(20);
  auto h = std::make_unique<ProcessHandler>(o);
  ASSERT_TRUE(AllReady(*h, 1));
  // Without that, this would end only at the timeout, as a failure.
  HandlerOutput out = RunOne(*h, "b-1", "kill", Timeout(10));
  EXPECT_FALSE(out.ok);
  EXPECT_TRUE(out.retry) << out.error;
  EXPECT_EQ(out.error.rfind("handler exited", 0), 0u) << out.error;
}

}  // namespace
}  // namespace fleet::worker

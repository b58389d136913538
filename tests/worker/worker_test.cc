// Drives the real fleet-worker binary against a fake broker: a ROUTER on an
// ephemeral 127.0.0.1 port that the test scripts message by message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <signal.h>
#include <unistd.h>

#include <zmq.hpp>

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/zmq_util.h"
#include "worker/handler.h"
#include "tests/support/http_get.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace fleet {
namespace {

using namespace std::chrono_literals;
using testing::Bin;
using testing::Process;
using testing::TempDir;

// One message from the worker. Heap-held so the decoded views stay valid.
struct Received {
  std::string identity;
  std::string body;
  proto::Message message;

  template <typename T>
  const T* As() const {
    return std::get_if<T>(&message);
  }
  proto::Command command() const { return proto::CommandOf(message); }
};

class FakeBroker {
 public:
  FakeBroker() : router_(context_, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    endpoint_ = BindSocket(router_, "tcp://127.0.0.1:*");
  }

  const std::string& endpoint() const { return endpoint_; }

  // The next message within `timeout`, or null.
  std::unique_ptr<Received> Recv(std::chrono::milliseconds timeout = 10s) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return nullptr;
    std::vector<zmq::message_t> frames;
    if (!RecvMultipart(router_, &frames) || frames.size() != 2) return nullptr;
    auto r = std::make_unique<Received>();
    r->identity = frames[0].to_string();
    r->body = frames[1].to_string();
    auto decoded = proto::Decode(r->body.data(), r->body.size());
    EXPECT_TRUE(decoded.ok()) << decoded.detail;
    if (!decoded.ok()) return nullptr;
    r->message = std::move(*decoded.message);
    identity_ = r->identity;
    return r;
  }

  // The next message that is not a HEARTBEAT.
  std::unique_ptr<Received> RecvSkippingHeartbeats(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return nullptr;
      auto r = Recv(left);
      if (!r || r->command() != proto::Command::kHeartbeat) return r;
    }
  }

  // Sends to the peer we last heard from.
  void Send(const proto::Message& message) {
    ASSERT_FALSE(identity_.empty());
    ASSERT_TRUE(SendRouted(router_, identity_, proto::Encode(message)));
  }

  // Waits for HELLO and answers WELCOME; returns the HELLO.
  std::unique_ptr<Received> Register(std::uint32_t heartbeat_ms = 1000,
                                     std::uint32_t liveness = 100) {
    auto hello = RecvSkippingHeartbeats();
    EXPECT_TRUE(hello && hello->As<proto::Hello>());
    if (!hello || !hello->As<proto::Hello>()) return nullptr;
    Send(proto::Welcome{heartbeat_ms, liveness});
    return hello;
  }

 private:
  zmq::context_t context_;
  zmq::socket_t router_;
  std::string endpoint_;
  std::string identity_;
};

class WorkerProcessTest : public ::testing::Test {
 protected:
  std::unique_ptr<Process> Start(std::vector<std::string> args) {
    std::vector<std::string> argv = {Bin("fleet-worker"), "--broker", broker_.endpoint(),
                                     "--log-level", "debug"};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<Process>(argv, dir_.File("worker.log"));
  }

  void TearDown() override {
    if (HasFailure()) std::cerr << "---- worker log ----\n" << ReadLog() << "\n";
  }

  std::string ReadLog() const { return testing::ReadFile(dir_.File("worker.log")); }

  static proto::Dispatch Batches(std::vector<std::pair<std::string, std::string>> items) {
    static std::vector<std::pair<std::string, std::string>> keep;  // views' storage
    keep = std::move(items);
    proto::Dispatch d;
    for (const auto& [id, payload] : keep) d.batches.push_back({id, "default", 1, payload});
    return d;
  }

  TempDir dir_;
  FakeBroker broker_;
};

TEST_F(WorkerProcessTest, HelloCarriesIdConcurrencyCreditAndQueues) {
  auto worker = Start({"--id", "w-hello", "--concurrency", "3", "--queues", "a,b"});
  auto hello = broker_.Recv();
  ASSERT_TRUE(hello);
  const auto* h = hello->As<proto::Hello>();
  ASSERT_TRUE(h) << "first message was command " << static_cast<int>(hello->command());
  EXPECT_EQ(h->worker_id, "w-hello");
  EXPECT_EQ(h->concurrency, 3u);
  EXPECT_EQ(h->credit, 3u);
  ASSERT_EQ(h->queues.size(), 2u);
  EXPECT_EQ(h->queues[0], "a");
  EXPECT_EQ(h->queues[1], "b");
}

// --prefetch raises what the broker may send (HELLO concurrency and credit)
// beyond the slots; the extra batches wait at the worker and each comes
// back once, with the credit they used granted again.
TEST_F(WorkerProcessTest, PrefetchAddsHeldBatchesBeyondTheSlots) {
  auto worker = Start({"--id", "w-prefetch", "--concurrency", "1", "--prefetch", "3"});
  auto hello = broker_.Register();
  ASSERT_TRUE(hello);
  const auto* h = hello->As<proto::Hello>();
  ASSERT_TRUE(h);
  EXPECT_EQ(h->concurrency, 4u);
  EXPECT_EQ(h->credit, 4u);
  EXPECT_EQ(h->slots, 1u);  // the broker packs onto slots, spreads prefetch
  EXPECT_EQ(h->incarnation.size(), 16u);
  broker_.Send(Batches({{"p1", "a"}, {"p2", "b"}, {"p3", "c"}, {"p4", "d"}}));
  std::multiset<std::string> seen;
  std::uint32_t credit = 0;
  while (seen.size() < 4) {
    auto msg = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(msg) << "no DONE";
    const auto* done = msg->As<proto::Done>();
    ASSERT_TRUE(done) << "got command " << static_cast<int>(msg->command());
    credit += done->credit;
    for (const auto& r : done->results) seen.insert(std::string(r.id));
  }
  EXPECT_EQ(seen, (std::multiset<std::string>{"p1", "p2", "p3", "p4"}));
  EXPECT_EQ(credit, 4u);
  EXPECT_EQ(ReadLog().find("more batches than our credit"), std::string::npos);
}

TEST_F(WorkerProcessTest, PrefetchOutOfRangeIsRefused) {
  auto worker = Start({"--id", "w-bad", "--prefetch", "5000"});
  auto code = worker->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(code);
  EXPECT_NE(*code, 0);
  EXPECT_NE(ReadLog().find("prefetch"), std::string::npos);
}

// The broker plays by the rules: it dispatches only against credit and tops
// its credit up from each DONE.
TEST_F(WorkerProcessTest, ReturnsEachResultOnceAndNeverHoldsMoreThanCredit) {
  auto worker = Start({"--id", "w-echo", "--concurrency", "2"});
  auto hello = broker_.Register();
  ASSERT_TRUE(hello);
  std::int64_t credit = hello->As<proto::Hello>()->credit;
  ASSERT_EQ(credit, 2);

  const std::vector<std::pair<std::string, std::string>> all = {
      {"b1", "one"}, {"b2", "two"}, {"b3", "three"}};
  std::size_t next = 0;
  std::map<std::string, int> seen;
  std::int64_t credit_granted = 0;
  while (seen.size() < all.size()) {
    std::vector<std::pair<std::string, std::string>> send;
    while (credit > 0 && next < all.size()) {
      send.push_back(all[next++]);
      --credit;
    }
    if (!send.empty()) broker_.Send(Batches(send));
    auto msg = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(msg) << "no DONE";
    const auto* done = msg->As<proto::Done>();
    ASSERT_TRUE(done) << "got command " << static_cast<int>(msg->command());
    credit += done->credit;
    credit_granted += done->credit;
    ASSERT_LE(credit, 2) << "worker granted more credit than it has slots";
    for (const auto& r : done->results) {
      ++seen[std::string(r.id)];
      EXPECT_EQ(r.outcome, proto::Outcome::kOk);
      EXPECT_EQ(r.attempt, 1u);
      EXPECT_EQ(r.error, "");
      for (const auto& [id, payload] : all) {
        if (id == r.id) {
          EXPECT_EQ(r.result, payload);
        }
      }
    }
  }
  EXPECT_EQ(credit_granted, 3);  // one slot freed per result
  EXPECT_EQ(credit, 2);          // and the broker ends with the full credit
  for (const auto& [id, n] : seen) EXPECT_EQ(n, 1) << id;
  // No duplicate shows up later (bounded wait on the socket, not a sleep).
  auto extra = broker_.RecvSkippingHeartbeats(500ms);
  EXPECT_FALSE(extra && extra->As<proto::Done>());
}

// A misbehaving broker sends 3 batches against a credit of 2: the worker
// runs all of them and its DONE credits add up to the slots actually freed.
TEST_F(WorkerProcessTest, RunsBatchesBeyondCreditAndGrantsOnlyFreedSlots) {
  auto worker = Start({"--id", "w-over", "--concurrency", "2"});
  ASSERT_TRUE(broker_.Register());
  broker_.Send(Batches({{"x1", "a"}, {"x2", "b"}, {"x3", "c"}}));
  std::multiset<std::string> seen;
  std::uint32_t credit = 0;
  while (seen.size() < 3) {
    auto msg = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(msg);
    const auto* done = msg->As<proto::Done>();
    ASSERT_TRUE(done);
    credit += done->credit;
    for (const auto& r : done->results) seen.insert(std::string(r.id));
  }
  EXPECT_EQ(seen, (std::multiset<std::string>{"x1", "x2", "x3"}));
  EXPECT_EQ(credit, 2u);
}

TEST_F(WorkerProcessTest, SendsHeartbeatWhenIdle) {
  auto worker = Start({"--id", "w-hb"});
  ASSERT_TRUE(broker_.Register(/*heartbeat_ms=*/100, /*liveness=*/100));
  auto msg = broker_.Recv(5s);
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->command(), proto::Command::kHeartbeat);
}

TEST_F(WorkerProcessTest, ResetMakesWorkerSayHelloAgain) {
  auto worker = Start({"--id", "w-reset", "--concurrency", "4"});
  auto first = broker_.Register();
  ASSERT_TRUE(first);
  const std::string incarnation(first->As<proto::Hello>()->incarnation);
  broker_.Send(proto::Reset{"unknown worker"});
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  const auto* hello = msg->As<proto::Hello>();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->worker_id, "w-reset");
  EXPECT_EQ(hello->credit, 4u);
  // The same process: the broker replaces its old registration at once.
  EXPECT_EQ(hello->incarnation, incarnation);
}

// A restarted broker answers every DONE and heartbeat already on its way
// with a RESET: the worker registers once, not once per RESET.
TEST_F(WorkerProcessTest, SeveralResetsInARowGetOneHello) {
  auto worker = Start({"--id", "w-resets", "--handler", "echo"});
  ASSERT_TRUE(broker_.Register());
  broker_.Send(proto::Reset{"unknown worker: send HELLO"});
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg && msg->As<proto::Hello>());
  // The answers to what it sent before that HELLO, then the WELCOME.
  broker_.Send(proto::Reset{"unknown worker: send HELLO"});
  broker_.Send(proto::Reset{"unknown worker: send HELLO"});
  broker_.Send(proto::Welcome{250, 3});
  broker_.Send(Batches({{"after-reset", "x"}}));
  msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  ASSERT_TRUE(msg->As<proto::Done>()) << "got command " << static_cast<int>(msg->command());
}

TEST_F(WorkerProcessTest, ReconnectsWhenBrokerGoesSilentAndKeepsResults) {
  auto worker = Start({"--id", "w-silent", "--handler", "sleep"});
  ASSERT_TRUE(broker_.Register(/*heartbeat_ms=*/100, /*liveness=*/3));
  broker_.Send(Batches({{"s1", "1500"}}));
  // Stay silent: the worker gives up on this connection and says HELLO anew.
  std::unique_ptr<Received> msg;
  do {
    msg = broker_.Recv();
    ASSERT_TRUE(msg);
  } while (!msg->As<proto::Hello>());
  broker_.Send(proto::Welcome{100, 100});
  do {
    msg = broker_.Recv();
    ASSERT_TRUE(msg);
  } while (msg->command() == proto::Command::kHeartbeat ||
           msg->command() == proto::Command::kHello);
  const auto* done = msg->As<proto::Done>();
  ASSERT_TRUE(done) << "got command " << static_cast<int>(msg->command());
  ASSERT_EQ(done->results.size(), 1u);
  EXPECT_EQ(done->results[0].id, "s1");
  EXPECT_EQ(done->results[0].outcome, proto::Outcome::kOk);
}

TEST_F(WorkerProcessTest, StopFinishesHeldBatchThenSaysByeAndExitsZero) {
  auto worker = Start({"--id", "w-stop", "--handler", "sleep"});
  ASSERT_TRUE(broker_.Register());
  broker_.Send(Batches({{"s1", "300"}}));
  broker_.Send(proto::Stop{"retired by autoscaler"});
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  const auto* done = msg->As<proto::Done>();
  ASSERT_TRUE(done) << "got command " << static_cast<int>(msg->command());
  ASSERT_EQ(done->results.size(), 1u);
  EXPECT_EQ(done->results[0].id, "s1");
  EXPECT_EQ(done->results[0].outcome, proto::Outcome::kOk);
  EXPECT_EQ(done->credit, 0u);  // draining: no new credit
  msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->command(), proto::Command::kBye);
  EXPECT_EQ(worker->Wait(10s), std::optional<int>(0));
  EXPECT_NE(ReadLog().find("retired by autoscaler"), std::string::npos);
}

TEST_F(WorkerProcessTest, SigtermDrainsHeldBatchThenSaysByeAndExitsZero) {
  auto worker = Start({"--id", "w-term", "--handler", "sleep"});
  ASSERT_TRUE(broker_.Register());
  // The quick batch's DONE proves the worker holds the slow one.
  broker_.Send(Batches({{"quick", "0"}, {"slow", "500"}}));
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg && msg->As<proto::Done>());
  ASSERT_EQ(msg->As<proto::Done>()->results.size(), 1u);
  EXPECT_EQ(msg->As<proto::Done>()->results[0].id, "quick");

  worker->Signal(SIGTERM);
  msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->command(), proto::Command::kDrain);
  msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  const auto* done = msg->As<proto::Done>();
  ASSERT_TRUE(done) << "got command " << static_cast<int>(msg->command());
  ASSERT_EQ(done->results.size(), 1u);
  EXPECT_EQ(done->results[0].id, "slow");
  EXPECT_EQ(done->credit, 0u);
  msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->command(), proto::Command::kBye);
  EXPECT_EQ(worker->Wait(10s), std::optional<int>(0));
}

TEST_F(WorkerProcessTest, SecondSigtermExitsAtOnceWithOne) {
  auto worker = Start({"--id", "w-term2", "--handler", "sleep"});
  ASSERT_TRUE(broker_.Register());
  broker_.Send(Batches({{"quick", "0"}, {"forever", "60000"}}));
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg && msg->As<proto::Done>());
  worker->Signal(SIGTERM);
  msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->command(), proto::Command::kDrain);
  // From another process: a repeated SIGTERM from the worker's parent (this
  // test) would mean "drain" (see LifecycleTest for both cases).
  ASSERT_EQ(std::system(("kill -TERM " + std::to_string(worker->pid())).c_str()), 0);
  EXPECT_EQ(worker->Wait(10s), std::optional<int>(1));
}

TEST_F(WorkerProcessTest, BlacklistedStopAnsweringHelloExitsZero) {
  auto worker = Start({"--id", "w-black"});
  auto hello = broker_.Recv();
  ASSERT_TRUE(hello && hello->As<proto::Hello>());
  broker_.Send(proto::Stop{"worker w-black is blacklisted"});
  EXPECT_EQ(worker->Wait(10s), std::optional<int>(0));
  EXPECT_NE(ReadLog().find("blacklisted"), std::string::npos);
}

TEST_F(WorkerProcessTest, DuplicateWorkerErrorRetriesHello) {
  auto worker = Start({"--id", "w-dup"});
  auto hello = broker_.Recv();
  ASSERT_TRUE(hello && hello->As<proto::Hello>());
  broker_.Send(proto::Error{proto::ErrorCode::kDuplicateWorker, "w-dup is connected"});
  auto again = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(again && again->As<proto::Hello>());
  EXPECT_NE(ReadLog().find("duplicate_worker"), std::string::npos);
}

// A broker of the first protocol revision refuses the 6-field HELLO as
// malformed: the worker registers with the 4-field one.
TEST_F(WorkerProcessTest, HelloRefusedAsMalformedIsSentAgainWithoutTheOptionalFields) {
  auto worker = Start({"--id", "w-old-broker", "--handler", "echo"});
  auto hello = broker_.Recv();
  ASSERT_TRUE(hello && hello->As<proto::Hello>());
  EXPECT_NE(hello->As<proto::Hello>()->incarnation, "");
  broker_.Send(proto::Error{proto::ErrorCode::kMalformed, "HELLO: expected 6 fields, got 8"});
  auto again = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(again);
  const auto* h = again->As<proto::Hello>();
  ASSERT_TRUE(h) << "got command " << static_cast<int>(again->command());
  EXPECT_EQ(h->slots, 0u);
  EXPECT_EQ(h->incarnation, "");
  // Four fields: [1, 10, id, concurrency, credit, queues] is a 6-element array.
  EXPECT_EQ(static_cast<unsigned char>(again->body[0]), 0x96);
  broker_.Send(proto::Welcome{250, 3});
  broker_.Send(Batches({{"e1", "x"}}));
  auto done = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(done && done->As<proto::Done>());
}

// sha256 runs small payloads on the worker's loop and large ones on its
// slots: every result comes back, right, once.
TEST_F(WorkerProcessTest, Sha256ResultsOfSmallAndLargePayloadsAllComeBack) {
  auto worker = Start({"--id", "w-sha", "--handler", "sha256", "--prefetch", "3"});
  ASSERT_TRUE(broker_.Register());
  const std::string big(200u << 10, 'b');
  broker_.Send(Batches({{"small-1", "abc"}, {"big", big}, {"small-2", ""}}));
  std::map<std::string, std::string> results;
  while (results.size() < 3) {
    auto msg = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(msg) << "no DONE";
    const auto* done = msg->As<proto::Done>();
    ASSERT_TRUE(done) << "got command " << static_cast<int>(msg->command());
    for (const auto& r : done->results) {
      EXPECT_TRUE(results.emplace(std::string(r.id), std::string(r.result)).second) << r.id;
    }
  }
  EXPECT_EQ(results["small-1"], worker::Sha256Hex("abc"));
  EXPECT_EQ(results["small-2"], worker::Sha256Hex(""));
  EXPECT_EQ(results["big"], worker::Sha256Hex(big));
}

TEST_F(WorkerProcessTest, ExecHandlerReturnsCommandStdout) {
  auto worker = Start({"--id", "w-exec", "--concurrency", "2", "--handler", "exec",
                       "--exec", "tr a-z A-Z"});
  ASSERT_TRUE(broker_.Register());
  broker_.Send(Batches({{"e1", "shout"}}));
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg && msg->As<proto::Done>());
  ASSERT_EQ(msg->As<proto::Done>()->results.size(), 1u);
  EXPECT_EQ(msg->As<proto::Done>()->results[0].result, "SHOUT");
}

// --handler process: no HELLO before a handler is ready, credit for ready
// slots only, and a batch whose handler died comes back as DONE retry
// with the slot's credit granted again once its new handler is ready.
TEST_F(WorkerProcessTest, ProcessHandlerCreditFollowsReadySlotsAndADeadHandlersBatchIsRetried) {
  const std::string ready = dir_.File("ready-");
  const std::string marker = "wproc-" + std::to_string(::getpid());
  auto worker = Start({"--id", "w-proc", "--concurrency", "2", "--handler", "process", "--exec",
                       Bin("fleet-test-handler") + " --marker " + marker +
                           " --ready-when " + ready});
  // Both handlers are up and not ready: the worker stays silent.
  ASSERT_TRUE(testing::WaitFor([&] {
    return testing::PidsMatching("^[^ ]*/fleet-test-handle[r] --marker " + marker + " ").size() ==
           2;
  }));
  EXPECT_EQ(broker_.Recv(300ms), nullptr);
  { std::ofstream(ready + "0") << "go"; }
  auto hello = broker_.Register();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->As<proto::Hello>()->concurrency, 2u);
  EXPECT_EQ(hello->As<proto::Hello>()->credit, 1u);
  { std::ofstream(ready + "1") << "go"; }
  auto grant = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(grant && grant->As<proto::Done>());
  EXPECT_EQ(grant->As<proto::Done>()->credit, 1u);
  EXPECT_TRUE(grant->As<proto::Done>()->results.empty());

  broker_.Send(Batches({{"k1", "once:" + dir_.File("killed") + ":kill"}}));
  std::uint32_t credit = 0;
  const proto::DoneItem* retry = nullptr;
  std::vector<std::unique_ptr<Received>> kept;
  while (credit < 1) {
    auto msg = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(msg && msg->As<proto::Done>());
    credit += msg->As<proto::Done>()->credit;
    for (const auto& r : msg->As<proto::Done>()->results) retry = &r;
    kept.push_back(std::move(msg));
  }
  ASSERT_NE(retry, nullptr);
  EXPECT_EQ(retry->id, "k1");
  EXPECT_EQ(retry->outcome, proto::Outcome::kRetry);
  EXPECT_EQ(std::string(retry->error).rfind("handler exited (killed by signal 9", 0), 0u)
      << retry->error;
  // The same batch again, on the restarted handler: done.
  broker_.Send(Batches({{"k1", "once:" + dir_.File("killed") + ":kill"}}));
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg && msg->As<proto::Done>());
  ASSERT_EQ(msg->As<proto::Done>()->results.size(), 1u);
  EXPECT_EQ(msg->As<proto::Done>()->results[0].outcome, proto::Outcome::kOk);
  EXPECT_EQ(msg->As<proto::Done>()->results[0].result, "again");
}

TEST_F(WorkerProcessTest, BatchTimeoutFailsLongSleep) {
  auto worker = Start({"--id", "w-timeout", "--handler", "sleep", "--batch-timeout", "0.2"});
  ASSERT_TRUE(broker_.Register());
  broker_.Send(Batches({{"long", "60000"}}));
  auto msg = broker_.RecvSkippingHeartbeats();
  ASSERT_TRUE(msg && msg->As<proto::Done>());
  const auto& r = msg->As<proto::Done>()->results.at(0);
  EXPECT_EQ(r.id, "long");
  EXPECT_EQ(r.outcome, proto::Outcome::kFailed);
  EXPECT_EQ(r.error, "timed out after 0.2s");
  EXPECT_EQ(msg->As<proto::Done>()->credit, 1u);
}

TEST_F(WorkerProcessTest, ExecHandlerWithoutCommandFailsWithMessage) {
  auto worker = Start({"--handler", "exec"});
  auto code = worker->Wait(10s);
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_NE(ReadLog().find("--exec"), std::string::npos);
}

// Regression: SIGTERM while HELLO could not be sent (no broker) hung.
TEST_F(WorkerProcessTest, SigtermWithoutBrokerExitsZero) {
  std::vector<std::string> argv = {Bin("fleet-worker"), "--broker", "tcp://127.0.0.1:1",
                                   "--id", "w-alone"};
  Process worker(argv, dir_.File("worker.log"));
  ASSERT_TRUE(testing::WaitFor(
      [&] { return ReadLog().find("starting") != std::string::npos; }, 10s));
  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.Wait(10s), std::optional<int>(0));
}

TEST_F(WorkerProcessTest, AHandlersGetsBecomeObjectGetsAndTheAnswersComeBackToIt) {
  auto worker = Start({"--id", "w-obj", "--handler", "process", "--metrics", "127.0.0.1:0",
                       "--exec", Bin("fleet-test-handler")});
  ASSERT_TRUE(broker_.Register());
  const std::string object = "hello, objects";  // 14 bytes, read 5 at a time
  broker_.Send(Batches({{"b-obj", "fetch:beef:5"}}));
  std::uint64_t offset = 0;
  std::set<std::uint64_t> tags;
  std::unique_ptr<Received> done;
  while (!done) {
    auto msg = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(msg);
    if (msg->As<proto::Done>() && msg->As<proto::Done>()->results.empty()) continue;  // a grant
    if (msg->As<proto::Done>()) {
      done = std::move(msg);
      break;
    }
    const auto* get = msg->As<proto::ObjectGet>();
    ASSERT_TRUE(get) << "command " << static_cast<int>(msg->command());
    EXPECT_EQ(get->batch_id, "b-obj");
    EXPECT_EQ(get->digest, "\xbe\xef");
    EXPECT_EQ(get->offset, offset);
    EXPECT_EQ(get->length, 5u);
    EXPECT_TRUE(tags.insert(get->tag).second);  // each request its own tag
    // First an answer nobody waits for (dropped and counted), then the real one.
    broker_.Send(proto::ObjectData{get->tag + 1000, 0, object.size(), offset, "zz", ""});
    const std::string chunk = object.substr(offset, 5);
    broker_.Send(proto::ObjectData{get->tag, 0, object.size(), offset, chunk, ""});
    offset += chunk.size();
  }
  ASSERT_EQ(done->As<proto::Done>()->results.size(), 1u);
  EXPECT_EQ(done->As<proto::Done>()->results[0].outcome, proto::Outcome::kOk)
      << done->As<proto::Done>()->results[0].error;
  EXPECT_EQ(done->As<proto::Done>()->results[0].result, object);
  EXPECT_EQ(tags.size(), 3u);

  // A refusal reaches the handler as it came.
  broker_.Send(Batches({{"b-gone", "fetch:beef:5"}}));
  std::unique_ptr<Received> get;
  do {
    get = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(get);
  } while (!get->As<proto::ObjectGet>());
  broker_.Send(proto::ObjectData{get->As<proto::ObjectGet>()->tag,
                                 static_cast<std::uint32_t>(proto::ObjectStatus::kProducerGone),
                                 0, 0, "", "the producer of b-gone is not connected"});
  do {
    done = broker_.RecvSkippingHeartbeats();
    ASSERT_TRUE(done);
  } while (!done->As<proto::Done>() || done->As<proto::Done>()->results.empty());
  EXPECT_EQ(done->As<proto::Done>()->results[0].outcome, proto::Outcome::kFailed);
  EXPECT_EQ(done->As<proto::Done>()->results[0].error,
            "status 2: the producer of b-gone is not connected");

  // The counters: 14 bytes passed on, 3 answers dropped.
  const std::string log = ReadLog();
  const auto at = log.find("metrics on ");
  ASSERT_NE(at, std::string::npos);
  const std::string url = log.substr(at + 11, log.find_first_of(" \n", at + 11) - at - 11);
  const std::string page = testing::HttpGet(url);
  EXPECT_NE(page.find("fleet_worker_object_bytes_total 14"), std::string::npos) << page;
  EXPECT_NE(page.find("fleet_worker_object_data_dropped_total 3"), std::string::npos) << page;
}

TEST_F(WorkerProcessTest, HelpExitsZero) {
  auto worker = Start({"--help"});
  EXPECT_EQ(worker->Wait(10s), std::optional<int>(0));
  EXPECT_NE(ReadLog().find("--concurrency"), std::string::npos);
}

}  // namespace
}  // namespace fleet

#include "broker/broker_core.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "broker/journal.h"
#include "broker/journal_records.h"
#include "tests/broker/faulty_journal_io.h"
#include "common/codec.h"
#include "tests/support/process.h"

namespace fleet::broker {
namespace {

using proto::ErrorCode;
using proto::Outcome;

class BrokerCoreTest : public ::testing::Test {
 protected:
  BrokerCoreTest() { Reset(BrokerOptions()); }

  void Reset(BrokerOptions o) {
    o.heartbeat = std::chrono::milliseconds(1000);
    o.liveness = 3;
    opts_ = o;
    core_ = std::make_unique<BrokerCore>(opts_);
  }

  void Submit(const std::string& producer, std::vector<std::string> ids,
              const std::string& queue = "") {
    proto::Submit m;
    // Views must stay valid for the call only: the payloads live until the
    // end of this function (reserved, so no reallocation moves them).
    std::vector<std::string> payloads;
    payloads.reserve(ids.size());
    for (const auto& id : ids) {
      payloads.push_back("payload-" + id);
      m.batches.push_back({id, queue, payloads.back()});
    }
    core_->OnMessage(Socket::kFrontend, producer, m, clock_.Now());
  }
  // `concurrency` 0: the credit; `slots` 0: the concurrency (no prefetch).
  void Hello(const std::string& ident, const std::string& id, uint32_t credit,
             uint32_t concurrency = 0, uint32_t slots = 0,
             const std::string& incarnation = "") {
    core_->OnMessage(Socket::kBackend, ident,
                     proto::Hello{id, concurrency ? concurrency : credit, credit, {}, slots,
                                  incarnation},
                     clock_.Now());
  }
  void Done(const std::string& ident, const std::string& batch, uint32_t credit = 1,
            Outcome outcome = Outcome::kOk) {
    core_->OnMessage(Socket::kBackend, ident,
                     proto::Done{credit, {{batch, 1, outcome, "out-" + batch, ""}}},
                     clock_.Now());
  }
  ErrorCode Control(const std::string& op, std::vector<std::string> args) {
    std::vector<std::string_view> views(args.begin(), args.end());
    core_->OnMessage(Socket::kControl, "ctl", proto::Control{++req_, op, views}, clock_.Now());
    auto& frames = core_->outbox().frames;
    for (auto it = frames.begin(); it != frames.end(); ++it) {
      if (it->socket != Socket::kControl) continue;
      auto d = proto::Decode(it->body.data(), it->body.size());
      if (auto* r = std::get_if<proto::ControlReply>(&*d.message)) {
        ErrorCode code = r->code;
        last_reply_ = std::string(r->message);
        frames.erase(it);
        return code;
      }
    }
    ADD_FAILURE() << "no control reply";
    return ErrorCode::kMalformed;
  }

  // Pumps, then takes what would be dispatched to `worker` (ids) and clears
  // the outbox as the server's flush does.
  std::map<std::string, std::vector<std::string>> PumpAndFlush() {
    core_->Pump(clock_.Now());
    std::map<std::string, std::vector<std::string>> sent;
    for (auto& wid : core_->outbox().dispatch_workers) {
      Worker* w = core_->workers().Find(wid);
      if (w == nullptr) continue;
      for (BatchSeq s : w->outgoing) sent[wid].emplace_back(core_->batches().Get(s)->id);
      w->outgoing.clear();
    }
    for (auto& [ident, po] : core_->outbox().producers) {
      for (auto& [id, r] : po.results) results_[ident].push_back(id);
      for (auto& id : po.accepted) accepted_[ident].push_back(id);
      for (auto& r : po.rejected) rejected_[ident].push_back(r.code);
      for (auto& id : po.unknown) unknown_[ident].push_back(id);
    }
    for (auto& f : core_->outbox().frames) {
      auto d = proto::Decode(f.body.data(), f.body.size());
      EXPECT_TRUE(d.ok()) << d.detail;
      if (!d.ok()) continue;
      frames_[f.identity].push_back(proto::CommandOf(*d.message));
      if (auto* s = std::get_if<proto::Stop>(&*d.message)) stops_[f.identity] = std::string(s->reason);
    }
    core_->outbox().clear();
    core_->AfterFlush(clock_.Now());
    return sent;
  }

  size_t CountFrames(const std::string& ident, proto::Command c) {
    size_t n = 0;
    for (auto x : frames_[ident]) n += x == c;
    return n;
  }

  FakeClock clock_;
  BrokerOptions opts_;
  std::unique_ptr<BrokerCore> core_;
  std::uint64_t req_ = 0;
  std::string last_reply_;
  std::map<std::string, std::vector<std::string>> results_, accepted_, unknown_;
  std::map<std::string, std::vector<ErrorCode>> rejected_;
  std::map<std::string, std::vector<proto::Command>> frames_;
  std::map<std::string, std::string> stops_;
};

// Outbox::For finds a producer's part again without hashing its identity
// when asked for the same producer in a row, and never hands out a part
// that clear() dropped.
TEST(OutboxTest, ForFindsAProducersPartAgainAndStartsAfreshAfterClear) {
  Outbox out;
  std::string identity = "P1";
  Outbox::ProducerOut& p1 = out.For(identity);
  p1.accepted.push_back("a");
  identity = "P2";  // the caller's buffer now says P2: a new producer
  Outbox::ProducerOut& p2 = out.For(identity);
  EXPECT_NE(&p2, &p1);
  EXPECT_TRUE(p2.accepted.empty());
  EXPECT_EQ(out.producers.size(), 2u);
  EXPECT_EQ(&out.For("P1"), &p1) << "found again after another producer";
  EXPECT_EQ(out.producers.size(), 2u);
  EXPECT_EQ(out.producers.at("P1").accepted, (std::vector<std::string>{"a"}));
  out.clear();
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(out.For("P1").accepted.empty()) << "a new part after clear";
  EXPECT_EQ(out.producers.size(), 1u);
}

TEST_F(BrokerCoreTest, NeverDispatchesMoreThanCredit) {
  Hello("W1", "w1", 2);
  Submit("P", {"a", "b", "c", "d", "e"});
  auto sent = PumpAndFlush();
  ASSERT_EQ(sent["w1"].size(), 2u);
  EXPECT_EQ(core_->workers().Find("w1")->held.size(), 2u);
  EXPECT_EQ(core_->batches().queued(), 3u);
  // Nothing more without new credit.
  EXPECT_TRUE(PumpAndFlush().empty());
  Done("W1", "a", 1);
  sent = PumpAndFlush();
  ASSERT_EQ(sent["w1"].size(), 1u);
  EXPECT_EQ(sent["w1"][0], "c");
  EXPECT_EQ(results_["P"], std::vector<std::string>{"a"});
  // Credit beyond concurrency - held is ignored.
  Done("W1", "b", 50);
  sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"].size(), 1u);
  EXPECT_LE(core_->workers().Find("w1")->held.size(), 2u);
}

// The dispatch rule (broker/dispatch_rule.cc): pack onto the most recently
// busy worker with a free slot, so that under a trickle the others stay
// idle and can be retired.
TEST_F(BrokerCoreTest, TrickleGoesToTheMostRecentlyBusyWorkerAndTheRestStayIdle) {
  for (const char* w : {"w1", "w2", "w3", "w4"}) Hello(std::string("W") + w[1], w, 1);
  // w3 finishes last, so it is the most recently busy one.
  Submit("P", {"a", "b", "c"});
  auto first = PumpAndFlush();
  ASSERT_EQ(first["w1"], std::vector<std::string>{"a"});
  ASSERT_EQ(first["w2"], std::vector<std::string>{"b"});
  ASSERT_EQ(first["w3"], std::vector<std::string>{"c"});
  Done("W1", "a");
  Done("W2", "b");
  Done("W3", "c");
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(std::chrono::milliseconds(100));
    const std::string id = "t" + std::to_string(i);
    Submit("P", {id});
    auto sent = PumpAndFlush();
    ASSERT_EQ(sent["w3"], std::vector<std::string>{id}) << "batch " << i;
    Done("W3", id);
  }
  const TimePoint now = clock_.Now();
  EXPECT_EQ(core_->workers().Find("w1")->IdleSeconds(now), 2.0);
  EXPECT_EQ(core_->workers().Find("w2")->IdleSeconds(now), 2.0);
  EXPECT_EQ(core_->workers().Find("w4")->IdleSeconds(now), 2.0);  // never had work
  EXPECT_EQ(core_->workers().Find("w3")->processed, 21u);
}

TEST_F(BrokerCoreTest, SaturatedFleetFillsEverySlotAndNewWorkersComeLast) {
  Hello("W1", "w1", 2);
  Hello("W2", "w2", 2);
  Hello("W3", "w3", 2);
  Submit("P", {"a"});
  auto one = PumpAndFlush();
  EXPECT_EQ(one["w1"], std::vector<std::string>{"a"});  // the first listed takes it
  Submit("P", {"b", "c", "d", "e", "f", "g"});
  auto sent = PumpAndFlush();
  // w1 is filled first (its second slot), then w2, then w3; g waits.
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"b"});
  EXPECT_EQ(sent["w2"], (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(sent["w3"], (std::vector<std::string>{"e", "f"}));
  EXPECT_EQ(core_->batches().queued(), 1u);
  // A slot frees: the waiting batch takes it at once.
  Done("W2", "c");
  EXPECT_EQ(PumpAndFlush()["w2"], std::vector<std::string>{"g"});
}

TEST_F(BrokerCoreTest, PrefetchCreditIsSpentOnlyWhenNoSlotIsFreeAndThenEvenly) {
  // Two workers of one slot and four prefetched batches each.
  Hello("W1", "w1", 5, 5, 1);
  Hello("W2", "w2", 5, 5, 1);
  Submit("P", {"a"});
  EXPECT_EQ(PumpAndFlush()["w1"], std::vector<std::string>{"a"});
  Submit("P", {"b"});
  EXPECT_EQ(PumpAndFlush()["w2"], std::vector<std::string>{"b"});  // w1's slot is busy
  Submit("P", {"c", "d", "e", "f", "g", "h"});
  auto sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"], (std::vector<std::string>{"c", "e", "g"}));
  EXPECT_EQ(sent["w2"], (std::vector<std::string>{"d", "f", "h"}));
  EXPECT_EQ(core_->workers().Find("w1")->slots, 1u);
  EXPECT_EQ(core_->workers().Find("w1")->concurrency, 5u);
}

TEST_F(BrokerCoreTest, PackingRespectsQueuesAndNeverReachesARetiringWorker) {
  core_->OnMessage(Socket::kBackend, "W1",
                   proto::Hello{"w1", 2, 2, {"gpu"}, 0, ""}, clock_.Now());
  Hello("W2", "w2", 2);
  Hello("W3", "w3", 2);
  ASSERT_EQ(Control("retire", {"w2"}), ErrorCode::kOk);
  Submit("P", {"a", "b"});              // default queue: w1 does not serve it
  Submit("P", {"g1"}, "gpu");
  auto sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"g1"});
  EXPECT_EQ(sent["w3"], (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(sent["w2"].empty());
  EXPECT_EQ(core_->counters().dispatched_to_retiring, 0u);
}

TEST_F(BrokerCoreTest, WorkerSilentPastLivenessIsDeadAndItsBatchesRequeued) {
  Hello("W1", "w1", 1);
  Submit("P", {"a"});
  PumpAndFlush();
  clock_.Advance(std::chrono::milliseconds(2900));
  core_->Tick(clock_.Now());
  EXPECT_NE(core_->workers().Find("w1"), nullptr);
  clock_.Advance(std::chrono::milliseconds(200));
  core_->Tick(clock_.Now());
  EXPECT_EQ(core_->workers().Find("w1"), nullptr);
  EXPECT_EQ(core_->counters().requeued, 1u);
  EXPECT_EQ(core_->counters().workers_dead, 1u);
  EXPECT_EQ(core_->batches().queued(), 1u);
  Hello("W2", "w2", 1);
  auto sent = PumpAndFlush();
  ASSERT_EQ(sent["w2"], std::vector<std::string>{"a"});
  EXPECT_EQ(core_->batches().Get(*core_->batches().FindId("a"))->attempts, 2u);
}

TEST_F(BrokerCoreTest, HeartbeatsIdleWorkersAndHeartbeatKeepsThemAlive) {
  Hello("W1", "w1", 1);
  PumpAndFlush();
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(std::chrono::milliseconds(1000));
    core_->OnMessage(Socket::kBackend, "W1", proto::Heartbeat{}, clock_.Now());
    core_->Tick(clock_.Now());
    PumpAndFlush();
  }
  EXPECT_NE(core_->workers().Find("w1"), nullptr);
  EXPECT_GE(CountFrames("W1", proto::Command::kHeartbeat), 9u);
}

TEST_F(BrokerCoreTest, LateResultFromDeadWorkerAcceptedOnceThenDuplicatesDropped) {
  Hello("W1", "w1", 1);
  Submit("P", {"a"});
  PumpAndFlush();
  clock_.Advance(std::chrono::seconds(4));
  core_->Tick(clock_.Now());
  Hello("W2", "w2", 1);
  PumpAndFlush();  // a goes to w2
  // w1 comes back (SIGCONT) and reports a: accepted, it has no result yet.
  Done("W1", "a");
  PumpAndFlush();
  EXPECT_EQ(results_["P"].size(), 1u);
  EXPECT_EQ(CountFrames("W1", proto::Command::kReset), 1u);
  EXPECT_TRUE(core_->workers().Find("w2")->held.empty());
  // w2's result for the same batch is a duplicate.
  Done("W2", "a");
  PumpAndFlush();
  EXPECT_EQ(results_["P"].size(), 1u);
  EXPECT_EQ(core_->counters().duplicates, 1u);
  EXPECT_EQ(core_->counters().completed_ok, 1u);
}

TEST_F(BrokerCoreTest, DeadLettersAfterMaxAttemptsWithReason) {
  BrokerOptions o;
  o.max_attempts = 2;
  Reset(o);
  for (int round = 0; round < 2; ++round) {
    std::string ident = "W" + std::to_string(round);
    if (round == 0) Submit("P", {"poison"});
    Hello(ident, "w" + std::to_string(round), 1);
    PumpAndFlush();
    clock_.Advance(std::chrono::seconds(4));
    core_->Tick(clock_.Now());
    PumpAndFlush();
  }
  ASSERT_EQ(results_["P"], std::vector<std::string>{"poison"});
  auto r = core_->results().Find("poison");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->outcome, Outcome::kFailed);
  EXPECT_NE(r->error.find("dead-lettered after 2 attempts"), std::string::npos) << r->error;
  EXPECT_EQ(core_->counters().dead_lettered, 1u);
}

// DONE outcome retry (a worker's handler died mid-batch): the holder's
// retry requeues the batch at the front and frees the worker's credit;
// anyone else's is a duplicate; --max-attempts still dead-letters it.
TEST_F(BrokerCoreTest, RetryFromTheHolderRequeuesAndDeadLettersAtMaxAttempts) {
  BrokerOptions o;
  o.max_attempts = 2;
  Reset(o);
  Hello("W1", "w1", 1);
  Hello("W2", "w2", 1);
  Submit("P", {"r", "s"});
  auto sent = PumpAndFlush();
  const std::string holder = sent["w1"] == std::vector<std::string>{"r"} ? "W1" : "W2";
  const std::string other = holder == "W1" ? "W2" : "W1";
  ASSERT_EQ(sent[holder == "W1" ? "w1" : "w2"], std::vector<std::string>{"r"});
  // From the worker that does not hold it, or for another attempt: ignored.
  Done(other, "r", 0, Outcome::kRetry);
  core_->OnMessage(Socket::kBackend, holder,
                   proto::Done{0, {{"r", 7, Outcome::kRetry, "", "stale"}}}, clock_.Now());
  PumpAndFlush();
  EXPECT_EQ(core_->counters().duplicates, 2u);
  EXPECT_EQ(core_->counters().requeued, 0u);
  // From the holder: requeued, and dispatched again with its credit back.
  Done(holder, "r", 1, Outcome::kRetry);
  sent = PumpAndFlush();
  EXPECT_EQ(core_->counters().requeued, 1u);
  EXPECT_TRUE(results_["P"].empty());
  const std::string again = sent["w1"] == std::vector<std::string>{"r"} ? "W1" : "W2";
  ASSERT_EQ(sent[again == "W1" ? "w1" : "w2"], std::vector<std::string>{"r"});
  EXPECT_EQ(core_->batches().Get(*core_->batches().FindId("r"))->attempts, 2u);
  // The second retry is the last attempt: dead-lettered with the reason.
  core_->OnMessage(Socket::kBackend, again,
                   proto::Done{1, {{"r", 2, Outcome::kRetry, "", "handler exited (x)"}}},
                   clock_.Now());
  PumpAndFlush();
  ASSERT_EQ(results_["P"], std::vector<std::string>{"r"});
  auto r = core_->results().Find("r");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->outcome, Outcome::kFailed);
  EXPECT_NE(r->error.find("dead-lettered after 2 attempts; last worker w"), std::string::npos)
      << r->error;
  EXPECT_NE(r->error.find("asked for a retry: handler exited (x)"), std::string::npos) << r->error;
}

TEST_F(BrokerCoreTest, QueueFullIsRejectedNotDropped) {
  BrokerOptions o;
  o.max_queue = 2;
  Reset(o);
  Submit("P", {"a", "b", "c"});
  PumpAndFlush();
  EXPECT_EQ(accepted_["P"].size(), 2u);
  ASSERT_EQ(rejected_["P"].size(), 1u);
  EXPECT_EQ(rejected_["P"][0], ErrorCode::kQueueFull);
  EXPECT_EQ(core_->counters().rejected_queue_full, 1u);
}

TEST_F(BrokerCoreTest, QueueBytesCapRejectsUntilRunningBatchesFinish) {
  BrokerOptions o;
  o.max_queue_bytes = 20;  // "payload-a" is 9 bytes: two fit
  Reset(o);
  Hello("W1", "w1", 1);
  Submit("P", {"a", "b", "c"});
  PumpAndFlush();
  EXPECT_EQ(accepted_["P"], (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(rejected_["P"].size(), 1u);
  EXPECT_EQ(rejected_["P"][0], ErrorCode::kQueueFull);
  EXPECT_EQ(core_->batches().bytes(), 18u);  // running "a" still counts
  Done("W1", "a");
  PumpAndFlush();
  EXPECT_EQ(core_->batches().bytes(), 9u);
  Submit("P", {"c"});
  PumpAndFlush();
  EXPECT_EQ(accepted_["P"].back(), "c");
  EXPECT_EQ(core_->counters().rejected_queue_full, 1u);
}

TEST_F(BrokerCoreTest, PerProducerLimitKeepsOneProducerFromFillingTheQueue) {
  BrokerOptions o;
  o.max_inflight_per_producer = 2;
  Reset(o);
  Submit("flood", {"f1", "f2", "f3"});
  Submit("calm", {"c1"});
  PumpAndFlush();
  EXPECT_EQ(accepted_["flood"], (std::vector<std::string>{"f1", "f2"}));
  ASSERT_EQ(rejected_["flood"].size(), 1u);
  EXPECT_EQ(rejected_["flood"][0], ErrorCode::kQueueFull);
  EXPECT_EQ(accepted_["calm"], std::vector<std::string>{"c1"});
  // A batch handed to another connection counts for that one.
  Submit("calm", {"f1"});
  PumpAndFlush();
  EXPECT_EQ(core_->batches().OwnedBy("flood"), 1u);
  EXPECT_EQ(core_->batches().OwnedBy("calm"), 2u);
  Submit("flood", {"f3"});
  PumpAndFlush();
  EXPECT_EQ(accepted_["flood"].back(), "f3");
  // Finished batches free the producer's share.
  Hello("W1", "w1", 4);
  PumpAndFlush();
  Done("W1", "c1");
  PumpAndFlush();
  EXPECT_EQ(core_->batches().OwnedBy("calm"), 1u);
}

TEST_F(BrokerCoreTest, OversizedAndEmptyIdBatchesAreRejectedAlone) {
  BrokerOptions o;
  o.max_batch_bytes = 4;
  Reset(o);
  core_->OnMessage(Socket::kFrontend, "P",
                   proto::Submit{{{"ok", "", "1234"}, {"big", "", "12345"}, {"", "", "1"}}},
                   clock_.Now());
  PumpAndFlush();
  EXPECT_EQ(accepted_["P"], std::vector<std::string>{"ok"});
  ASSERT_EQ(rejected_["P"].size(), 2u);
  EXPECT_EQ(rejected_["P"][0], ErrorCode::kTooLarge);
  EXPECT_EQ(rejected_["P"][1], ErrorCode::kInvalidArgument);
}

TEST_F(BrokerCoreTest, ResubmittedIdIsNeverRunTwice) {
  Hello("W1", "w1", 4);
  Submit("P", {"a"});
  Submit("P", {"a"});  // queued: same batch
  auto sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"].size(), 1u);
  Submit("P2", {"a"});  // running: re-owned by the new connection
  PumpAndFlush();
  Done("W1", "a");
  PumpAndFlush();
  EXPECT_TRUE(results_["P"].empty());
  EXPECT_EQ(results_["P2"].size(), 1u);
  Submit("P3", {"a"});  // finished: the stored result, not a new run
  sent = PumpAndFlush();
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(results_["P3"].size(), 1u);
  EXPECT_EQ(core_->counters().submitted, 1u);
  EXPECT_EQ(core_->counters().resubmitted, 3u);
}

TEST_F(BrokerCoreTest, FetchAnswersFinishedAndUnknownIds) {
  Hello("W1", "w1", 1);
  Submit("P", {"a"});
  PumpAndFlush();
  Done("W1", "a");
  PumpAndFlush();
  core_->OnMessage(Socket::kFrontend, "P9", proto::Fetch{{"a", "nope"}}, clock_.Now());
  PumpAndFlush();
  EXPECT_EQ(results_["P9"], std::vector<std::string>{"a"});
  EXPECT_EQ(unknown_["P9"], std::vector<std::string>{"nope"});
}

TEST_F(BrokerCoreTest, RetireIfIdleRefusedWhileBusyAndRetireDrainsThenStops) {
  Hello("W1", "w1", 2);
  Submit("P", {"a"});
  PumpAndFlush();
  EXPECT_EQ(Control("retire-if-idle", {"w1"}), ErrorCode::kBusy);
  EXPECT_FALSE(core_->workers().Find("w1")->retiring);
  EXPECT_EQ(Control("retire", {"w1"}), ErrorCode::kOk);
  Submit("P", {"b"});
  auto sent = PumpAndFlush();
  EXPECT_TRUE(sent.empty()) << "retiring worker got new work";
  EXPECT_EQ(CountFrames("W1", proto::Command::kStop), 0u);
  clock_.Advance(opts_.retire_linger);  // its batch ran longer than the linger
  Done("W1", "a");
  PumpAndFlush();
  EXPECT_EQ(CountFrames("W1", proto::Command::kStop), 1u);
  EXPECT_EQ(results_["P"].size(), 1u);
  EXPECT_EQ(core_->counters().completed_failed, 0u);
  core_->OnMessage(Socket::kBackend, "W1", proto::Bye{}, clock_.Now());
  EXPECT_EQ(core_->workers().Find("w1"), nullptr);
  // Coming back within the TTL: told to stop, no work.
  Hello("W1b", "w1", 2);
  sent = PumpAndFlush();
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(CountFrames("W1b", proto::Command::kStop), 1u);
  EXPECT_NE(stops_["W1b"].find("blacklisted"), std::string::npos);
  EXPECT_EQ(core_->workers().Find("w1"), nullptr);
  // After the TTL it may work again.
  clock_.Advance(opts_.blacklist_ttl + std::chrono::seconds(1));
  core_->Tick(clock_.Now());
  Hello("W1c", "w1", 2);
  sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"b"});
}

TEST_F(BrokerCoreTest, RetireIfIdleStopsAnIdleWorkerOnceTheLingerIsOver) {
  Hello("W1", "w1", 1);
  PumpAndFlush();
  EXPECT_EQ(Control("retire-if-idle", {"w1"}), ErrorCode::kOk);
  PumpAndFlush();
  EXPECT_EQ(core_->workers().Find("w1")->state(), WorkerState::kRetiring);
  EXPECT_EQ(CountFrames("W1", proto::Command::kStop), 0u);
  clock_.Advance(opts_.retire_linger);
  core_->Tick(clock_.Now());
  PumpAndFlush();
  EXPECT_EQ(CountFrames("W1", proto::Command::kStop), 1u);
}

TEST_F(BrokerCoreTest, IdleRetiredWorkerTakenBackWithinTheLingerGetsWorkAgain) {
  Hello("W1", "w1", 1);
  PumpAndFlush();
  EXPECT_EQ(Control("retire-if-idle", {"w1"}), ErrorCode::kOk);
  Submit("P", {"a"});
  EXPECT_TRUE(PumpAndFlush().empty());  // retiring: nothing new
  clock_.Advance(opts_.retire_linger / 2);
  core_->Tick(clock_.Now());
  EXPECT_EQ(Control("unretire", {"w1"}), ErrorCode::kOk);
  auto sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"a"});
  clock_.Advance(opts_.retire_linger);
  core_->Tick(clock_.Now());
  PumpAndFlush();
  EXPECT_EQ(CountFrames("W1", proto::Command::kStop), 0u);
}

TEST_F(BrokerCoreTest, WithNoLingerAnIdleRetiredWorkerIsStoppedAtOnce) {
  BrokerOptions o;
  o.retire_linger = Duration(0);
  Reset(o);
  Hello("W1", "w1", 1);
  PumpAndFlush();
  EXPECT_EQ(Control("retire-if-idle", {"w1"}), ErrorCode::kOk);
  PumpAndFlush();
  EXPECT_EQ(CountFrames("W1", proto::Command::kStop), 1u);
}

TEST_F(BrokerCoreTest, UnretireCancelsRetirementOfAConnectedWorker) {
  Hello("W1", "w1", 1);
  Submit("P", {"a"});
  PumpAndFlush();
  EXPECT_EQ(Control("retire", {"w1"}), ErrorCode::kOk);
  EXPECT_EQ(Control("unretire", {"w1"}), ErrorCode::kOk);
  EXPECT_FALSE(core_->blacklist().Contains("w1", clock_.Now()));
  Done("W1", "a");
  Submit("P", {"b"});
  auto sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"b"});
  EXPECT_EQ(CountFrames("W1", proto::Command::kStop), 0u);
  EXPECT_EQ(Control("unretire", {"w1"}), ErrorCode::kNotRetiring);
  EXPECT_EQ(Control("retire", {"nobody"}), ErrorCode::kUnknownWorker);
  EXPECT_EQ(Control("explode", {}), ErrorCode::kInvalidArgument);
}

// Control replies in the outbox, taken out of it: (peer, request id, code, message).
struct HeldReply {
  std::string peer;
  std::uint64_t request_id;
  ErrorCode code;
  std::string message;
};
std::vector<HeldReply> TakeControlReplies(Outbox& out) {
  std::vector<HeldReply> got;
  auto& frames = out.frames;
  for (auto it = frames.begin(); it != frames.end();) {
    auto d = proto::Decode(it->body.data(), it->body.size());
    auto* r = d.ok() ? std::get_if<proto::ControlReply>(&*d.message) : nullptr;
    if (it->socket != Socket::kControl || r == nullptr) {
      ++it;
      continue;
    }
    got.push_back({it->identity, r->request_id, r->code, std::string(r->message)});
    it = frames.erase(it);
  }
  return got;
}

TEST_F(BrokerCoreTest, WaitDemandIsAnsweredWhenABatchWaitsOrWhenItsDeadlinePasses) {
  auto wait = [&](const std::string& peer, std::uint64_t id, const std::string& ms) {
    core_->OnMessage(Socket::kControl, peer, proto::Control{id, "wait-demand", {ms}},
                     clock_.Now());
  };
  // Nothing queued: the request is held, with no reply.
  wait("A", 7, "5000");
  wait("B", 8, "60000");
  core_->Pump(clock_.Now());
  core_->Tick(clock_.Now());
  EXPECT_TRUE(TakeControlReplies(core_->outbox()).empty());

  // A batch that no worker can take answers both, with the depth.
  Submit("P", {"a", "b"});
  core_->Pump(clock_.Now());
  auto replies = TakeControlReplies(core_->outbox());
  ASSERT_EQ(replies.size(), 2u);
  for (const auto& r : replies) {
    EXPECT_EQ(r.code, ErrorCode::kOk);
    EXPECT_EQ(r.message, "demand queued=2");
    EXPECT_EQ(r.request_id, r.peer == "A" ? 7u : 8u);
  }
  // Answered once: a later pump sends nothing more.
  core_->Pump(clock_.Now());
  EXPECT_TRUE(TakeControlReplies(core_->outbox()).empty());

  // Work already waiting: answered at once.
  wait("A", 9, "5000");
  replies = TakeControlReplies(core_->outbox());
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].request_id, 9u);
  EXPECT_EQ(replies[0].message, "demand queued=2");

  // Drain the queue; then a request whose deadline passes gets "no demand"
  // at the next tick, and one asked again replaces the earlier one.
  Hello("W1", "w1", 2);
  PumpAndFlush();
  ASSERT_EQ(core_->batches().queued(), 0u);
  wait("A", 10, "1000");
  wait("A", 11, "1000");
  wait("B", 12, "3000");
  clock_.Advance(std::chrono::milliseconds(999));
  core_->Tick(clock_.Now());
  EXPECT_TRUE(TakeControlReplies(core_->outbox()).empty());
  clock_.Advance(std::chrono::milliseconds(1));
  core_->Tick(clock_.Now());
  replies = TakeControlReplies(core_->outbox());
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].peer, "A");
  EXPECT_EQ(replies[0].request_id, 11u);
  EXPECT_EQ(replies[0].message, "no demand");
  // B still waits, and hears of the next batch.
  Submit("P", {"c", "d", "e"});
  core_->Pump(clock_.Now());
  replies = TakeControlReplies(core_->outbox());
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].peer, "B");
  EXPECT_EQ(replies[0].message, "demand queued=3");  // w1 holds a and b: no credit left
}

TEST_F(BrokerCoreTest, WaitDemandRefusesBadWaitsAndTooManyWaiters) {
  for (const char* bad : {"0", "600001", "-5", "", "12a", "99999999"}) {
    EXPECT_EQ(Control("wait-demand", {bad}), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(Control("wait-demand", {}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Control("wait-demand", {"10", "20"}), ErrorCode::kInvalidArgument);
  for (int i = 0; i < 64; ++i) {
    core_->OnMessage(Socket::kControl, "peer" + std::to_string(i),
                     proto::Control{1, "wait-demand", {"600000"}}, clock_.Now());
  }
  EXPECT_TRUE(TakeControlReplies(core_->outbox()).empty());
  EXPECT_EQ(Control("wait-demand", {"1000"}), ErrorCode::kTooLarge);
  Submit("P", {"a"});
  core_->Pump(clock_.Now());
  EXPECT_EQ(TakeControlReplies(core_->outbox()).size(), 64u);
}

TEST_F(BrokerCoreTest, DrainingWorkerGetsNothingNewAndIsNotBlacklisted) {
  Hello("W1", "w1", 2);
  core_->OnMessage(Socket::kBackend, "W1", proto::Drain{}, clock_.Now());
  Submit("P", {"a"});
  EXPECT_TRUE(PumpAndFlush().empty());
  core_->OnMessage(Socket::kBackend, "W1", proto::Bye{}, clock_.Now());
  EXPECT_FALSE(core_->blacklist().Contains("w1", clock_.Now()));
}

TEST_F(BrokerCoreTest, ReconnectOfTheSameProcessRequeuesWhatTheOldConnectionHeld) {
  Hello("W1", "w1", 1, 0, 0, "run-1");
  Submit("P", {"a"});
  PumpAndFlush();
  Hello("W1-new", "w1", 1, 0, 0, "run-1");
  auto sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"a"});
  EXPECT_EQ(core_->workers().Find("w1")->identity, "W1-new");
  EXPECT_EQ(core_->counters().duplicate_worker_refusals, 0u);
}

TEST_F(BrokerCoreTest, SecondLiveProcessWithTheSameIdIsRefusedAndTheFirstKeepsItsWork) {
  Hello("W1", "w1", 2, 0, 0, "run-1");
  Submit("P", {"a"});
  PumpAndFlush();
  clock_.Advance(std::chrono::milliseconds(500));
  Hello("W1-other", "w1", 2, 0, 0, "run-2");
  PumpAndFlush();
  EXPECT_EQ(CountFrames("W1-other", proto::Command::kError), 1u);
  EXPECT_EQ(CountFrames("W1-other", proto::Command::kWelcome), 0u);
  EXPECT_EQ(core_->counters().duplicate_worker_refusals, 1u);
  const Worker* w = core_->workers().Find("w1");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->identity, "W1");
  EXPECT_EQ(w->held.size(), 1u);
  EXPECT_EQ(w->credit, 1u);
  // The first connection is probed at once (a HEARTBEAT), and keeps working.
  EXPECT_EQ(CountFrames("W1", proto::Command::kHeartbeat), 1u);
  Submit("P", {"b"});
  EXPECT_EQ(PumpAndFlush()["w1"], std::vector<std::string>{"b"});
  // A HELLO without an incarnation (a 4-field HELLO) is no proof either.
  Hello("W1-third", "w1", 2);
  PumpAndFlush();
  EXPECT_EQ(core_->counters().duplicate_worker_refusals, 2u);
}

// A worker restarted quickly under the same id: the old connection is dead
// but the broker has not declared it so.
TEST_F(BrokerCoreTest, RestartedWorkerGetsInOnceTheOldConnectionMissedItsHeartbeats) {
  Hello("W1", "w1", 1, 0, 0, "run-1");
  Submit("P", {"a"});
  PumpAndFlush();
  clock_.Advance(std::chrono::milliseconds(1500));
  Hello("W1-new", "w1", 1, 0, 0, "run-2");
  PumpAndFlush();
  EXPECT_EQ(core_->workers().Find("w1")->identity, "W1");  // heard 1.5 s ago: alive
  clock_.Advance(std::chrono::milliseconds(600));          // 2.1 s: two beats missed
  Hello("W1-new", "w1", 1, 0, 0, "run-2");
  auto sent = PumpAndFlush();
  EXPECT_EQ(core_->workers().Find("w1")->identity, "W1-new");
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"a"});  // requeued, runs again
}

// Or sooner: the probe to the old connection cannot be sent (libzmq knows
// the peer is gone), so the loop drops it and the retried HELLO gets in.
TEST_F(BrokerCoreTest, OldConnectionWhoseProbeCannotBeSentIsDroppedAtOnce) {
  Hello("W1", "w1", 1, 0, 0, "run-1");
  Submit("P", {"a"});
  PumpAndFlush();
  Hello("W1-new", "w1", 1, 0, 0, "run-2");
  core_->OnUndeliverable(Socket::kBackend, "W1", clock_.Now());
  EXPECT_EQ(core_->workers().Find("w1"), nullptr);
  EXPECT_EQ(core_->counters().workers_dead, 1u);
  EXPECT_EQ(core_->counters().requeued, 1u);
  PumpAndFlush();
  Hello("W1-new", "w1", 1, 0, 0, "run-2");
  EXPECT_EQ(PumpAndFlush()["w1"], std::vector<std::string>{"a"});
  EXPECT_EQ(core_->batches().Get(*core_->batches().FindId("a"))->attempts, 2u);
}

// A dispatch split over several messages, the second of which could not be
// sent: the first may have reached the worker, so its batches keep their
// attempt; the unsent ones get theirs back.
TEST_F(BrokerCoreTest, FailedDispatchGivesBackOnlyTheAttemptsOfBatchesNeverSent) {
  Hello("W1", "w1", 4);
  Submit("P", {"a", "b", "c", "d"});
  core_->Pump(clock_.Now());
  Worker* w = core_->workers().Find("w1");
  ASSERT_EQ(w->outgoing.size(), 4u);
  core_->OnDispatchFailed("w1", 2, clock_.Now());
  EXPECT_EQ(core_->workers().Find("w1"), nullptr);
  EXPECT_EQ(core_->batches().queued(), 4u);
  auto attempts = [&](const char* id) {
    return core_->batches().Get(*core_->batches().FindId(id))->attempts;
  };
  EXPECT_EQ(attempts("a"), 1u);
  EXPECT_EQ(attempts("b"), 1u);
  EXPECT_EQ(attempts("c"), 0u);
  EXPECT_EQ(attempts("d"), 0u);
}

// The batches of a worker that is dropped go back in the order they came.
TEST_F(BrokerCoreTest, DroppedWorkersBatchesGoBackToTheirQueueInTheirOrder) {
  Hello("W1", "w1", 4);
  Submit("P", {"a", "b"});
  PumpAndFlush();  // a and b left for w1
  Submit("P", {"c", "d", "e"});
  core_->Pump(clock_.Now());  // c, d for w1's last credit; e waits
  core_->OnDispatchFailed("w1", 0, clock_.Now());
  Hello("W2", "w2", 8);
  EXPECT_EQ(PumpAndFlush()["w2"], (std::vector<std::string>{"a", "b", "c", "d", "e"}));
}

// A refused CONTROL that still had a readable request id is answered under
// it, so the client matches the answer; one without gets ERROR.
TEST_F(BrokerCoreTest, RefusedControlIsAnsweredUnderItsRequestId) {
  core_->OnBadInput(Socket::kControl, "C", ErrorCode::kMalformed, "args: expected an array",
                    std::uint64_t{41});
  core_->OnBadInput(Socket::kControl, "D", ErrorCode::kMalformed, "junk");
  bool replied = false;
  for (const auto& f : core_->outbox().frames) {
    auto d = proto::Decode(f.body.data(), f.body.size());
    ASSERT_TRUE(d.ok());
    if (f.identity == "C") {
      const auto* r = std::get_if<proto::ControlReply>(&*d.message);
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(r->request_id, 41u);
      EXPECT_EQ(r->code, ErrorCode::kMalformed);
      replied = true;
    } else {
      EXPECT_NE(std::get_if<proto::Error>(&*d.message), nullptr);
    }
  }
  EXPECT_TRUE(replied);
}

TEST_F(BrokerCoreTest, BadInputIsCountedAndAnsweredWithError) {
  core_->OnBadInput(Socket::kFrontend, "X", ErrorCode::kMalformed, "junk");
  // A worker command on the producer socket.
  core_->OnMessage(Socket::kFrontend, "X", proto::Heartbeat{}, clock_.Now());
  PumpAndFlush();
  EXPECT_EQ(core_->counters().malformed, 2u);
  EXPECT_EQ(CountFrames("X", proto::Command::kError), 2u);
}

TEST_F(BrokerCoreTest, IdleSecondsCountFromLastResult) {
  Hello("W1", "w1", 1);
  Submit("P", {"a"});
  PumpAndFlush();
  clock_.Advance(std::chrono::seconds(5));
  EXPECT_EQ(core_->workers().Find("w1")->IdleSeconds(clock_.Now()), 0.0);
  Done("W1", "a");
  clock_.Advance(std::chrono::seconds(2));
  EXPECT_DOUBLE_EQ(core_->workers().Find("w1")->IdleSeconds(clock_.Now()), 2.0);
}

}  // namespace
}  // namespace fleet::broker

namespace fleet::broker {
namespace {

TEST_F(BrokerCoreTest, ResultsPastTheRetainedCountAreDeliveredThenTrimmed) {
  BrokerOptions o;
  o.max_retained_results = 1;
  Reset(o);
  Hello("W1", "w1", 2);
  Submit("P", {"a", "b"});
  PumpAndFlush();
  core_->OnMessage(Socket::kBackend, "W1",
                   proto::Done{2, {{"a", 1, Outcome::kOk, "ra", ""}, {"b", 1, Outcome::kOk, "rb", ""}}},
                   clock_.Now());
  // Both results reach the outbox whole, though only one may be retained.
  auto it = core_->outbox().producers.find("P");
  ASSERT_NE(it, core_->outbox().producers.end());
  auto& results = it->second.results;
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].second->result, "ra");
  EXPECT_EQ(results[1].second->result, "rb");
  // After the flush the store keeps the newest one only.
  PumpAndFlush();
  EXPECT_EQ(core_->results().size(), 1u);
  EXPECT_EQ(core_->results().evicted_early(), 1u);
  EXPECT_EQ(core_->results().Find("a"), nullptr);
  ASSERT_NE(core_->results().Find("b"), nullptr);
}

TEST_F(BrokerCoreTest, DeadLetteredResultIsDeliveredEvenWithZeroRetention) {
  BrokerOptions o;
  o.max_attempts = 1;
  o.result_retention = Duration(0);
  Reset(o);
  Hello("W1", "w1", 1);
  Submit("P", {"a"});
  PumpAndFlush();
  clock_.Advance(std::chrono::seconds(4));
  core_->Tick(clock_.Now());  // dead-letters; the flush's trim would expire it
  auto it = core_->outbox().producers.find("P");
  ASSERT_NE(it, core_->outbox().producers.end());
  ASSERT_EQ(it->second.results.size(), 1u);
  EXPECT_EQ(it->second.results[0].second->outcome, Outcome::kFailed);
}

TEST_F(BrokerCoreTest, OversizedResultBecomesAFailureAndLongErrorsAreCut) {
  BrokerOptions o;
  o.max_batch_bytes = 12;  // payloads "payload-a" fit, a 13-byte result not
  Reset(o);
  Hello("W1", "w1", 2);
  Submit("P", {"a", "b"});
  PumpAndFlush();
  std::string long_error(100000, 'e');
  core_->OnMessage(Socket::kBackend, "W1",
                   proto::Done{2, {{"a", 1, Outcome::kOk, "0123456789abc", ""},
                                   {"b", 1, Outcome::kFailed, "", long_error}}},
                   clock_.Now());
  auto it = core_->outbox().producers.find("P");
  ASSERT_NE(it, core_->outbox().producers.end());
  auto& results = it->second.results;
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].second->outcome, Outcome::kFailed);
  EXPECT_NE(results[0].second->error.find("--max-batch-bytes"), std::string::npos);
  EXPECT_LT(results[1].second->error.size(), long_error.size());
  EXPECT_FALSE(results[1].second->error.empty());
}

}  // namespace
}  // namespace fleet::broker

namespace fleet::broker {
namespace {

// Durable mode: the attempts a batch has used survive a restart from the
// journal (and a compaction), and a batch that was on its last attempt when
// the broker stopped is dead-lettered at once instead of running again.
class BrokerCoreJournalTest : public BrokerCoreTest {
 protected:
  BrokerCoreJournalTest() {
    jo_.dir = dir_.File("data");
    jo_.io = &io_;
    o_.max_attempts = 3;
    Restart();
  }
  // A new core replays the journal, as a broker start does. `clean`: the
  // last one stopped as the server does (BrokerServer::Run appends the
  // records waiting for a write, then the journal writes what it buffers
  // as it closes); otherwise it crashed after its last write.
  void Restart(bool clean = true) {
    std::optional<std::uint64_t> free;
    if (journal_ && clean) {
      core_->AppendDueRecords();
      journal_->Commit();
    } else if (journal_) {
      free = io_.free();
      io_.SetFree(0);  // the journal cannot write what it buffers as it closes
    }
    journal_.reset();
    if (!clean) io_.SetFree(free);
    journal_.reset();
    Reset(o_);
    jo_.record_key = records::BatchId;
    jo_.item_types = {records::kFinishedIds};
    journal_ = Journal::Open(
        jo_, [&](std::uint64_t segment, std::uint8_t type, std::string_view body) {
          core_->Restore(segment, type, body, clock_.Now());
        });
    core_->SetJournal(journal_.get());
    restored_dead_ = core_->FinishRestore(clock_.Now());
  }
  // Dispatches to a fresh worker that then dies: one attempt used.
  void RunOnAWorkerThatDies(const std::string& name) {
    Hello("I-" + name, name, 1);
    PumpAndFlush();
    clock_.Advance(std::chrono::seconds(4));
    core_->Tick(clock_.Now());
    PumpAndFlush();
  }
  // Fills old segments with finished batches around the live ones and
  // compacts them.
  void Compact() {
    jo_.segment_bytes = 256;
    Restart();
    // A worker of its own queue, so the batches under test stay where they are.
    const std::string_view fill = "fill";
    core_->OnMessage(Socket::kBackend, "I-filler", proto::Hello{"filler", 1, 1, {fill}, 1, ""},
                     clock_.Now());
    for (int i = 0; i < 40; ++i) {
      const std::string id = "filler-" + std::to_string(i);
      Submit("F", {id}, "fill");
      PumpAndFlush();
      Done("I-filler", {id});
      Commit();
    }
    const std::uint64_t before = journal_->stats().compactions;
    journal_->Maintain([&](std::uint64_t upto) { return core_->LiveIds(upto); });
    journal_->WaitForCompaction();
    ASSERT_EQ(journal_->stats().compactions, before + 1);
  }
  Journal::CommitResult Commit() {
    const Journal::CommitResult r = journal_->Commit();
    core_->AfterCommit(r, clock_.Now());
    return r;
  }
  std::uint32_t Attempts(const std::string& id) {
    auto seq = core_->batches().FindId(id);
    return seq ? core_->batches().Get(*seq)->attempts : 0;
  }

  // One loop turn as the server runs it: dispatch, commit, send.
  std::map<std::string, std::vector<std::string>> Turn() {
    core_->Pump(clock_.Now());
    Commit();
    return PumpAndFlush();
  }
  std::size_t Count(const std::vector<ErrorCode>& codes, ErrorCode code) {
    return static_cast<std::size_t>(std::count(codes.begin(), codes.end(), code));
  }

  fleet::testing::TempDir dir_;
  FaultyJournalIo io_;
  JournalOptions jo_;
  BrokerOptions o_;
  std::unique_ptr<Journal> journal_;
  std::size_t restored_dead_ = 0;
};

// A start replays finished ids from the record each batch used to have
// (kFinished) and from the shared one (kFinishedIds); a shared record it
// cannot read stops the start, as any unreadable record does.
TEST_F(BrokerCoreTest, RestoreReadsFinishedRecordsOfEitherFormatAndRefusesAnUnreadableOne) {
  std::string body;
  for (const char* id : {"a", "b", "c", "d"}) {
    records::EncodeAccepted(&body, id, "", "payload");
    core_->Restore(1, records::kAccepted, body, clock_.Now());
  }
  core_->Restore(1, records::kFinished, "a", clock_.Now());
  core_->Restore(1, records::kFinishedIds, std::string("\1\0\0\0b\1\0\0\0c", 10),
                 clock_.Now());
  EXPECT_FALSE(core_->batches().FindId("a"));
  EXPECT_FALSE(core_->batches().FindId("b"));
  EXPECT_FALSE(core_->batches().FindId("c"));
  EXPECT_TRUE(core_->batches().FindId("d"));
  EXPECT_THROW(core_->Restore(1, records::kFinishedIds, std::string("\5\0\0\0d", 5),
                              clock_.Now()),
               JournalError);
}

TEST_F(BrokerCoreJournalTest, AttemptsSurviveRestartsAndCompaction) {
  Submit("P", {"a"});
  RunOnAWorkerThatDies("w1");
  EXPECT_EQ(Attempts("a"), 1u);
  Restart();
  EXPECT_EQ(Attempts("a"), 1u);
  EXPECT_EQ(restored_dead_, 0u);
  // A compaction copies the live set with its attempts.
  Compact();
  Restart();
  EXPECT_EQ(Attempts("a"), 1u);
  RunOnAWorkerThatDies("w2");
  Restart();
  EXPECT_EQ(Attempts("a"), 2u);
}

TEST_F(BrokerCoreJournalTest, BatchOnItsLastAttemptWhenTheBrokerStoppedIsDeadLettered) {
  Submit("P", {"a", "b"});
  RunOnAWorkerThatDies("w1");  // a: attempt 1 (credit 1: b waits)
  RunOnAWorkerThatDies("w2");  // a: 2
  Hello("I-w3", "w3", 1);
  PumpAndFlush();              // a: 3, running when the broker stops
  ASSERT_EQ(Attempts("a"), 3u);
  Restart();
  EXPECT_EQ(restored_dead_, 1u);
  EXPECT_FALSE(core_->batches().FindId("a").has_value());
  auto r = core_->results().Find("a");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->outcome, Outcome::kFailed);
  EXPECT_NE(r->error.find("dead-lettered after 3 attempts"), std::string::npos) << r->error;
  EXPECT_EQ(core_->counters().dead_lettered, 1u);
  // b never ran: it is back in its queue with no attempt used.
  ASSERT_TRUE(core_->batches().FindId("b").has_value());
  EXPECT_EQ(Attempts("b"), 0u);
  // The dead letter was journaled: another restart does not bring it back.
  Restart();
  EXPECT_EQ(restored_dead_, 0u);
  EXPECT_FALSE(core_->batches().FindId("a").has_value());
}

// Regression: an attempt given back for a dispatch that never left was
// given back in memory only; after a restart the journal's higher count
// dead-lettered a batch that had never run.
TEST_F(BrokerCoreJournalTest, AttemptGivenBackForADispatchThatNeverLeftStaysGivenBack) {
  o_.max_attempts = 1;
  Restart();
  Submit("P", {"a"});
  Hello("I-w1", "w1", 1);
  core_->Pump(clock_.Now());
  ASSERT_EQ(Attempts("a"), 1u);
  core_->OnDispatchFailed("w1", 0, clock_.Now());  // nothing of it left
  EXPECT_EQ(Attempts("a"), 0u);
  PumpAndFlush();
  Restart();
  EXPECT_EQ(restored_dead_, 0u);
  EXPECT_EQ(Attempts("a"), 0u);
  Hello("I-w2", "w2", 1);
  EXPECT_EQ(PumpAndFlush()["w2"], std::vector<std::string>{"a"});
}

TEST_F(BrokerCoreJournalTest, FullDiskRefusesNewBatchesWithDiskFullAndKeepsServingResults) {
  Hello("I-w1", "w1", 2);
  Submit("P", {"a"});
  EXPECT_EQ(Turn()["w1"], std::vector<std::string>{"a"});
  io_.SetFree(10);
  // Accepted and assigned in memory, but its record does not reach the
  // disk: taken back from the worker before anything is sent, refused.
  Submit("P", {"b"});
  EXPECT_TRUE(Turn()["w1"].empty());
  EXPECT_EQ(Count(rejected_["P"], ErrorCode::kDiskFull), 1u);
  EXPECT_EQ(std::count(accepted_["P"].begin(), accepted_["P"].end(), "b"), 0);
  EXPECT_FALSE(core_->batches().FindId("b").has_value());
  EXPECT_EQ(core_->counters().submitted, 1u);
  EXPECT_EQ(core_->counters().rejected_disk_full, 1u);
  // While the disk is full: refused at once, and results still flow.
  Submit("P", {"c"});
  Done("I-w1", "a");
  Turn();
  EXPECT_EQ(Count(rejected_["P"], ErrorCode::kDiskFull), 2u);
  EXPECT_EQ(results_["P"], std::vector<std::string>{"a"});
  // Space comes back: accepting again, and the worker's credit is whole.
  io_.SetFree(1u << 20);
  EXPECT_TRUE(journal_->Maintain([&](std::uint64_t upto) { return core_->LiveIds(upto); }));
  Submit("P", {"d", "e"});
  auto sent = Turn();
  EXPECT_EQ(sent["w1"], (std::vector<std::string>{"d", "e"}));
  Restart();
  EXPECT_FALSE(core_->batches().FindId("a").has_value());
  EXPECT_FALSE(core_->batches().FindId("b").has_value());
  EXPECT_FALSE(core_->batches().FindId("c").has_value());
  EXPECT_TRUE(core_->batches().FindId("d").has_value());
}

// Off-loop commit (how the server runs the journal): a new batch is neither
// acknowledged nor dispatchable until the write holding its record is done.
class BrokerCoreOffLoopJournalTest : public BrokerCoreJournalTest {
 protected:
  BrokerCoreOffLoopJournalTest() { core_->SetJournal(journal_.get(), /*off_loop=*/true); }
  // The server's Flush: starts the next write (and seals its batches).
  bool StartWrite() {
    core_->AppendDueRecords();
    const Journal::StartResult r = journal_->StartWrite();
    core_->AfterStartWrite(r, clock_.Now());
    return r == Journal::StartResult::kStarted;
  }
  // The server's wake-up from the writer.
  Journal::CommitResult FinishWrite() {
    const Journal::CommitResult r = journal_->FinishWrite();
    core_->AfterCommit(r, clock_.Now());
    return r;
  }
};

TEST_F(BrokerCoreOffLoopJournalTest, NewBatchIsAcknowledgedAndDispatchedOnlyOnceOnDisk) {
  Hello("I-w1", "w1", 4);
  Submit("P", {"a"});
  EXPECT_TRUE(PumpAndFlush().empty()) << "not on disk: no worker gets it";
  EXPECT_TRUE(accepted_["P"].empty());
  EXPECT_EQ(core_->batches().pending(), 1u);
  EXPECT_EQ(core_->batches().queued(), 0u);
  Submit("P2", {"a"});  // the same id again, before its write started
  ASSERT_TRUE(StartWrite());
  Submit("P3", {"a"});  // and while its write is out
  Submit("P", {"b"});   // a new one while the write is out: the next write
  EXPECT_TRUE(PumpAndFlush().empty());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  auto sent = PumpAndFlush();
  EXPECT_EQ(sent["w1"], std::vector<std::string>{"a"});
  EXPECT_EQ(accepted_["P"], std::vector<std::string>{"a"});
  EXPECT_EQ(accepted_["P2"], std::vector<std::string>{"a"});
  EXPECT_EQ(accepted_["P3"], std::vector<std::string>{"a"});
  EXPECT_EQ(core_->counters().submitted, 2u);
  EXPECT_EQ(core_->counters().resubmitted, 2u);
  ASSERT_TRUE(StartWrite());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_EQ(PumpAndFlush()["w1"], std::vector<std::string>{"b"});
  EXPECT_EQ(accepted_["P"], (std::vector<std::string>{"a", "b"}));
  // The result goes to whoever asked last.
  Done("I-w1", "a");
  PumpAndFlush();
  EXPECT_EQ(results_["P3"], std::vector<std::string>{"a"});
  Restart();
  EXPECT_TRUE(core_->batches().FindId("b").has_value());
}

TEST_F(BrokerCoreOffLoopJournalTest, FailedWriteRefusesEveryProducerOfItsBatchesWithDiskFull) {
  Hello("I-w1", "w1", 4);
  io_.FailSyncs(1);
  Submit("P", {"a", "b"});
  Submit("P2", {"a"});
  ASSERT_TRUE(StartWrite());
  Submit("P3", {"b"});  // answered with the write it waits for
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kRefused);
  EXPECT_TRUE(PumpAndFlush().empty());
  EXPECT_EQ(Count(rejected_["P"], ErrorCode::kDiskFull), 2u);
  EXPECT_EQ(Count(rejected_["P2"], ErrorCode::kDiskFull), 1u);
  EXPECT_EQ(Count(rejected_["P3"], ErrorCode::kDiskFull), 1u);
  EXPECT_TRUE(accepted_.empty() || (accepted_["P"].empty() && accepted_["P2"].empty()));
  EXPECT_FALSE(core_->batches().FindId("a").has_value());
  EXPECT_EQ(core_->batches().size(), 0u);
  EXPECT_EQ(core_->counters().submitted, 0u);
  // Accepting again after the retry.
  EXPECT_TRUE(journal_->Maintain([&](std::uint64_t upto) { return core_->LiveIds(upto); }));
  Submit("P", {"a"});
  ASSERT_TRUE(StartWrite());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_EQ(PumpAndFlush()["w1"], std::vector<std::string>{"a"});
  EXPECT_EQ(accepted_["P"], std::vector<std::string>{"a"});
}

TEST_F(BrokerCoreOffLoopJournalTest, ResultForABatchNotOnDiskYetIsIgnored) {
  Hello("I-w1", "w1", 4);
  Submit("P", {"a"});
  Done("I-w1", "a");  // no worker was given it: a result from an earlier life of the id
  EXPECT_EQ(core_->counters().duplicates, 1u);
  ASSERT_TRUE(StartWrite());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_EQ(PumpAndFlush()["w1"], std::vector<std::string>{"a"});
  EXPECT_TRUE(results_["P"].empty());
}

// Off the loop, a dispatch's record waits for the next write and carries
// the count the batch has then: one record however often the count changed,
// none for a batch that finished first.
TEST_F(BrokerCoreOffLoopJournalTest, DispatchedRecordGoesWithTheNextWriteOnlyForHeldBatches) {
  Hello("I-w1", "w1", 2);
  Submit("P", {"a", "b"});
  ASSERT_TRUE(StartWrite());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_FALSE(core_->has_due_records());
  EXPECT_EQ(PumpAndFlush()["w1"], (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(Attempts("a"), 1u);
  EXPECT_TRUE(core_->has_due_records());
  const std::uint64_t appended = journal_->stats().records_appended;
  EXPECT_EQ(appended, 2u) << "the accepted records only: the dispatches wait";
  Done("I-w1", "b");  // b finishes before the next write: no dispatched record
  PumpAndFlush();
  EXPECT_EQ(journal_->stats().records_appended, appended + 1) << "b's finished record";
  ASSERT_TRUE(StartWrite());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_EQ(journal_->stats().records_appended, appended + 2) << "a's dispatched record";
  EXPECT_FALSE(core_->has_due_records());
  // Requeued, then dispatched again and given back (a send that failed)
  // before the next write: one record, with the count it ends with.
  clock_.Advance(std::chrono::seconds(4));
  core_->Tick(clock_.Now());  // w1 missed its heartbeats: a is requeued
  Hello("I-w2", "w2", 1);
  core_->Pump(clock_.Now());
  ASSERT_EQ(Attempts("a"), 2u);
  core_->OnDispatchFailed("w2", 0, clock_.Now());
  ASSERT_EQ(Attempts("a"), 1u);
  PumpAndFlush();
  const std::uint64_t before = journal_->stats().records_appended;
  ASSERT_TRUE(StartWrite());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_EQ(journal_->stats().records_appended, before + 1);
  // A restart finds a with the count of its last record and b finished.
  Restart();
  EXPECT_EQ(Attempts("a"), 1u);
  EXPECT_FALSE(core_->batches().FindId("b").has_value());
}

// A broker that stops appends the dispatched records still waiting for a
// write (the end of BrokerServer::Run), and its journal writes them as it
// closes; one that crashes loses them, which only leaves the count lower.
TEST_F(BrokerCoreOffLoopJournalTest, DispatchedRecordsWaitingAtAStopAreWrittenAndLostInACrash) {
  Hello("I-w1", "w1", 1);
  Submit("P", {"a"});
  ASSERT_TRUE(StartWrite());
  EXPECT_EQ(FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_EQ(PumpAndFlush()["w1"], std::vector<std::string>{"a"});
  ASSERT_TRUE(core_->has_due_records());
  Restart(/*clean=*/false);
  EXPECT_EQ(Attempts("a"), 0u);
  core_->SetJournal(journal_.get(), /*off_loop=*/true);  // as the server runs it
  Hello("I-w2", "w2", 1);
  EXPECT_EQ(PumpAndFlush()["w2"], std::vector<std::string>{"a"});
  ASSERT_EQ(Attempts("a"), 1u);
  ASSERT_TRUE(core_->has_due_records());
  Restart();
  EXPECT_EQ(Attempts("a"), 1u);
}

TEST_F(BrokerCoreJournalTest, RestartOnAFullDiskServesTheBatchesItHolds) {
  Submit("P", {"a", "b"});
  Turn();
  io_.SetFree(0);
  Restart();
  ASSERT_EQ(core_->batches().size(), 2u);
  Hello("I-w1", "w1", 2);
  EXPECT_EQ(Turn()["w1"], (std::vector<std::string>{"a", "b"}));
  Done("I-w1", "a");
  Done("I-w1", "b");
  Submit("P2", {"c"});
  Turn();
  EXPECT_EQ(results_[""], (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Count(rejected_["P2"], ErrorCode::kDiskFull), 1u);
  EXPECT_EQ(core_->batches().size(), 0u);
}

}  // namespace
}  // namespace fleet::broker

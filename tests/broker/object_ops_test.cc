// The broker's relay of object requests (docs/protocol.md section 5a):
// OBJECT_GET from a worker holding the batch goes to the batch's owner as
// OBJECT_REQUEST; the owner's OBJECT_REPLY comes back as OBJECT_DATA; and
// every refusal, timeout and lost peer gets its status.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "broker/broker_core.h"
#include "common/codec.h"

namespace fleet::broker {
namespace {

using proto::ObjectStatus;

struct Data {
  std::uint64_t tag = 0;
  ObjectStatus status = ObjectStatus::kOk;
  std::uint64_t total = 0, offset = 0;
  std::string data, error;
};
struct Request {
  std::uint64_t token = 0;
  std::string batch, digest;
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};

class ObjectOpsTest : public ::testing::Test {
 protected:
  ObjectOpsTest() { Start(BrokerOptions()); }

  void Start(BrokerOptions o) {
    o.heartbeat = std::chrono::milliseconds(1000);
    opts_ = o;
    core_ = std::make_unique<BrokerCore>(opts_);
  }

  // Producer `p` submits `ids`; worker connection `w` (id "id-"+w) registers
  // with room for all of them and is handed them.
  void Running(const std::string& p, const std::string& w, std::vector<std::string> ids) {
    proto::Submit m;
    for (const auto& id : ids) m.batches.push_back({id, "", "payload"});
    core_->OnMessage(Socket::kFrontend, p, m, clock_.Now());
    const auto n = static_cast<std::uint32_t>(ids.size());
    core_->OnMessage(Socket::kBackend, w, proto::Hello{"id-" + w, n, n, {}}, clock_.Now());
    core_->Pump(clock_.Now());
    Collect();
  }
  void Get(const std::string& w, std::uint64_t tag, const std::string& batch,
           const std::string& digest = std::string(32, 'd'), std::uint64_t offset = 0,
           std::uint32_t length = 1000) {
    core_->OnMessage(Socket::kBackend, w, proto::ObjectGet{tag, batch, digest, offset, length},
                     clock_.Now());
    Collect();
  }
  void Reply(const std::string& p, std::uint64_t token, ObjectStatus status,
             std::uint64_t total, const std::string& data, const std::string& error = "") {
    core_->OnMessage(Socket::kFrontend, p,
                     proto::ObjectReply{token, static_cast<std::uint32_t>(status), total, data,
                                        error},
                     clock_.Now());
    Collect();
  }
  // Takes the outbox's frames apart as the server's flush would send them.
  void Collect() {
    for (auto& f : core_->outbox().frames) {
      auto d = proto::Decode(f.body.data(), f.body.size());
      ASSERT_TRUE(d.ok()) << d.detail;
      if (auto* r = std::get_if<proto::ObjectRequest>(&*d.message)) {
        requests_[f.identity].push_back({r->token, std::string(r->batch_id),
                                         std::string(r->digest), r->offset, r->length});
      } else if (auto* o = std::get_if<proto::ObjectData>(&*d.message)) {
        answers_[f.identity].push_back({o->tag, static_cast<ObjectStatus>(o->status), o->total,
                                        o->offset, std::string(o->data),
                                        std::string(o->error)});
      } else if (std::holds_alternative<proto::Reset>(*d.message)) {
        ++resets_[f.identity];
      }
    }
    core_->outbox().clear();
  }
  std::uint64_t Answered(ObjectStatus s) const {
    return core_->counters().object_answers[static_cast<int>(s)];
  }

  FakeClock clock_;
  BrokerOptions opts_;
  std::unique_ptr<BrokerCore> core_;
  std::map<std::string, std::vector<Request>> requests_;
  std::map<std::string, std::vector<Data>> answers_;
  std::map<std::string, int> resets_;
};

TEST_F(ObjectOpsTest, AskingWorkersGetOnlyTheirBatchsProducersChunks) {
  Running("P", "W", {"b1"});
  const std::string digest(32, '\x7f');
  Get("W", 9, "b1", digest, 4, 3);
  ASSERT_EQ(requests_["P"].size(), 1u);
  const Request r = requests_["P"][0];
  EXPECT_EQ(r.batch, "b1");
  EXPECT_EQ(r.digest, digest);
  EXPECT_EQ(r.offset, 4u);
  EXPECT_EQ(r.length, 3u);
  EXPECT_TRUE(answers_["W"].empty());
  EXPECT_EQ(core_->objects().size(), 1u);

  Reply("P", r.token, ObjectStatus::kOk, 10, "xyz");
  ASSERT_EQ(answers_["W"].size(), 1u);
  const Data a = answers_["W"][0];
  EXPECT_EQ(a.tag, 9u);
  EXPECT_EQ(a.status, ObjectStatus::kOk);
  EXPECT_EQ(a.total, 10u);
  EXPECT_EQ(a.offset, 4u);
  EXPECT_EQ(a.data, "xyz");
  EXPECT_EQ(core_->objects().size(), 0u);
  EXPECT_EQ(Answered(ObjectStatus::kOk), 1u);
  EXPECT_EQ(core_->counters().object_bytes, 3u);

  // The same token again: nobody waits for it.
  Reply("P", r.token, ObjectStatus::kOk, 10, "xyz");
  EXPECT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(core_->counters().object_replies_dropped, 1u);
}

TEST_F(ObjectOpsTest, RefusesAtOnceWhatItCannotPassOn) {
  Running("P", "W", {"b1"});
  Running("P", "V", {"b2"});
  Get("X", 1, "b1");                          // not a registered worker
  EXPECT_EQ(answers_["X"].at(0).status, ObjectStatus::kUnknownBatch);
  Get("W", 2, "b2");                          // another worker's batch
  Get("W", 3, "nope");                        // no such batch
  Get("W", 4, "b1", "");                      // empty digest
  Get("W", 5, "b1", std::string(65, 'd'));    // digest too long
  Get("W", 6, "b1", std::string(64, 'd'), 0, 0);  // length 0
  ASSERT_EQ(answers_["W"].size(), 5u);
  EXPECT_EQ(answers_["W"][0].status, ObjectStatus::kUnknownBatch);
  EXPECT_EQ(answers_["W"][1].status, ObjectStatus::kUnknownBatch);
  EXPECT_EQ(answers_["W"][2].status, ObjectStatus::kBadRequest);
  EXPECT_EQ(answers_["W"][3].status, ObjectStatus::kBadRequest);
  EXPECT_EQ(answers_["W"][4].status, ObjectStatus::kBadRequest);
  for (const Data& a : answers_["W"]) {
    EXPECT_NE(a.error.find("batch"), std::string::npos) << a.error;
    EXPECT_TRUE(a.data.empty());
    EXPECT_EQ(a.total, 0u);
  }
  EXPECT_TRUE(requests_["P"].empty());
  EXPECT_EQ(core_->objects().size(), 0u);
  // A queued batch is held by nobody.
  proto::Submit m{{{"q1", "", "x"}}};
  core_->OnMessage(Socket::kFrontend, "P", m, clock_.Now());
  Get("W", 7, "q1");
  EXPECT_EQ(answers_["W"].back().status, ObjectStatus::kUnknownBatch);
}

TEST_F(ObjectOpsTest, AWorkerOfTwoSlotsMayHaveThirtyTwoPending) {
  Running("P", "W", {"b1", "b2"});
  for (std::uint64_t t = 0; t < 2 * ObjectTable::kMaxPerSlot; ++t) Get("W", t, t % 2 ? "b1" : "b2");
  EXPECT_TRUE(answers_["W"].empty());
  Get("W", 99, "b1");
  ASSERT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(answers_["W"][0].status, ObjectStatus::kBusy);
}

TEST_F(ObjectOpsTest, SixteenPendingPerSlotAndTenTwentyFourInAll) {
  Running("P", "W", {"b1"});
  for (std::uint64_t t = 0; t < ObjectTable::kMaxPerSlot; ++t) Get("W", t, "b1");
  EXPECT_TRUE(answers_["W"].empty());
  Get("W", 99, "b1");
  ASSERT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(answers_["W"][0].status, ObjectStatus::kBusy);
  // An answer frees a place.
  Reply("P", requests_["P"][0].token, ObjectStatus::kOk, 1, "x");
  Get("W", 100, "b1");
  EXPECT_EQ(requests_["P"].size(), ObjectTable::kMaxPerSlot + 1);

  // 64 more workers fill the broker's 1024 (W holds 16 already).
  for (int i = 0; i < 63; ++i) {
    const std::string w = "w" + std::to_string(i), b = "c" + std::to_string(i);
    Running("P", w, {b});
    for (std::uint64_t t = 0; t < ObjectTable::kMaxPerSlot; ++t) Get(w, t, b);
  }
  EXPECT_EQ(core_->objects().size(), ObjectTable::kMaxTotal);
  Running("P", "last", {"z"});
  Get("last", 1, "z");
  EXPECT_EQ(answers_["last"].at(0).status, ObjectStatus::kBusy);
}

TEST_F(ObjectOpsTest, ChunksAreShortenedToFitOneMessage) {
  BrokerOptions o;
  o.max_message_bytes = 1u << 20;
  o.max_batch_bytes = 1000;
  Start(o);
  Running("P", "W", {"b1"});
  Get("W", 1, "b1", std::string(8, 'd'), 0, 0xffffffffu);
  ASSERT_EQ(requests_["P"].size(), 1u);
  EXPECT_EQ(requests_["P"][0].length, core_->ObjectChunkBytes());
  EXPECT_LT(core_->ObjectChunkBytes(), 1u << 20);
  EXPECT_GT(core_->ObjectChunkBytes(), (1u << 20) - 8192);
  // A reply longer than the shortened request is not relayed.
  Reply("P", requests_["P"][0].token, ObjectStatus::kOk, 2u << 20,
        std::string(core_->ObjectChunkBytes() + 1, 'x'));
  ASSERT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(answers_["W"][0].status, ObjectStatus::kBadRequest);
  EXPECT_TRUE(answers_["W"][0].data.empty());
}

TEST_F(ObjectOpsTest, UnansweredRequestsTimeOutAndLateRepliesAreDropped) {
  BrokerOptions o;
  o.object_timeout = std::chrono::seconds(5);
  Start(o);
  Running("P", "W", {"b1"});
  Get("W", 1, "b1");
  // The worker stays alive meanwhile (it heartbeats).
  auto wait = [&](int ms) {
    clock_.Advance(std::chrono::milliseconds(ms));
    core_->OnMessage(Socket::kBackend, "W", proto::Heartbeat{}, clock_.Now());
    core_->Tick(clock_.Now());
    Collect();
  };
  for (int i = 0; i < 4; ++i) wait(1000);
  wait(900);
  EXPECT_TRUE(answers_["W"].empty());
  wait(200);
  ASSERT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(answers_["W"][0].status, ObjectStatus::kTimeout);
  EXPECT_NE(answers_["W"][0].error.find("--object-timeout-seconds"), std::string::npos);
  Reply("P", requests_["P"][0].token, ObjectStatus::kOk, 1, "x");
  EXPECT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(core_->counters().object_replies_dropped, 1u);
  EXPECT_EQ(Answered(ObjectStatus::kTimeout), 1u);
}

TEST_F(ObjectOpsTest, AProducerThatCannotBeReachedAnswersProducerGone) {
  Running("P", "W", {"b1", "b2"});
  Get("W", 1, "b1");
  Get("W", 2, "b2");
  ASSERT_EQ(requests_["P"].size(), 2u);
  core_->OnUndeliverable(Socket::kFrontend, "P", clock_.Now());
  Collect();
  ASSERT_EQ(answers_["W"].size(), 2u);
  EXPECT_EQ(answers_["W"][0].tag, 1u);
  EXPECT_EQ(answers_["W"][1].tag, 2u);
  for (const Data& a : answers_["W"]) EXPECT_EQ(a.status, ObjectStatus::kProducerGone);
  EXPECT_EQ(core_->objects().size(), 0u);

  // A batch with no owner (back from the journal, not re-sent yet).
  core_->mutable_batches().SetOwner(*core_->batches().FindId("b1"), "");
  Get("W", 3, "b1");
  EXPECT_EQ(answers_["W"].back().status, ObjectStatus::kProducerGone);
  EXPECT_EQ(requests_["P"].size(), 2u);
}

TEST_F(ObjectOpsTest, OnlyTheOwnersConnectionIsHeardAndBadRepliesAreBadRequests) {
  Running("P", "W", {"b1"});
  Get("W", 1, "b1");
  const std::uint64_t token = requests_["P"].at(0).token;
  Reply("Q", token, ObjectStatus::kOk, 1, "x");  // another producer
  EXPECT_TRUE(answers_["W"].empty());
  EXPECT_EQ(core_->counters().object_replies_dropped, 1u);
  EXPECT_EQ(core_->objects().size(), 1u);
  Reply("P", token, ObjectStatus::kUnknownObject, 0, "", "released");
  ASSERT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(answers_["W"][0].status, ObjectStatus::kUnknownObject);
  EXPECT_NE(answers_["W"][0].error.find("released"), std::string::npos);

  // A status a producer may not send, and data past the object's end.
  Get("W", 2, "b1", "d", 8, 100);
  Reply("P", requests_["P"].back().token, ObjectStatus::kBusy, 0, "");
  Get("W", 3, "b1", "d", 8, 100);
  Reply("P", requests_["P"].back().token, ObjectStatus::kOk, 10, "abc");
  Get("W", 4, "b1", "d", 11, 100);
  Reply("P", requests_["P"].back().token, ObjectStatus::kOk, 10, "");
  Get("W", 5, "b1", "d", 7, 100);
  Reply("P", requests_["P"].back().token, ObjectStatus::kOk, 10, "abc");
  ASSERT_EQ(answers_["W"].size(), 5u);
  EXPECT_EQ(answers_["W"][1].status, ObjectStatus::kBadRequest);
  EXPECT_EQ(answers_["W"][2].status, ObjectStatus::kBadRequest);
  EXPECT_EQ(answers_["W"][3].status, ObjectStatus::kBadRequest);
  EXPECT_EQ(answers_["W"][4].status, ObjectStatus::kOk);  // ends exactly at 10
  EXPECT_EQ(answers_["W"][4].data, "abc");
}

TEST_F(ObjectOpsTest, AWorkerThatLeavesHasItsRequestsAnsweredAndTheirRepliesDropped) {
  Running("P", "W", {"b1"});
  Get("W", 1, "b1");
  core_->OnMessage(Socket::kBackend, "W", proto::Bye{}, clock_.Now());
  Collect();
  EXPECT_EQ(core_->objects().size(), 0u);
  // Answered at once: exactly one answer per request while connected.
  ASSERT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(answers_["W"][0].status, ObjectStatus::kUnknownBatch);
  Reply("P", requests_["P"].at(0).token, ObjectStatus::kOk, 1, "x");
  EXPECT_EQ(answers_["W"].size(), 1u);
  EXPECT_EQ(core_->counters().object_replies_dropped, 1u);
}

TEST_F(ObjectOpsTest, AGetFromAnUnregisteredConnectionIsRefusedAndReset) {
  Get("stranger", 5, "b1");
  ASSERT_EQ(answers_["stranger"].size(), 1u);
  EXPECT_EQ(answers_["stranger"][0].status, ObjectStatus::kUnknownBatch);
  EXPECT_EQ(resets_["stranger"], 1);
}

TEST_F(ObjectOpsTest, ProducersAreAskedOnTheFrontendAndWorkersOnlyAnswerOnTheBackend) {
  Running("P", "W", {"b1"});
  // OBJECT_REPLY on the backend, OBJECT_GET on the frontend: refused.
  core_->OnMessage(Socket::kBackend, "W", proto::ObjectReply{1, 0, 0, "", ""}, clock_.Now());
  core_->OnMessage(Socket::kFrontend, "P", proto::ObjectGet{1, "b1", "d", 0, 1}, clock_.Now());
  std::vector<Socket> errors;
  for (auto& f : core_->outbox().frames) {
    auto d = proto::Decode(f.body.data(), f.body.size());
    if (d.ok() && std::holds_alternative<proto::Error>(*d.message)) errors.push_back(f.socket);
  }
  core_->outbox().clear();
  EXPECT_EQ(errors, (std::vector<Socket>{Socket::kBackend, Socket::kFrontend}));
  EXPECT_EQ(core_->objects().size(), 0u);
}

}  // namespace
}  // namespace fleet::broker

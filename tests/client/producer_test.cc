#include "client/producer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "tests/client/fake_router.h"

namespace fleet::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::ManualRouter;
using testing::Received;

struct Delivered {
  std::string id;
  proto::Outcome outcome;
  std::uint32_t attempts;
  std::string result;
  std::string error;
};

class ProducerTest : public ::testing::Test {
 protected:
  Producer MakeProducer(Producer::Options options = {}) {
    options.endpoint = broker_.endpoint();
    options.socket.linger_ms = 0;
    return Producer(
        context_, options,
        [this](const ResultView& r) {
          delivered_.push_back({std::string(r.id), r.outcome, r.attempts,
                                std::string(r.result), std::string(r.error)});
        },
        clock_);
  }

  // Polls the producer and drains the fake broker in turn until `cond`
  // holds; false after 10 s.
  bool Pump(Producer& p, const std::function<bool()>& cond) {
    auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      p.Poll(milliseconds(5));
      broker_.Drain();
      if (cond()) return true;
    }
    return false;
  }

  // Pumps until the broker has received `n` messages in total.
  bool PumpMessages(Producer& p, std::size_t n) {
    return Pump(p, [&] { return broker_.received().size() >= n; });
  }

  // A few rounds of I/O, for checking that nothing is sent while the fake
  // clock stands still. Bounded by count, not by time.
  void Idle(Producer& p) {
    for (int i = 0; i < 5; ++i) {
      p.Poll(milliseconds(5));
      broker_.Drain();
    }
  }

  static proto::Result OneResult(std::string_view id, std::string_view out,
                                 proto::Outcome outcome = proto::Outcome::kOk) {
    proto::Result r;
    r.results.push_back({id, outcome, 1, out, ""});
    return r;
  }

  zmq::context_t context_{1};
  FakeClock clock_;
  ManualRouter broker_{context_};
  std::vector<Delivered> delivered_;
};

TEST_F(ProducerTest, WindowNeverExceedsInflight) {
  Producer::Options options;
  options.max_in_flight = 10;
  Producer p = MakeProducer(options);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(p.Submit("b" + std::to_string(i), "", "x"));
  }
  std::set<std::string> at_broker;  // received, not answered
  std::size_t seen = 0;
  ASSERT_TRUE(Pump(p, [&] {
    EXPECT_LE(p.in_flight(), 10u);
    auto& got = broker_.received();
    for (; seen < got.size(); ++seen) {
      for (const auto& b : got[seen].batches) at_broker.insert(b.id);
    }
    EXPECT_LE(at_broker.size(), 10u);
    // Answer everything held, then let the producer refill the window.
    for (const std::string& id : at_broker) broker_.Send(OneResult(id, id));
    at_broker.clear();
    return delivered_.size() == 100;
  }));
  EXPECT_EQ(p.outstanding(), 0u);
  EXPECT_EQ(p.counters().duplicates_dropped, 0u);
}

TEST_F(ProducerTest, CoalescesPendingBatchesIntoFewSubmits) {
  Producer::Options options;
  options.max_batches_per_message = 16;
  Producer p = MakeProducer(options);
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(p.Submit("b" + std::to_string(i), "q", "payload"));
  }
  ASSERT_TRUE(PumpMessages(p, 4));
  auto& got = broker_.received();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].batches.size(), 16u);
  EXPECT_EQ(got[1].batches.size(), 16u);
  EXPECT_EQ(got[2].batches.size(), 16u);
  EXPECT_EQ(got[3].batches.size(), 2u);
  EXPECT_EQ(got[0].batches[0].id, "b0");  // FIFO order
  EXPECT_EQ(got[3].batches[1].id, "b49");
  EXPECT_EQ(got[0].batches[0].queue, "q");
  EXPECT_EQ(p.counters().submit_messages, 4u);
}

TEST_F(ProducerTest, SendsSingleBatchAtOnce) {
  Producer p = MakeProducer();
  ASSERT_TRUE(p.Submit("only", "", "x"));
  ASSERT_TRUE(PumpMessages(p, 1));
  ASSERT_EQ(broker_.received()[0].command, proto::Command::kSubmit);
  ASSERT_EQ(broker_.received()[0].batches.size(), 1u);
}

TEST_F(ProducerTest, RejectsIdAlreadyOutstanding) {
  Producer p = MakeProducer();
  EXPECT_TRUE(p.Submit("a", "", "x"));
  EXPECT_FALSE(p.Submit("a", "", "y"));
  EXPECT_EQ(p.outstanding(), 1u);
}

// A durable broker whose disk is full refuses new batches until it can
// write again: waited out like queue_full, never a failed batch.
TEST_F(ProducerTest, DiskFullIsWaitedOutAndSentAgainLikeQueueFull) {
  Producer p = MakeProducer();  // backoff 10 ms
  ASSERT_TRUE(p.Submit("a", "", "payload-a"));
  ASSERT_TRUE(PumpMessages(p, 1));
  proto::Ack full;
  full.rejected.push_back({"a", proto::ErrorCode::kDiskFull, "disk full"});
  broker_.Send(full);
  ASSERT_TRUE(Pump(p, [&] { return p.counters().disk_full_retries == 1; }));
  EXPECT_EQ(p.counters().rejected, 0u);
  EXPECT_EQ(p.outstanding(), 1u);
  clock_.Advance(milliseconds(10));
  ASSERT_TRUE(PumpMessages(p, 2));
  EXPECT_EQ(broker_.received()[1].batches[0].payload, "payload-a");
}

TEST_F(ProducerTest, QueueFullIsRetriedAfterDoublingBackoffThenDeliveredOnce) {
  Producer p = MakeProducer();  // backoff 10 ms, doubling
  ASSERT_TRUE(p.Submit("a", "", "payload-a"));
  ASSERT_TRUE(PumpMessages(p, 1));

  proto::Ack full;
  full.rejected.push_back({"a", proto::ErrorCode::kQueueFull, "queue full"});
  broker_.Send(full);
  ASSERT_TRUE(Pump(p, [&] { return p.counters().queue_full_retries == 1; }));
  Idle(p);
  EXPECT_EQ(broker_.received().size(), 1u) << "retried before its backoff";
  EXPECT_EQ(p.in_flight(), 1u) << "a retry keeps its window slot";

  clock_.Advance(milliseconds(10));
  ASSERT_TRUE(PumpMessages(p, 2));
  ASSERT_EQ(broker_.received()[1].batches.size(), 1u);
  EXPECT_EQ(broker_.received()[1].batches[0].payload, "payload-a");

  // Second rejection: the wait doubles to 20 ms.
  broker_.Send(full);
  ASSERT_TRUE(Pump(p, [&] { return p.counters().queue_full_retries == 2; }));
  clock_.Advance(milliseconds(10));
  Idle(p);
  EXPECT_EQ(broker_.received().size(), 2u) << "backoff did not double";
  clock_.Advance(milliseconds(10));
  ASSERT_TRUE(PumpMessages(p, 3));

  proto::Ack ok;
  ok.accepted.push_back("a");
  broker_.Send(ok);
  broker_.Send(OneResult("a", "done"));
  ASSERT_TRUE(Pump(p, [&] { return !delivered_.empty(); }));
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].id, "a");
  EXPECT_EQ(delivered_[0].outcome, proto::Outcome::kOk);
  EXPECT_EQ(delivered_[0].result, "done");
  EXPECT_EQ(p.outstanding(), 0u);
}

TEST_F(ProducerTest, DuplicateResultIsDeliveredOnceAndCounted) {
  Producer p = MakeProducer();
  ASSERT_TRUE(p.Submit("a", "", "x"));
  ASSERT_TRUE(p.Submit("b", "", "x"));
  ASSERT_TRUE(PumpMessages(p, 1));
  // The result may overtake the ACK; a second copy comes late.
  proto::Result both;
  both.results.push_back({"a", proto::Outcome::kOk, 1, "ra", ""});
  both.results.push_back({"a", proto::Outcome::kOk, 2, "ra", ""});
  broker_.Send(both);
  proto::Ack ack;
  ack.accepted = {"a", "b"};
  broker_.Send(ack);
  broker_.Send(OneResult("a", "ra"));
  broker_.Send(OneResult("b", "rb", proto::Outcome::kFailed));
  ASSERT_TRUE(Pump(p, [&] { return p.counters().duplicates_dropped == 2; }));
  ASSERT_TRUE(Pump(p, [&] { return delivered_.size() == 2; }));
  EXPECT_EQ(delivered_[0].id, "a");
  EXPECT_EQ(delivered_[0].attempts, 1u);
  EXPECT_EQ(delivered_[1].id, "b");
  EXPECT_EQ(delivered_[1].outcome, proto::Outcome::kFailed);
  EXPECT_EQ(p.counters().acks, 1u);
}

TEST_F(ProducerTest, FinalRejectionIsReportedAsFailedResult) {
  Producer p = MakeProducer();
  ASSERT_TRUE(p.Submit("big", "", "x"));
  ASSERT_TRUE(PumpMessages(p, 1));
  proto::Ack ack;
  ack.rejected.push_back({"big", proto::ErrorCode::kTooLarge, "payload 9 MB"});
  broker_.Send(ack);
  ASSERT_TRUE(Pump(p, [&] { return !delivered_.empty(); }));
  EXPECT_EQ(delivered_[0].id, "big");
  EXPECT_EQ(delivered_[0].outcome, proto::Outcome::kFailed);
  EXPECT_EQ(delivered_[0].attempts, 0u);
  EXPECT_EQ(delivered_[0].error, "rejected: too_large: payload 9 MB");
  EXPECT_EQ(p.outstanding(), 0u);
}

TEST_F(ProducerTest, InvalidBatchIsRejectedLocallyWithoutSending) {
  Producer p = MakeProducer();
  ASSERT_TRUE(p.Submit("", "", "x"));
  p.Poll(milliseconds(0));
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].error, "rejected: invalid_argument: empty id");
  Idle(p);
  EXPECT_TRUE(broker_.received().empty());
}

TEST_F(ProducerTest, OverdueBatchIsFetchedAndResubmittedWhenBrokerLostIt) {
  Producer::Options options;
  options.resend_after = seconds(10);
  Producer p = MakeProducer(options);
  ASSERT_TRUE(p.Submit("a", "q", "payload-a"));
  ASSERT_TRUE(PumpMessages(p, 1));
  proto::Ack ack;
  ack.accepted.push_back("a");
  broker_.Send(ack);
  ASSERT_TRUE(Pump(p, [&] { return p.counters().acks == 1; }));

  clock_.Advance(seconds(9));
  Idle(p);
  EXPECT_EQ(broker_.received().size(), 1u) << "fetched too early";

  clock_.Advance(seconds(1));
  ASSERT_TRUE(PumpMessages(p, 2));
  ASSERT_EQ(broker_.received()[1].command, proto::Command::kFetch);
  EXPECT_EQ(broker_.received()[1].ids, std::vector<std::string>{"a"});

  // The broker restarted and lost it: same id and payload go out again.
  broker_.Send(OneResult("a", "", proto::Outcome::kUnknown));
  ASSERT_TRUE(PumpMessages(p, 3));
  const Received& again = broker_.received()[2];
  ASSERT_EQ(again.command, proto::Command::kSubmit);
  ASSERT_EQ(again.batches.size(), 1u);
  EXPECT_EQ(again.batches[0].id, "a");
  EXPECT_EQ(again.batches[0].queue, "q");
  EXPECT_EQ(again.batches[0].payload, "payload-a");
  EXPECT_EQ(p.counters().resends, 1u);
  EXPECT_TRUE(delivered_.empty()) << "unknown is not a result";

  broker_.Send(OneResult("a", "done"));
  ASSERT_TRUE(Pump(p, [&] { return !delivered_.empty(); }));
  EXPECT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(p.outstanding(), 0u);
}

TEST_F(ProducerTest, UnknownForFinishedIdIsIgnored) {
  Producer p = MakeProducer();
  ASSERT_TRUE(p.Submit("a", "", "x"));
  ASSERT_TRUE(PumpMessages(p, 1));
  broker_.Send(OneResult("a", "done"));
  ASSERT_TRUE(Pump(p, [&] { return !delivered_.empty(); }));
  broker_.Send(OneResult("a", "", proto::Outcome::kUnknown));
  Idle(p);
  EXPECT_EQ(broker_.received().size(), 1u);
  EXPECT_EQ(delivered_.size(), 1u);
}

// The broker restarts (a new ROUTER on the same port): the DEALER
// reconnects, and the producer at once, with its clock standing still (so
// not by the resend timer), submits again every batch that was sent and has
// no result, with its id and payload, and nothing else.
TEST_F(ProducerTest, ReconnectResendsEveryBatchWithoutResultAtOnce) {
  Producer::Options options;
  options.resend_after = seconds(600);
  Producer p = MakeProducer(options);
  std::vector<std::size_t> told;
  p.set_on_reconnect([&](std::size_t resent) { told.push_back(resent); });
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(p.Submit(id, "q", std::string("payload-") + id));
  }
  ASSERT_TRUE(PumpMessages(p, 1));
  ASSERT_EQ(broker_.received()[0].batches.size(), 3u);
  const std::string first_peer = broker_.received()[0].identity;
  proto::Ack ack;
  ack.accepted = {"a", "b", "c"};
  broker_.Send(ack);
  broker_.Send(OneResult("a", "ra"));
  ASSERT_TRUE(Pump(p, [&] { return delivered_.size() == 1; }));
  EXPECT_EQ(p.counters().connections, 1u);
  EXPECT_EQ(p.counters().reconnects, 0u);

  broker_.Close();
  broker_.Rebind();
  ASSERT_TRUE(PumpMessages(p, 2)) << "nothing re-sent after the reconnect";
  const Received again = broker_.received()[1];
  EXPECT_NE(again.identity, first_peer) << "not a new connection";
  ASSERT_EQ(again.command, proto::Command::kSubmit);
  ASSERT_EQ(again.batches.size(), 2u);
  EXPECT_EQ(again.batches[0].id, "b");  // in the order first sent
  EXPECT_EQ(again.batches[0].queue, "q");
  EXPECT_EQ(again.batches[0].payload, "payload-b");
  EXPECT_EQ(again.batches[1].id, "c");
  EXPECT_EQ(again.batches[1].payload, "payload-c");
  EXPECT_EQ(p.counters().reconnects, 1u);
  EXPECT_EQ(p.counters().reconnect_resends, 2u);
  EXPECT_EQ(p.counters().disconnects, 1u);
  EXPECT_EQ(told, std::vector<std::size_t>{2});
  Idle(p);
  EXPECT_EQ(broker_.received().size(), 2u) << "re-sent twice, or fetched";

  // The new broker answers both; a broker that kept its results also sends
  // "a" again (a re-submit of a finished id). Each reaches the callback once.
  proto::Result results;
  results.results.push_back({"c", proto::Outcome::kOk, 1, "rc", ""});
  results.results.push_back({"a", proto::Outcome::kOk, 1, "ra", ""});
  results.results.push_back({"b", proto::Outcome::kOk, 1, "rb", ""});
  broker_.Send(results);
  ASSERT_TRUE(Pump(p, [&] { return delivered_.size() == 3; }));
  Idle(p);
  ASSERT_EQ(delivered_.size(), 3u);
  EXPECT_EQ(delivered_[1].id, "c");
  EXPECT_EQ(delivered_[2].id, "b");
  EXPECT_EQ(p.counters().duplicates_dropped, 1u);
  EXPECT_EQ(p.outstanding(), 0u);
}

// A batch submitted while the broker is down goes out, with the re-sends,
// once the broker is back.
TEST_F(ProducerTest, BatchSubmittedWhileBrokerIsDownIsSentWhenItIsBack) {
  Producer::Options options;
  options.resend_after = seconds(600);
  Producer p = MakeProducer(options);
  ASSERT_TRUE(p.Submit("a", "", "payload-a"));
  ASSERT_TRUE(PumpMessages(p, 1));

  broker_.Close();
  ASSERT_TRUE(Pump(p, [&] { return p.counters().disconnects == 1; }));
  // With ZMQ_IMMEDIATE a send fails while no broker is connected, and "b"
  // waits in the book. But libzmq reports the disconnect a moment before it
  // closes the old pipe, so "b" may also go into that pipe and be dropped
  // with it (seen under load): then it counts as sent, and the reconnect
  // re-sends it. Either way it must reach the broker that comes back.
  ASSERT_TRUE(p.Submit("b", "", "payload-b"));
  Idle(p);

  broker_.Rebind();
  std::map<std::string, int> sent;
  std::size_t seen = 1;
  ASSERT_TRUE(Pump(p, [&] {
    auto& got = broker_.received();
    for (; seen < got.size(); ++seen) {
      for (const auto& b : got[seen].batches) ++sent[b.id];
    }
    return sent.count("a") == 1 && sent.count("b") == 1;
  })) << "a re-sent: " << sent.count("a") << ", b sent: " << sent.count("b");
  EXPECT_EQ(p.counters().reconnects, 1u);
  // "b" may go out over the new connection just before the producer reads
  // the reconnect, and then again with the re-sends: the broker's dedup
  // makes that harmless. Either way each result is delivered once.
  proto::Result results;
  results.results.push_back({"a", proto::Outcome::kOk, 1, "ra", ""});
  results.results.push_back({"b", proto::Outcome::kOk, 1, "rb", ""});
  broker_.Send(results);
  broker_.Send(results);
  ASSERT_TRUE(Pump(p, [&] { return p.counters().duplicates_dropped == 2; }));
  EXPECT_EQ(delivered_.size(), 2u);
  EXPECT_EQ(p.outstanding(), 0u);
}

}  // namespace
}  // namespace fleet::client

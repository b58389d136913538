#include "client/control_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <variant>

#include "tests/client/fake_router.h"

namespace fleet::client {
namespace {

using std::chrono::milliseconds;
using testing::Received;
using testing::ThreadedRouter;

ControlClient MakeClient(zmq::context_t& context, const std::string& ep) {
  ControlClient::Options options;
  options.endpoint = ep;
  options.socket.linger_ms = 0;
  return ControlClient(context, options);
}

proto::Control Workers() {
  proto::Control c;
  c.op = "workers";
  return c;
}

TEST(ControlClientTest, ReturnsNulloptWhenNobodyListens) {
  zmq::context_t context(1);
  ControlClient client = MakeClient(context, testing::UnusedEndpoint(context));
  EXPECT_FALSE(client.Call(Workers(), milliseconds(100)).has_value());
}

TEST(ControlClientTest, ReturnsNulloptWhenBrokerNeverAnswers) {
  zmq::context_t context(1);
  ThreadedRouter silent(context,
                        [](const Received&) { return std::vector<std::string>{}; });
  ControlClient client = MakeClient(context, silent.endpoint());
  EXPECT_FALSE(client.Call(Workers(), milliseconds(200)).has_value());
}

TEST(ControlClientTest, MatchesReplyByRequestId) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, [](const Received& r) {
    // A stale answer to some earlier request comes first.
    proto::ControlReply stale{r.request_id + 1000, proto::ErrorCode::kBusy,
                              "stale"};
    proto::WorkersReply reply;
    reply.request_id = r.request_id;
    proto::WorkerInfo w;
    w.id = "w1";
    w.state = "idle";
    w.concurrency = 4;
    reply.workers.push_back(w);
    return std::vector<std::string>{proto::Encode(stale), proto::Encode(reply)};
  });
  ControlClient client = MakeClient(context, broker.endpoint());
  for (int call = 0; call < 2; ++call) {
    auto response = client.Call(Workers(), milliseconds(10000));
    ASSERT_TRUE(response.has_value());
    const auto* reply = std::get_if<proto::WorkersReply>(&response->message);
    ASSERT_NE(reply, nullptr);
    EXPECT_EQ(reply->request_id, client.last_request_id());
    ASSERT_EQ(reply->workers.size(), 1u);
    EXPECT_EQ(reply->workers[0].id, "w1");
    EXPECT_EQ(reply->workers[0].concurrency, 4u);
  }
  EXPECT_EQ(client.stale_replies(), 2u);
}

// Regression: an ERROR names no request, so a late one (the answer to a
// call that timed out) was taken as the answer to the next call.
TEST(ControlClientTest, AnErrorIsNeverTakenForTheAnswer) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, [](const Received& r) {
    proto::Error late{proto::ErrorCode::kMalformed, "an earlier frame was garbage"};
    proto::ControlReply reply{r.request_id, proto::ErrorCode::kOk, "worker w1 retiring"};
    return std::vector<std::string>{proto::Encode(late), proto::Encode(reply)};
  });
  ControlClient client = MakeClient(context, broker.endpoint());
  proto::Control c;
  c.op = "retire";
  c.args = {"w1"};
  auto response = client.Call(c, milliseconds(10000));
  ASSERT_TRUE(response.has_value());
  const auto* reply = std::get_if<proto::ControlReply>(&response->message);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->message, "worker w1 retiring");
  EXPECT_EQ(client.stale_replies(), 1u);

  // An ERROR alone is no answer: the call times out.
  ThreadedRouter erring(context, [](const Received&) {
    return std::vector<std::string>{
        proto::Encode(proto::Error{proto::ErrorCode::kMalformed, "garbage"})};
  });
  ControlClient other = MakeClient(context, erring.endpoint());
  EXPECT_FALSE(other.Call(Workers(), milliseconds(300)).has_value());
}

TEST(ControlClientTest, SendsOpAndArgs) {
  zmq::context_t context(1);
  std::mutex mu;
  std::string seen;  // guarded by mu
  ThreadedRouter broker(context, [&](const Received& r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      seen = r.op + " " + (r.args.empty() ? "" : r.args[0]);
    }
    proto::ControlReply reply{r.request_id, proto::ErrorCode::kBusy,
                              "worker w1 holds 2 batches"};
    return std::vector<std::string>{proto::Encode(reply)};
  });
  ControlClient client = MakeClient(context, broker.endpoint());
  proto::Control c;
  c.op = "retire-if-idle";
  c.args = {"w1"};
  auto response = client.Call(c, milliseconds(10000));
  ASSERT_TRUE(response.has_value());
  const auto* reply = std::get_if<proto::ControlReply>(&response->message);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->code, proto::ErrorCode::kBusy);
  EXPECT_EQ(reply->message, "worker w1 holds 2 batches");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, "retire-if-idle w1");  // written before the reply was sent
}

}  // namespace
}  // namespace fleet::client

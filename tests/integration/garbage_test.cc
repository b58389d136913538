// Hostile input on all three broker sockets while a well-behaved producer
// runs: every bad message is answered with ERROR and counted, the broker
// keeps serving.
#include <gtest/gtest.h>

#include <random>
#include <zmq.hpp>

#include "common/codec.h"
#include "tests/support/cluster.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

struct Garbage {
  const char* name;
  std::vector<std::string> frames;
  proto::ErrorCode want;
};

std::vector<Garbage> Cases() {
  std::mt19937 rng(42);
  std::string random(512, '\0');
  for (auto& ch : random) ch = static_cast<char>(rng());
  random[0] = '\xc1';  // never valid msgpack
  return {
      {"random bytes", {random}, proto::ErrorCode::kMalformed},
      {"two frames", {"a", "b"}, proto::ErrorCode::kFrames},
      {"array32 header with no body", {std::string("\xdd\xff\xff\xff\xff", 5)},
       proto::ErrorCode::kTooLarge},
      // Each header announces more elements than bytes remain: refused
      // before anything is allocated for them.
      {"nested array headers", {std::string(100000, '\xdc')}, proto::ErrorCode::kMalformed},
      {"trailing bytes", {proto::Encode(proto::Heartbeat{}) + "zz"}, proto::ErrorCode::kMalformed},
      {"wrong version", {std::string("\x92\x07\x11", 3)}, proto::ErrorCode::kUnsupportedVersion},
      {"unknown command", {std::string("\x92\x01\x63", 3)}, proto::ErrorCode::kUnknownCommand},
      {"empty frame", {std::string()}, proto::ErrorCode::kMalformed},
  };
}

// Sends `g` and waits (bounded) for the broker's ERROR.
void ExpectError(zmq::socket_t& s, const Garbage& g, const char* where) {
  for (size_t i = 0; i < g.frames.size(); ++i) {
    s.send(zmq::buffer(g.frames[i]),
           i + 1 < g.frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, std::chrono::seconds(10)), 1)
      << where << ": no answer to " << g.name;
  zmq::message_t reply;
  ASSERT_TRUE(s.recv(reply));
  proto::Decoded d = proto::Decode(reply.data(), reply.size());
  ASSERT_TRUE(d.ok()) << d.detail;
  auto* err = std::get_if<proto::Error>(&*d.message);
  ASSERT_NE(err, nullptr) << where << ": " << g.name << " answered with command "
                          << static_cast<int>(proto::CommandOf(*d.message));
  EXPECT_EQ(err->code, g.want) << where << ": " << g.name << ": " << err->message;
}

TEST(GarbageTest, EverySocketAnswersAndCountsGarbageWhileServingAProducer) {
  Cluster c;
  c.StartBroker();
  c.StartWorker("g1", {"--concurrency", "4"});
  Process submit({Bin("fleet-submit"), "--broker", c.frontend(), "--count", "3000",
                  "--inflight", "200"},
                 c.dir().File("submit.log"));
  zmq::context_t ctx;
  int sent = 0;
  for (const std::string& ep : {c.frontend(), c.backend(), c.control()}) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(ep);
    for (const Garbage& g : Cases()) {
      ExpectError(s, g, ep.c_str());
      ++sent;
    }
    // A valid message on the wrong socket.
    std::string wrong = ep == c.frontend() ? proto::Encode(proto::Hello{"x", 1, 1, {}})
                                           : proto::Encode(proto::Submit{{{"x", "", "p"}}});
    ExpectError(s, {"wrong socket", {wrong}, proto::ErrorCode::kUnknownCommand}, ep.c_str());
    ++sent;
  }
  auto code = submit.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  EXPECT_NE(submit.ReadLog().find("ok=3000 failed=0 lost=0"), std::string::npos)
      << submit.ReadLog();
  EXPECT_GE(c.StatValue("malformed"), sent);
  EXPECT_TRUE(c.broker().Running());
}

}  // namespace
}  // namespace fleet::testing

#include "common/socket_waiter.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/zmq_util.h"

namespace fleet {
namespace {

using std::chrono::milliseconds;

// A ROUTER on an ephemeral port and a DEALER connected to it, with one
// round trip done, so no connection set-up is still under way.
class SocketWaiterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    router_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::routing_id, "d");
    const std::string endpoint = BindSocket(router_, "tcp://127.0.0.1:*");
    dealer_.connect(endpoint);
    dealer_.send(zmq::str_buffer("hello"), zmq::send_flags::none);
    ASSERT_TRUE(router_.recv(frames_[0]));
    ASSERT_TRUE(router_.recv(frames_[1]));
    ASSERT_TRUE(SendRouted(router_, "d", "welcome"));
    zmq::message_t reply;
    ASSERT_TRUE(dealer_.recv(reply));
  }

  // Receives on the router until nothing is left, as the broker's loop does;
  // returns the bodies received.
  std::vector<std::string> Drain(std::size_t i) {
    std::vector<std::string> bodies;
    std::vector<zmq::message_t> frames;
    while (RecvMultipart(router_, &frames)) bodies.push_back(frames.back().to_string());
    waiter_.Drained(i, false);
    return bodies;
  }

  // Waits (up to 5 s per turn, 20 turns) until the waiter has socket i
  // ready and a receive finds something; what a loop does.
  std::vector<std::string> WaitForInput(std::size_t i) {
    for (int turn = 0; turn < 20; ++turn) {
      waiter_.Wait(milliseconds(5000));
      if (!waiter_.ready(i)) continue;
      std::vector<std::string> got = Drain(i);
      if (!got.empty()) return got;
    }
    return {};
  }

  zmq::context_t context_;
  zmq::socket_t router_{context_, zmq::socket_type::router};
  zmq::socket_t dealer_{context_, zmq::socket_type::dealer};
  zmq::message_t frames_[2];
  SocketWaiter waiter_;
};

TEST_F(SocketWaiterTest, ASocketStartsReadySinceInputMayWaitAlready) {
  dealer_.send(zmq::str_buffer("early"), zmq::send_flags::none);
  const std::size_t i = waiter_.Add(router_);
  EXPECT_TRUE(waiter_.ready(i));
  EXPECT_EQ(WaitForInput(i), std::vector<std::string>{"early"});
}

TEST_F(SocketWaiterTest, ADrainedSocketIsNotReadyUntilInputComes) {
  const std::size_t i = waiter_.Add(router_);
  EXPECT_TRUE(Drain(i).empty());
  waiter_.Wait(milliseconds(0));
  EXPECT_FALSE(waiter_.ready(i));

  dealer_.send(zmq::str_buffer("one"), zmq::send_flags::none);
  EXPECT_EQ(WaitForInput(i), std::vector<std::string>{"one"});
  waiter_.Wait(milliseconds(0));
  EXPECT_FALSE(waiter_.ready(i)) << "drained again, nothing new";
}

TEST_F(SocketWaiterTest, ASocketStoppedAtItsBoundStaysReady) {
  const std::size_t i = waiter_.Add(router_);
  EXPECT_TRUE(Drain(i).empty());
  waiter_.Drained(i, true);
  waiter_.Wait(milliseconds(0));
  EXPECT_TRUE(waiter_.ready(i));
}

// libzmq wakes a socket's descriptor once per batch of commands, and a send
// processes them too: input that came before the send may then never wake
// the descriptor. Touched keeps such a socket ready, so the receive that
// follows finds the input however the send went.
TEST_F(SocketWaiterTest, ASocketSentOnIsReadyAgain) {
  const std::size_t i = waiter_.Add(router_);
  EXPECT_TRUE(Drain(i).empty());
  for (int k = 0; k < 50; ++k) {
    dealer_.send(zmq::str_buffer("in"), zmq::send_flags::none);
    zmq::message_t echo;
    // The send below races the input's arrival; either way the receive
    // after it must find the input.
    ASSERT_TRUE(SendRouted(router_, "d", "out"));
    waiter_.Touched(i);
    waiter_.Wait(milliseconds(0));
    ASSERT_TRUE(waiter_.ready(i));
    std::vector<std::string> got = Drain(i);
    if (got.empty()) got = WaitForInput(i);
    EXPECT_EQ(got, std::vector<std::string>{"in"}) << "round " << k;
    ASSERT_TRUE(dealer_.recv(echo));
  }
}

TEST_F(SocketWaiterTest, APlainDescriptorIsReadyWhileReadable) {
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::size_t r = waiter_.Add(router_);
  Drain(r);
  const std::size_t e = waiter_.AddFd(fd);
  EXPECT_FALSE(waiter_.ready(e));
  waiter_.Wait(milliseconds(0));
  EXPECT_FALSE(waiter_.ready(e));

  const std::uint64_t one = 1;
  ASSERT_EQ(write(fd, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  waiter_.Wait(milliseconds(5000));
  EXPECT_TRUE(waiter_.ready(e));
  EXPECT_FALSE(waiter_.ready(r));
  waiter_.Wait(milliseconds(0));
  EXPECT_TRUE(waiter_.ready(e)) << "still readable: a level";

  std::uint64_t value = 0;
  ASSERT_EQ(read(fd, &value, sizeof value), static_cast<ssize_t>(sizeof value));
  waiter_.Wait(milliseconds(0));
  EXPECT_FALSE(waiter_.ready(e));
  close(fd);
}

TEST_F(SocketWaiterTest, InputOnOneSocketWakesAWaitOnSeveral) {
  zmq::socket_t pair_a(context_, zmq::socket_type::pair);
  zmq::socket_t pair_b(context_, zmq::socket_type::pair);
  pair_a.bind("inproc://socket-waiter-test");
  pair_b.connect("inproc://socket-waiter-test");
  const std::size_t r = waiter_.Add(router_);
  const std::size_t a = waiter_.Add(pair_a);
  Drain(r);
  zmq::message_t m;
  while (pair_a.recv(m, zmq::recv_flags::dontwait)) {
  }
  waiter_.Drained(a, false);

  pair_b.send(zmq::str_buffer("event"), zmq::send_flags::none);
  bool got = false;
  for (int turn = 0; turn < 20 && !got; ++turn) {
    waiter_.Wait(milliseconds(5000));
    EXPECT_FALSE(waiter_.ready(r));
    if (!waiter_.ready(a)) continue;
    got = pair_a.recv(m, zmq::recv_flags::dontwait).has_value();
    if (!got) waiter_.Drained(a, false);
  }
  ASSERT_TRUE(got);
  EXPECT_EQ(m.to_string(), "event");
}

}  // namespace
}  // namespace fleet

#include "tests/client/fake_router.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <thread>
#include <variant>

#include "common/zmq_util.h"

namespace fleet::client::testing {

Received Copy(const std::string& identity, const zmq::message_t& frame) {
  Received r;
  r.identity = identity;
  proto::Decoded d = proto::Decode(frame.data(), frame.size());
  EXPECT_TRUE(d.ok()) << d.detail;
  if (!d.ok()) return r;
  r.command = proto::CommandOf(*d.message);
  if (const auto* s = std::get_if<proto::Submit>(&*d.message)) {
    for (const auto& b : s->batches) {
      r.batches.push_back(
          {std::string(b.id), std::string(b.queue), std::string(b.payload)});
    }
  } else if (const auto* f = std::get_if<proto::Fetch>(&*d.message)) {
    for (auto id : f->ids) r.ids.emplace_back(id);
  } else if (const auto* c = std::get_if<proto::Control>(&*d.message)) {
    r.request_id = c->request_id;
    r.op = std::string(c->op);
    for (auto a : c->args) r.args.emplace_back(a);
  }
  return r;
}

ManualRouter::ManualRouter(zmq::context_t& context)
    : context_(&context), socket_(context, zmq::socket_type::router) {
  ApplySocketOptions(socket_, SocketLimits{.linger_ms = 0, .curve = {}}, true);
  endpoint_ = BindSocket(socket_, "tcp://127.0.0.1:*");
}

void ManualRouter::Drain() {
  if (!socket_) return;  // closed
  std::vector<zmq::message_t> frames;
  while (RecvMultipart(socket_, &frames)) {
    ASSERT_EQ(frames.size(), 2u);
    peer_ = frames[0].to_string();
    received_.push_back(Copy(peer_, frames[1]));
  }
}

void ManualRouter::Send(const proto::Message& message) {
  ASSERT_FALSE(peer_.empty()) << "no peer yet";
  ASSERT_TRUE(SendRouted(socket_, peer_, proto::Encode(message)));
}

void ManualRouter::Close() {
  socket_.close();
  peer_.clear();
}

void ManualRouter::Rebind() {
  ASSERT_FALSE(socket_) << "Close first";
  zmq::socket_t socket(*context_, zmq::socket_type::router);
  ApplySocketOptions(socket, SocketLimits{.linger_ms = 0, .curve = {}}, true);
  // libzmq closes the old listener on its own threads, after Close returns:
  // the port is free again a moment later.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    try {
      socket.bind(endpoint_);
      break;
    } catch (const zmq::error_t& e) {
      ASSERT_EQ(e.num(), EADDRINUSE) << e.what();
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << endpoint_ << " stays in use";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  socket_ = std::move(socket);
}

ThreadedRouter::ThreadedRouter(zmq::context_t& context, Respond respond)
    : respond_(std::move(respond)) {
  zmq::socket_t socket(context, zmq::socket_type::router);
  ApplySocketOptions(socket, SocketLimits{.linger_ms = 0, .curve = {}}, true);
  endpoint_ = BindSocket(socket, "tcp://127.0.0.1:*");
  // The socket is handed over before the thread starts and never touched
  // here again, so it is used by one thread at a time.
  thread_ = std::thread(&ThreadedRouter::Run, this, std::move(socket));
}

ThreadedRouter::~ThreadedRouter() {
  stop_ = true;
  thread_.join();
}

void ThreadedRouter::Run(zmq::socket_t socket) {
  std::vector<zmq::message_t> frames;
  while (!stop_) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    PollNoThrow(&item, 1, std::chrono::milliseconds(20));
    while (RecvMultipart(socket, &frames)) {
      if (frames.size() != 2) continue;
      std::string peer = frames[0].to_string();
      ++messages_;
      for (const std::string& reply : respond_(Copy(peer, frames[1]))) {
        SendRouted(socket, peer, reply);
      }
    }
  }
}

std::string UnusedEndpoint(zmq::context_t& context) {
  zmq::socket_t s(context, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  std::string ep = BindSocket(s, "tcp://127.0.0.1:*");
  s.unbind(ep);
  return ep;
}

}  // namespace fleet::client::testing

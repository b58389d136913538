// Test doubles for the broker side of the client tests: a ROUTER bound to an
// ephemeral port on 127.0.0.1, either driven by the test thread
// (ManualRouter) or answering from its own thread (ThreadedRouter).
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/codec.h"
#include "common/protocol.h"

namespace fleet::client::testing {

// A message a peer sent, copied out of its frame so it outlives it.
struct Received {
  std::string identity;
  proto::Command command = proto::Command::kError;
  struct Batch {
    std::string id, queue, payload;
  };
  std::vector<Batch> batches;         // SUBMIT
  std::vector<std::string> ids;       // FETCH
  std::uint64_t request_id = 0;       // CONTROL
  std::string op;                     // CONTROL
  std::vector<std::string> args;      // CONTROL
};

// Decodes one frame into a Received; fails the test if it does not decode.
Received Copy(const std::string& identity, const zmq::message_t& frame);

// Owned by the test thread; never polled by anyone else.
class ManualRouter {
 public:
  explicit ManualRouter(zmq::context_t& context);
  const std::string& endpoint() const { return endpoint_; }
  // Receives everything waiting (without blocking) into received().
  void Drain();
  std::vector<Received>& received() { return received_; }
  // Sends `message` to the last peer heard from.
  void Send(const proto::Message& message);
  // Closes the socket, dropping every connection, as a killed broker does.
  // Drain does nothing until Rebind.
  void Close();
  // Binds a new socket to the same endpoint (a restarted broker: connected
  // peers reconnect to it, with new routing ids).
  void Rebind();

 private:
  zmq::context_t* context_;
  zmq::socket_t socket_;
  std::string endpoint_;
  std::string peer_;
  std::vector<Received> received_;
};

// Runs its own socket on its own thread until destroyed. `respond` is called
// on that thread for every message and returns the replies to send back.
class ThreadedRouter {
 public:
  using Respond = std::function<std::vector<std::string>(const Received&)>;
  ThreadedRouter(zmq::context_t& context, Respond respond);
  ~ThreadedRouter();
  const std::string& endpoint() const { return endpoint_; }
  std::size_t messages() const { return messages_.load(); }

 private:
  void Run(zmq::socket_t socket);

  Respond respond_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> messages_{0};
  std::thread thread_;
};

// An endpoint on 127.0.0.1 nobody listens on (bound, then closed).
std::string UnusedEndpoint(zmq::context_t& context);

}  // namespace fleet::client::testing

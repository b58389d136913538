// Small helpers over cppzmq shared by the programs: socket options every
// socket gets, sending an encoded message, receiving all frames of one
// message without blocking, and polling that survives EINTR.
#pragma once

#include <zmq.hpp>

#include "common/curve.h"

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace fleet {

struct SocketLimits {
  int max_message_bytes = (64 << 20) + 4096;  // ZMQ_MAXMSGSIZE per frame
  int sndhwm = 10000;                         // messages per peer
  int rcvhwm = 10000;
  int linger_ms = 1000;                       // bounded: never hang on exit
  CurveClient curve;  // client sockets: CURVE keys when enabled, else plain
};

// Applies limits and linger; for ROUTERs also ZMQ_ROUTER_MANDATORY, so a send
// to a peer that is gone fails instead of vanishing.
void ApplySocketOptions(zmq::socket_t& socket, const SocketLimits& limits,
                        bool router);

// Binds and returns the resolved endpoint (tcp://127.0.0.1:* becomes the real
// port). Throws std::runtime_error naming the endpoint on failure.
std::string BindSocket(zmq::socket_t& socket, const std::string& endpoint);

// Receives one whole message (all frames) without blocking. Returns false
// when nothing is waiting.
bool RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* frames);

// Sends [identity, body] on a ROUTER without blocking. Returns false when the
// peer is gone or its queue is full (EHOSTUNREACH / EAGAIN).
bool SendRouted(zmq::socket_t& socket, std::string_view identity,
                std::string_view body);

// Sends one frame on a DEALER. Returns false if it would block.
bool SendFrame(zmq::socket_t& socket, std::string_view body, bool block);

// zmq::poll that returns 0 on EINTR instead of throwing.
int PollNoThrow(zmq::pollitem_t* items, std::size_t count,
                std::chrono::milliseconds timeout);

}  // namespace fleet

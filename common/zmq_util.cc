#include "common/zmq_util.h"

#include <cerrno>
#include <stdexcept>

namespace fleet {

void ApplySocketOptions(zmq::socket_t& socket, const SocketLimits& limits,
                        bool router) {
  socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_message_bytes));
  socket.set(zmq::sockopt::sndhwm, limits.sndhwm);
  socket.set(zmq::sockopt::rcvhwm, limits.rcvhwm);
  socket.set(zmq::sockopt::linger, limits.linger_ms);
  if (router) {
    socket.set(zmq::sockopt::router_mandatory, 1);
    // libzmq's default listen backlog (100) overflows under a connection
    // burst (a flood, or every client reconnecting after a broker restart)
    // and the dropped SYNs cost their clients a 1 s retransmit each.
    socket.set(zmq::sockopt::backlog, 1024);
  } else {
    ApplyCurveClient(socket, limits.curve);
  }
}

std::string BindSocket(zmq::socket_t& socket, const std::string& endpoint) {
  try {
    socket.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("cannot bind " + endpoint + ": " + e.what());
  }
  return socket.get(zmq::sockopt::last_endpoint);
}

bool RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* frames) {
  frames->clear();
  zmq::message_t msg;
  if (!socket.recv(msg, zmq::recv_flags::dontwait)) return false;
  bool more = msg.more();
  frames->push_back(std::move(msg));
  while (more) {
    zmq::message_t part;
    // The rest of a multipart message is already here once the first frame is.
    if (!socket.recv(part, zmq::recv_flags::none)) break;
    more = part.more();
    frames->push_back(std::move(part));
  }
  return true;
}

bool SendRouted(zmq::socket_t& socket, std::string_view identity,
                std::string_view body) {
  try {
    if (!socket.send(zmq::buffer(identity.data(), identity.size()),
                     zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      return false;
    }
    // Once the identity frame is queued the body frame is taken as well.
    socket.send(zmq::buffer(body.data(), body.size()), zmq::send_flags::dontwait);
    return true;
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH || e.num() == EAGAIN) return false;
    throw;
  }
}

bool SendFrame(zmq::socket_t& socket, std::string_view body, bool block) {
  auto r = socket.send(zmq::buffer(body.data(), body.size()),
                       block ? zmq::send_flags::none : zmq::send_flags::dontwait);
  return r.has_value();
}

int PollNoThrow(zmq::pollitem_t* items, std::size_t count,
                std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items, count, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    throw;
  }
}

}  // namespace fleet

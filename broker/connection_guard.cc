#include "broker/connection_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/zmq_util.h"

namespace fleet::broker {
namespace {

// Events read per Drain: the loop's other sockets get their turn between.
constexpr int kDrainBound = 256;

// The TCP port of a resolved endpoint (tcp://HOST:PORT), or -1.
int PortOf(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return -1;
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos) return -1;
  return std::atoi(endpoint.c_str() + colon + 1);
}

// The local port of socket `fd`: -1 when it is not a socket at all, 0 when
// it is one without a TCP port (ipc).
int LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

std::string PeerOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  } else {
    return "local";
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace

const char* ConnectionGuard::ReasonName(int reason) {
  return reason == kBudget ? "inbound_budget" : "unproven_evicted";
}

ConnectionGuard::ConnectionGuard(zmq::context_t& context, std::uint64_t budget_bytes,
                                 Duration grace)
    : context_(context), budget_(budget_bytes, grace) {}

ConnectionGuard::~ConnectionGuard() {
  for (Endpoint& e : endpoints_) {
    if (e.server != nullptr) zmq_socket_monitor(e.server->handle(), nullptr, 0);
  }
}

void ConnectionGuard::Add(zmq::socket_t* server, const std::string& endpoint,
                          const std::string& name, std::uint64_t charge) {
  endpoints_.push_back(
      Endpoint{server, zmq::socket_t(), name, charge, PortOf(endpoint), {}, {}});
}

void ConnectionGuard::Watch(zmq::socket_t& server, const std::string& endpoint,
                            const std::string& name, std::uint64_t charge) {
  if (owned_ != endpoints_.size()) {
    throw std::logic_error("ConnectionGuard: Watch after Track");
  }
  static std::atomic<int> counter{0};
  const std::string inproc = "inproc://fleet-connection-guard-" + std::to_string(++counter);
  if (zmq_socket_monitor(server.handle(), inproc.c_str(), kEvents) != 0) {
    throw std::runtime_error("cannot monitor the " + name + " endpoint's connections: " +
                             zmq_strerror(zmq_errno()));
  }
  Add(&server, endpoint, name, charge);
  Endpoint& e = endpoints_.back();
  e.monitor = zmq::socket_t(context_, zmq::socket_type::pair);
  e.monitor.set(zmq::sockopt::linger, 0);
  e.monitor.connect(inproc);
  ++owned_;
}

void ConnectionGuard::Track(const std::string& endpoint, const std::string& name,
                            std::uint64_t charge) {
  Add(nullptr, endpoint, name, charge);
}

bool ConnectionGuard::Drain(std::size_t i, TimePoint now) {
  // Bounded per call like every other socket of the loop.
  for (int n = 0; n < kDrainBound; ++n) {
    if (!RecvMultipart(endpoints_[i].monitor, &frames_)) return false;
    // Frame 1: 16-bit event, 32-bit value (host order); frame 2: address.
    if (frames_.empty() || frames_[0].size() < 6) continue;
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    std::memcpy(&event, frames_[0].data(), sizeof event);
    std::memcpy(&value, static_cast<const char*>(frames_[0].data()) + 2, sizeof value);
    OnEvent(i, event, value, now);
  }
  return true;
}

void ConnectionGuard::OnEvent(std::size_t i, std::uint16_t event, std::uint32_t value,
                              TimePoint now) {
  if (i >= endpoints_.size()) return;
  const int fd = static_cast<int>(value);
  if (event == ZMQ_EVENT_DISCONNECTED || event == ZMQ_EVENT_CLOSED) {
    budget_.OnClosed(fd, i);
    return;
  }
  if (event != ZMQ_EVENT_ACCEPTED) return;
  const InboundBudget::Decision d = budget_.OnAccepted(fd, i, endpoints_[i].charge, now);
  for (const InboundBudget::Victim& v : d.evict) Close(v.fd, v.endpoint, kEvicted, now);
  if (!d.admitted) Close(fd, i, kBudget, now);
}

void ConnectionGuard::Close(int fd, std::size_t i, int reason, TimePoint now) {
  Endpoint& e = endpoints_[i];
  ++e.counts[reason];
  // The fd came from an event read some time after libzmq produced it: make
  // sure it still is a socket of this endpoint before cutting it. (A
  // connection of the same endpoint that took the number meanwhile is cut
  // in its place; its own accept event follows and its peer reconnects.)
  // An ipc endpoint's connections are unix sockets (no TCP port): a TCP
  // socket that took the number (a worker, /metrics) is never cut for it.
  const int port = LocalPort(fd);
  const bool ours = port >= 0 && (e.port < 0 ? port == 0 : port == e.port);
  std::string peer;
  std::uint64_t held_back = 0;
  const bool log = e.throttles[reason].Allow(now, &held_back);
  if (log && ours) peer = PeerOf(fd);
  if (ours) shutdown(fd, SHUT_RDWR);
  if (!log) return;
  const std::string more =
      held_back == 0 ? std::string()
                     : " (" + std::to_string(held_back) + " more since the last such line)";
  const double mib = 1.0 / (1 << 20);
  if (reason == kBudget) {
    spdlog::warn("refused a connection on the {} endpoint from {}: the inbound budget is full "
                 "({} connections that have not sent a valid message yet reserve {:.0f} of "
                 "{:.0f} MiB, --max-inbound-mb; its peer may reconnect later){}",
                 e.name, ours ? peer : "(gone)", budget_.unproven(),
                 budget_.reserved_bytes() * mib, budget_.budget_bytes() * mib, more);
  } else {
    spdlog::warn("closed a connection on the {} endpoint from {} that sent no valid message "
                 "to make room under the inbound budget (--max-inbound-mb){}",
                 e.name, ours ? peer : "(gone)", more);
  }
}

void ConnectionGuard::OnValidMessage(zmq::message_t& frame) {
  // ZMQ_SRCFD is deprecated in libzmq's documentation but kept in 4.3 (it
  // reads the "__fd" property of the connection's metadata); the
  // alternative, a peer address, names the host and not the connection.
  const int fd = frame.get(ZMQ_SRCFD);
  if (fd >= 0) budget_.OnProven(fd);
}

}  // namespace fleet::broker

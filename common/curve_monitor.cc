#include "common/curve_monitor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

#include "common/zmq_util.h"

namespace fleet {
namespace {

// Failed handshakes, and connections accepted and closed for the peer's
// address (plus what a sharer asked for, see Share). One or two events per
// connection, never per message: connects are rare next to batches.
constexpr int kEvents = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                        ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED;

// Descriptors remembered at most (a connection flood must not grow it).
constexpr std::size_t kMaxPeers = 65536;
// Events read per Drain: the loop's other sockets get their turn between.
constexpr int kDrainBound = 256;

// The peer's IP address of a connected socket (no port: a client that
// reconnects comes from a new port each time), "local" for ipc, "" when it
// is gone.
std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, text,
              sizeof text);
  } else if (addr.ss_family == AF_UNIX) {
    return "local (ipc)";
  }
  return text;
}

const char* Explain(int reason) {
  switch (reason) {
    case CurveMonitor::kMechanism:
      return "it does not speak CURVE (a client without --curve-server-key and --curve-key, "
             "or another security mechanism)";
    case CurveMonitor::kCryptographic:
      return "its CURVE handshake did not decrypt (it holds a different server key in "
             "--curve-server-key than this broker's, or the data was damaged)";
    default:
      return "its handshake failed";
  }
}

const char* ExplainOther(std::uint16_t event) {
  // A client without CURVE often sees the broker's greeting first and hangs
  // up before sending its own, so the mismatch shows as a broken handshake.
  return event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
             ? "the connection ended during the handshake (typically a client that does not "
               "speak CURVE and hung up on seeing the broker's CURVE greeting)"
             : "a protocol error in its handshake";
}

}  // namespace

const char* CurveMonitor::ReasonName(int reason) {
  switch (reason) {
    case kKey: return "key";
    case kMechanism: return "mechanism";
    case kCryptographic: return "cryptographic";
    default: return "other";
  }
}

int CurveMonitor::ReasonOf(std::uint16_t event, std::uint32_t value) {
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      return kKey;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) return kMechanism;
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) return kCryptographic;
      return kOther;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      return kOther;
    default:
      return -1;
  }
}

CurveMonitor::~CurveMonitor() {
  for (Watched& w : watched_) zmq_socket_monitor(w.server->handle(), nullptr, 0);
}

void CurveMonitor::Watch(zmq::socket_t& server, const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string endpoint = "inproc://fleet-curve-monitor-" + std::to_string(++counter);
  if (zmq_socket_monitor(server.handle(), endpoint.c_str(), kEvents | shared_events_) != 0) {
    throw std::runtime_error("cannot monitor the " + name + " endpoint's handshakes: " +
                             zmq_strerror(zmq_errno()));
  }
  Watched w{&server, zmq::socket_t(context_, zmq::socket_type::pair), name, {}, {}, {}, {}};
  w.monitor.set(zmq::sockopt::linger, 0);
  w.monitor.connect(endpoint);
  watched_.push_back(std::move(w));
}

bool CurveMonitor::Drain(std::size_t i, TimePoint now) {
  Watched& w = watched_[i];
  // Bounded per call like every other socket of the loop.
  for (int n = 0; n < kDrainBound; ++n) {
    if (!RecvMultipart(w.monitor, &frames_)) return false;
    // Frame 1: 16-bit event, 32-bit value (host order: the descriptor for
    // ACCEPTED and DISCONNECTED); frame 2: the bound endpoint.
    if (frames_.size() < 2 || frames_[0].size() < 6) continue;
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    std::memcpy(&event, frames_[0].data(), sizeof event);
    std::memcpy(&value, static_cast<const char*>(frames_[0].data()) + 2, sizeof value);
    if (hook_ && (event & shared_events_) != 0) hook_(i, event, value, now);
    const int fd = static_cast<int>(value);
    if (event == ZMQ_EVENT_ACCEPTED) {
      if (w.peers.size() >= kMaxPeers) w.peers.clear();
      w.peers[fd] = PeerAddress(fd);
      continue;
    }
    if (event == ZMQ_EVENT_DISCONNECTED) {
      auto it = w.peers.find(fd);
      const std::string address = it != w.peers.end() ? it->second : "";
      if (it != w.peers.end()) w.peers.erase(it);
      if (w.pending.reason >= 0) Log(w, w.pending, address, now);
      w.pending = Pending{};
      continue;
    }
    const int reason = ReasonOf(event, value);
    if (reason < 0) continue;
    ++w.counts[reason];
    // A refusal not followed by its DISCONNECTED (should not happen) is
    // logged without an address rather than dropped.
    if (w.pending.reason >= 0) Log(w, w.pending, "", now);
    w.pending = Pending{reason, event, value};
  }
  return true;
}

void CurveMonitor::Log(Watched& w, const Pending& p, const std::string& address, TimePoint now) {
  if (p.reason == kKey) return;  // the ZAP handler logged it, with the key and address
  std::uint64_t held_back = 0;
  const std::string who = address.empty() ? "address unknown" : address;
  // Per address and reason: a flood from one host is one line per 10 s,
  // and the same host failing another way (plain TCP, then the wrong key)
  // still shows.
  if (!w.throttle.Allow(who + " " + ReasonName(p.reason), now, &held_back)) return;
  spdlog::warn("refused a client on the {} endpoint ({}) from {}: {}{}{}", w.name,
               w.server->get(zmq::sockopt::last_endpoint), who,
               p.reason == kOther ? ExplainOther(p.event) : Explain(p.reason),
               p.reason == kOther
                   ? fmt::format(" (libzmq event {:#x}, value {:#x})", p.event, p.value)
                   : std::string(),
               held_back == 0 ? std::string()
                              : " (" + std::to_string(held_back) +
                                    " more like it from this address since its last line)");
}

void CurveMonitor::Tick(TimePoint now) {
  for (Watched& w : watched_) {
    const KeyedLogThrottle::Summary held = w.throttle.Expire(now);
    if (held.events == 0) continue;
    spdlog::warn("refused {} more clients on the {} endpoint from {} addresses, not logged "
                 "one by one (fleet_curve_refused_total counts every one)",
                 held.events, w.name, held.keys);
  }
}

}  // namespace fleet

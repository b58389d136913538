#include "common/curve_monitor.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

#include "common/zmq_util.h"

namespace fleet {
namespace {

// Only failed handshakes: a busy endpoint's connects and disconnects never
// wake the loop (unless a sharer asked for them, see Share).
constexpr int kEvents = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

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
  Watched w{&server, zmq::socket_t(context_, zmq::socket_type::pair), name, {}, {}};
  w.monitor.set(zmq::sockopt::linger, 0);
  w.monitor.connect(endpoint);
  watched_.push_back(std::move(w));
}

void CurveMonitor::Drain(std::size_t i, TimePoint now) {
  Watched& w = watched_[i];
  // Bounded per call like every other socket of the loop.
  for (int n = 0; n < 256 && RecvMultipart(w.monitor, &frames_); ++n) {
    // Frame 1: 16-bit event, 32-bit value (host order); frame 2: the
    // peer's address as libzmq names it.
    if (frames_.size() < 2 || frames_[0].size() < 6) continue;
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    std::memcpy(&event, frames_[0].data(), sizeof event);
    std::memcpy(&value, static_cast<const char*>(frames_[0].data()) + 2, sizeof value);
    if (hook_ && (event & shared_events_) != 0) hook_(i, event, value, now);
    const int reason = ReasonOf(event, value);
    if (reason < 0) continue;
    ++w.counts[reason];
    if (reason == kKey) continue;  // the ZAP handler logged it, with the key
    std::uint64_t held_back = 0;
    if (!w.throttles[reason].Allow(now, &held_back)) continue;
    spdlog::warn("refused a client on the {} endpoint ({}): {}{}{}", w.name,
                 frames_[1].to_string(), reason == kOther ? ExplainOther(event) : Explain(reason),
                 reason == kOther ? fmt::format(" (libzmq event {:#x}, value {:#x})", event, value)
                                  : std::string(),
                 held_back == 0
                     ? std::string()
                     : " (" + std::to_string(held_back) + " more since the last such line)");
  }
}

}  // namespace fleet

#include "common/handshake_watch.h"

#include <spdlog/fmt/fmt.h>

#include <utility>

// Rejected: failing on the first NO_DETAIL. It also means "the connection
// ended during the handshake", which a broker that stops or restarts at
// that moment causes once; only a broker that hangs up on every attempt
// (the measured wrong-server-key case) is refusing us.

namespace fleet {

bool HandshakeWatch::OnEvent(std::uint16_t event, std::uint32_t value, TimePoint now) {
  if (failed()) return false;
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
      ++handshakes_;
      no_detail_in_a_row_ = 0;
      return false;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      Fail(fmt::format(
          "authentication failed: the broker at {} refused this client's key (ZAP status {}): "
          "its public key is not on the broker's allowlist for this endpoint (add the .pub to "
          "the broker's --curve-producers, --curve-workers or --curve-control file and send the "
          "broker SIGHUP)",
          endpoint_, value));
      return true;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        Fail(fmt::format(
            "authentication failed: the broker at {} {}", endpoint_,
            curve_ ? "does not speak CURVE, and this client does (drop --curve-server-key and "
                     "--curve-key, or start the broker with --curve-secret-key)"
                   : "requires CURVE and this client speaks plain TCP (give "
                     "--curve-server-key with the broker's .pub and --curve-key with this "
                     "client's .key)"));
      } else if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
        Fail(fmt::format(
            "authentication failed: the CURVE handshake with the broker at {} did not decrypt "
            "(is --curve-server-key that broker's public key?)",
            endpoint_));
      } else {
        Fail(fmt::format("handshake with {} failed: ZeroMQ protocol error {:#x} (is it a "
                         "fleet broker's endpoint?)",
                         endpoint_, value));
      }
      return true;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      if (no_detail_in_a_row_++ == 0) first_no_detail_ = now;
      if (no_detail_in_a_row_ < limit_ || now - first_no_detail_ < kNoDetailSpan) return false;
      Fail(fmt::format(
          "authentication failed: the broker at {} hung up during the handshake {} times in "
          "a row{}",
          endpoint_, no_detail_in_a_row_,
          curve_ ? " (is --curve-server-key that broker's public key? the broker logs why it "
                   "refused)"
                 : " (does it require CURVE? the broker logs why it refused)"));
      return true;
    default:
      return false;
  }
}

void HandshakeWatch::Fail(std::string why) { error_ = std::move(why); }

}  // namespace fleet

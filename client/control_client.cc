#include "client/control_client.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <utility>
#include <variant>
#include <vector>

#include "common/endpoint.h"
#include "common/signals.h"
#include "fleet/errors.h"

namespace fleet::client {
namespace {

// The request_id a reply answers; nullopt for ERROR (it carries none) and
// for anything that is not a control reply.
std::optional<std::uint64_t> ReplyId(const proto::Message& m) {
  if (const auto* r = std::get_if<proto::ControlReply>(&m)) {
    return r->request_id;
  }
  if (const auto* r = std::get_if<proto::WorkersReply>(&m)) {
    return r->request_id;
  }
  if (const auto* r = std::get_if<proto::StatsReply>(&m)) {
    return r->request_id;
  }
  return std::nullopt;
}

const std::string& CheckedEndpoint(const std::string& endpoint) {
  CheckEndpoint("--control", endpoint, EndpointUse::kConnect);
  return endpoint;
}

}  // namespace

ControlClient::ControlClient(zmq::context_t& context, Options options)
    : options_(std::move(options)),
      monitor_(context, zmq::socket_type::pair),
      socket_(context, zmq::socket_type::dealer),
      handshake_(CheckedEndpoint(options_.endpoint), options_.socket.curve.enabled()) {
  ApplySocketOptions(socket_, options_.socket, /*router=*/false);
  // Without a connection a request is not queued (it would reach a broker
  // that starts later, long after we gave up); we wait for POLLOUT instead.
  socket_.set(zmq::sockopt::immediate, 1);
  static std::atomic<unsigned> counter{0};
  const std::string monitor_endpoint =
      "inproc://fleet-control-monitor-" + std::to_string(++counter);
  if (zmq_socket_monitor(socket_.handle(), monitor_endpoint.c_str(), HandshakeWatch::kEvents) !=
      0) {
    throw zmq::error_t();
  }
  monitor_.set(zmq::sockopt::linger, 0);
  monitor_.connect(monitor_endpoint);
  socket_.connect(options_.endpoint);
}

void ControlClient::CheckHandshake() {
  std::vector<zmq::message_t> frames;
  // Each event is [u16 event, u32 value][endpoint]; few: one per attempt.
  while (!handshake_.failed() && RecvMultipart(monitor_, &frames)) {
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    if (frames.empty() || frames[0].size() < sizeof event + sizeof value) continue;
    std::memcpy(&event, frames[0].data(), sizeof event);
    std::memcpy(&value, static_cast<const char*>(frames[0].data()) + sizeof event, sizeof value);
    handshake_.OnEvent(event, value, std::chrono::steady_clock::now());
  }
  if (handshake_.failed()) throw AuthenticationError(handshake_.error());
}

bool ControlClient::WaitFor(short events, TimePoint deadline,
                            bool stop_at_entry) {
  while (true) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (!stop_at_entry && StopRequested()) return false;
    zmq::pollitem_t items[] = {{socket_.handle(), 0, events, 0},
                               {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    if (PollNoThrow(items, 2, left) > 0) {
      if (items[1].revents & ZMQ_POLLIN) CheckHandshake();
      if (items[0].revents & events) return true;
    }
  }
}

std::optional<ControlResponse> ControlClient::Call(
    proto::Control request, std::chrono::milliseconds timeout) {
  const TimePoint deadline = std::chrono::steady_clock::now() + timeout;
  const bool stop_at_entry = StopRequested();
  CheckHandshake();
  request.request_id = next_request_id_++;
  proto::EncodeTo(request, &buffer_);

  if (!WaitFor(ZMQ_POLLOUT, deadline, stop_at_entry)) return std::nullopt;
  if (!SendFrame(socket_, buffer_, /*block=*/false)) return std::nullopt;

  std::vector<zmq::message_t> frames;
  while (WaitFor(ZMQ_POLLIN, deadline, stop_at_entry)) {
    while (RecvMultipart(socket_, &frames)) {
      if (frames.size() != 1) {
        ++stale_replies_;
        continue;
      }
      auto frame = std::make_unique<zmq::message_t>(std::move(frames[0]));
      proto::Decoded decoded =
          proto::Decode(frame->data(), frame->size(), options_.limits);
      if (!decoded.ok()) {
        ++stale_replies_;
        spdlog::warn("undecodable reply from {}: {}", options_.endpoint,
                     decoded.detail);
        continue;
      }
      const proto::Message& m = *decoded.message;
      // Only an answer that names this call's request id is its answer. An
      // ERROR names none (the broker sends one for a frame it could not
      // read as far as its request id), so it can be an answer to an
      // earlier call that timed out: never taken for this one.
      if (ReplyId(m) != request.request_id) {
        if (const auto* e = std::get_if<proto::Error>(&m)) {
          spdlog::debug("ERROR from {} that names no request (dropped): {}: {}",
                        options_.endpoint, proto::ErrorCodeName(e->code), e->message);
        }
        ++stale_replies_;  // an answer to a call that timed out
        continue;
      }
      return ControlResponse{std::move(frame), std::move(*decoded.message)};
    }
  }
  return std::nullopt;
}

}  // namespace fleet::client

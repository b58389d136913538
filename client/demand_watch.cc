#include "client/demand_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <string_view>
#include <variant>
#include <vector>

namespace fleet::client {
namespace {

// Past its wait, a request the broker should have answered is due again
// after this much more; so is a refused one.
constexpr std::chrono::seconds kOverdueSlack{5};

}  // namespace

DemandWatch::DemandWatch(zmq::context_t& context, Options options)
    : options_(std::move(options)), socket_(context, zmq::socket_type::dealer) {
  options_.wait = std::clamp(options_.wait, std::chrono::milliseconds(1),
                             std::chrono::milliseconds(600'000));
  ApplySocketOptions(socket_, options_.socket, /*router=*/false);
  // A request is only worth sending on a live connection; Arm tries again.
  socket_.set(zmq::sockopt::immediate, 1);
  socket_.connect(options_.endpoint);
}

bool DemandWatch::Arm(TimePoint now) {
  if (!due(now)) return false;
  proto::Control request;
  request.request_id = ++request_id_;
  request.op = "wait-demand";
  const std::string ms = std::to_string(options_.wait.count());
  request.args = {ms};
  proto::EncodeTo(request, &buffer_);
  if (!SendFrame(socket_, buffer_, /*block=*/false)) return false;
  outstanding_ = true;
  overdue_at_ = now + options_.wait + kOverdueSlack;
  return true;
}

std::optional<double> DemandWatch::Receive() {
  std::optional<double> demand;
  std::vector<zmq::message_t> frames;
  while (RecvMultipart(socket_, &frames)) {
    if (frames.size() != 1) continue;
    proto::Decoded d = proto::Decode(frames[0].data(), frames[0].size(), options_.limits);
    if (!d.ok()) {
      spdlog::warn("wait-demand: undecodable reply from {}: {}", options_.endpoint, d.detail);
      continue;
    }
    const auto* reply = std::get_if<proto::ControlReply>(&*d.message);
    if (reply == nullptr || reply->request_id != request_id_) continue;  // stale
    constexpr std::string_view kDemand = "demand queued=";
    std::string_view text = reply->message;
    if (reply->code == proto::ErrorCode::kOk && text == "no demand") {
      outstanding_ = false;
      refusal_logged_ = false;
      continue;
    }
    if (reply->code != proto::ErrorCode::kOk || text.substr(0, kDemand.size()) != kDemand) {
      // Stays outstanding until overdue: retried at that pace, logged once.
      if (!refusal_logged_) {
        spdlog::warn("the broker at {} refused wait-demand ({}: {}): a burst at zero workers "
                     "waits for the next poll; asking again every {} s",
                     options_.endpoint, proto::ErrorCodeName(reply->code), text,
                     std::chrono::duration_cast<std::chrono::seconds>(options_.wait +
                                                                      kOverdueSlack)
                         .count());
        refusal_logged_ = true;
      }
      continue;
    }
    outstanding_ = false;
    refusal_logged_ = false;
    text.remove_prefix(kDemand.size());
    std::uint64_t queued = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), queued);
    demand = ec == std::errc() && end == text.data() + text.size()
                 ? static_cast<double>(queued)
                 : 1.0;  // work waits; how much, the next read says
  }
  return demand;
}

}  // namespace fleet::client

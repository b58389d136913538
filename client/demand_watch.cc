#include "client/demand_watch.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <string_view>
#include <variant>
#include <vector>

namespace fleet::client {
namespace {

// Past its wait, a request the broker should have answered is re-sent after
// this much more.
constexpr std::chrono::seconds kOverdueSlack{5};

}  // namespace

DemandWatch::DemandWatch(zmq::context_t& context, Options options)
    : options_(std::move(options)), socket_(context, zmq::socket_type::dealer) {
  ApplySocketOptions(socket_, options_.socket, /*router=*/false);
  // A request is only worth sending on a live connection; Arm tries again.
  socket_.set(zmq::sockopt::immediate, 1);
  socket_.connect(options_.endpoint);
}

void DemandWatch::Arm(TimePoint now) {
  if (!supported_ || (armed_ && now < overdue_at_)) return;
  proto::Control request;
  request.request_id = ++request_id_;
  request.op = "wait-demand";
  const std::string ms = std::to_string(options_.wait.count());
  request.args = {ms};
  proto::EncodeTo(request, &buffer_);
  if (!SendFrame(socket_, buffer_, /*block=*/false)) return;  // not connected: next time
  armed_ = true;
  overdue_at_ = now + options_.wait + kOverdueSlack;
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
    armed_ = false;
    if (reply->code == proto::ErrorCode::kInvalidArgument) {
      supported_ = false;
      spdlog::info("the broker at {} does not answer wait-demand ({}): a burst at zero "
                   "workers is seen at the next poll",
                   options_.endpoint, reply->message);
      continue;
    }
    if (reply->code != proto::ErrorCode::kOk) {
      spdlog::warn("wait-demand refused by the broker: {}: {}",
                   proto::ErrorCodeName(reply->code), reply->message);
      continue;
    }
    constexpr std::string_view kPrefix = "demand queued=";
    std::string_view text = reply->message;
    if (text.substr(0, kPrefix.size()) != kPrefix) continue;  // "no demand"
    text.remove_prefix(kPrefix.size());
    std::uint64_t queued = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), queued);
    demand = ec == std::errc() && end == text.data() + text.size()
                 ? static_cast<double>(queued)
                 : 1.0;  // work waits; how much, the next read says
  }
  return demand;
}

}  // namespace fleet::client

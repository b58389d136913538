#include "autoscaler/metrics_reader.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>

namespace fleet::autoscaler {

MetricsReader::MetricsReader(MetricsSource& source, Duration timeout)
    : source_(source), timeout_(timeout) {
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  thread_ = std::thread([this] { Run(); });
}

MetricsReader::~MetricsReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
  close(event_fd_);
}

void MetricsReader::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return requested_ || stop_; });
    if (!requested_) return;  // stopping, nothing asked
    requested_ = false;
    lock.unlock();
    MetricsRead read;
    try {
      read = source_.Read();
    } catch (const std::exception& e) {  // a source must not take the thread down
      read = MetricsRead{};
      read.error = std::string("metrics read failed: ") + e.what();
    }
    lock.lock();
    done_ = std::move(read);
    const std::uint64_t one = 1;
    (void)!write(event_fd_, &one, sizeof one);
    if (stop_) return;
  }
}

bool MetricsReader::Start(TimePoint now) {
  if (running_) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requested_ = true;
  }
  cv_.notify_one();
  running_ = true;
  abandoned_ = false;
  started_ = now;
  return true;
}

std::optional<MetricsRead> MetricsReader::Take(TimePoint now) {
  std::optional<MetricsRead> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(done_);
    std::uint64_t count = 0;
    (void)!read(event_fd_, &count, sizeof count);  // drain; EAGAIN when empty
  }
  if (done) {
    running_ = false;
    if (abandoned_) return std::nullopt;  // reported as timed out already
    return done;
  }
  if (running_ && !abandoned_ && now >= started_ + timeout_) {
    abandoned_ = true;
    MetricsRead timed_out;
    timed_out.timed_out = true;
    timed_out.error = "no complete answer within " +
                      std::to_string(std::chrono::duration_cast<Millis>(timeout_).count()) +
                      " ms (--metrics-timeout)";
    return timed_out;
  }
  return std::nullopt;
}

TimePoint MetricsReader::deadline() const {
  if (!running_ || abandoned_) return TimePoint::max();
  return started_ + timeout_;
}

}  // namespace fleet::autoscaler

// Logging set-up shared by every program: spdlog to stderr, one line per
// event, level from --log-level (trace, debug, info, warn, error).
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>

#include "common/clock.h"

namespace fleet {

// Lets one log line through per `every` for one kind of event and counts
// the events held back meanwhile, so a flood of bad peers cannot flood the
// log: the next line that goes out says how many it stands for. Pure state
// (the caller passes `now`); not thread-safe: one per thread.
class LogThrottle {
 public:
  LogThrottle() = default;
  explicit LogThrottle(Duration every) : every_(every) {}

  // True when a line may be written for an event at `now`; then
  // `*held_back` is the number of events since the last line that got none.
  // False (and the event is counted) otherwise.
  bool Allow(TimePoint now, std::uint64_t* held_back) {
    if (logged_ && now < last_ + every_) {
      ++held_back_;
      return false;
    }
    *held_back = held_back_;
    held_back_ = 0;
    last_ = now;
    logged_ = true;
    return true;
  }

 private:
  Duration every_ = std::chrono::seconds(10);
  TimePoint last_{};
  bool logged_ = false;
  std::uint64_t held_back_ = 0;
};

// Configures the default logger for program `name`. Throws
// std::invalid_argument on an unknown level.
void SetupLogging(const std::string& name, const std::string& level);

}  // namespace fleet

// An injectable monotonic clock. Loops ask a Clock for `now` and hand it to
// pure state classes, so timeouts, heartbeats and TTLs are tested exactly on
// a FakeClock without sleeping.
//
// SteadyClock is thread-safe; FakeClock is not (tests drive it from one
// thread).
#pragma once

#include <chrono>

namespace fleet {

using TimePoint = std::chrono::steady_clock::time_point;
using Duration = std::chrono::steady_clock::duration;
using Millis = std::chrono::milliseconds;
using Seconds = std::chrono::seconds;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

class FakeClock : public Clock {
 public:
  explicit FakeClock(TimePoint start = TimePoint() + std::chrono::hours(1))
      : now_(start) {}
  TimePoint Now() const override { return now_; }
  void Advance(Duration d) { now_ += d; }

 private:
  TimePoint now_;
};

// Seconds between two points as a double, for gauges and logs.
inline double SecondsBetween(TimePoint from, TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace fleet

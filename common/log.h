// Logging set-up shared by every program: spdlog to stderr, one line per
// event, level from --log-level (trace, debug, info, warn, error).
#pragma once

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <map>
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

// LogThrottle per key (a peer's address): at most one line per key per
// `every`, so one noisy peer cannot hide the others and cannot flood the
// log either. Events held back for a key are reported with that key's next
// line; Expire (called on a housekeeping tick) forgets keys quiet for
// `every` and returns what was held back for them and never reported, for
// one summary line. Past `max_keys` keys, new keys are not tracked one by
// one: their events are only counted into that summary. Pure state; not
// thread-safe.
class KeyedLogThrottle {
 public:
  struct Summary {
    std::uint64_t events = 0;  // held back and not reported by a line
    std::uint64_t keys = 0;    // how many keys they came from (untracked: 1)
  };

  KeyedLogThrottle() = default;
  explicit KeyedLogThrottle(Duration every, std::size_t max_keys = 1024)
      : every_(every), max_keys_(max_keys) {}

  // True when a line may be written for `key` at `now`; `*held_back` is
  // then the number of this key's events since its last line.
  bool Allow(const std::string& key, TimePoint now, std::uint64_t* held_back) {
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      if (keys_.size() >= max_keys_) {
        ++untracked_;
        return false;
      }
      it = keys_.emplace(key, Entry{}).first;
    }
    Entry& e = it->second;
    if (e.logged && now < e.last + every_) {
      ++e.held_back;
      return false;
    }
    *held_back = e.held_back;
    e = Entry{now, true, 0};
    return true;
  }

  // Forgets the keys whose last line is older than `every`; returns the
  // events held back for them (and untracked ones) since their last line.
  Summary Expire(TimePoint now) {
    Summary s;
    for (auto it = keys_.begin(); it != keys_.end();) {
      if (now >= it->second.last + every_) {
        if (it->second.held_back > 0) {
          s.events += it->second.held_back;
          ++s.keys;
        }
        it = keys_.erase(it);
      } else {
        ++it;
      }
    }
    if (untracked_ > 0) {
      s.events += untracked_;
      ++s.keys;
      untracked_ = 0;
    }
    return s;
  }

  std::size_t size() const { return keys_.size(); }

 private:
  struct Entry {
    TimePoint last{};
    bool logged = false;
    std::uint64_t held_back = 0;
  };
  Duration every_ = std::chrono::seconds(10);
  std::size_t max_keys_ = 1024;
  std::map<std::string, Entry> keys_;
  std::uint64_t untracked_ = 0;
};

// Configures the default logger for program `name`. Throws
// std::invalid_argument on an unknown level.
void SetupLogging(const std::string& name, const std::string& level);

}  // namespace fleet

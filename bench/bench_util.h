// Small pieces every benchmark program shares: latency percentiles, the
// open-loop send schedule, a process's RSS, and the one JSON line each
// benchmark prints last (bench/run.py collects those lines).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace fleet::bench {

using SteadyClock = std::chrono::steady_clock;

inline std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

// End-to-end latencies in nanoseconds; percentiles by nearest rank.
class Latencies {
 public:
  void Reserve(std::size_t n) { ns_.reserve(n); }
  void Add(std::int64_t ns) { ns_.push_back(ns); }
  std::size_t size() const { return ns_.size(); }
  // q in [0, 1]; microseconds. Sorts once, on the first call after an Add.
  double PercentileUs(double q) {
    if (ns_.empty()) return 0;
    if (!sorted_) {
      std::sort(ns_.begin(), ns_.end());
      sorted_ = true;
    }
    auto rank = static_cast<std::size_t>(q * static_cast<double>(ns_.size()));
    return static_cast<double>(ns_[std::min(rank, ns_.size() - 1)]) / 1e3;
  }
  nlohmann::json Summary() {
    return {{"samples", ns_.size()},
            {"p50_us", PercentileUs(0.50)},
            {"p99_us", PercentileUs(0.99)},
            {"p999_us", PercentileUs(0.999)},
            {"max_us", PercentileUs(1.0)}};
  }

 private:
  std::vector<std::int64_t> ns_;
  bool sorted_ = false;
};

// Open-loop schedule: send i is due at start + i / rate, whatever happened
// to the sends before it, and its latency is measured from that due time,
// so a stall shows up in the figures of every send it delayed (no
// coordinated omission).
class OpenLoop {
 public:
  OpenLoop(double rate_per_s, std::int64_t start_ns)
      : interval_ns_(1e9 / rate_per_s), start_ns_(start_ns) {}
  std::int64_t Due(std::uint64_t i) const {
    return start_ns_ + static_cast<std::int64_t>(interval_ns_ * static_cast<double>(i));
  }
  // Sleeps until send i is due, or at most `max_wait_ns` (so a caller can
  // poll its socket meanwhile); true when it is due.
  bool WaitFor(std::uint64_t i, std::int64_t max_wait_ns) const {
    std::int64_t left = Due(i) - NowNs();
    if (left <= 0) return true;
    if (left > max_wait_ns) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(max_wait_ns));
      return false;
    }
    // The last stretch is spun: sleep_for overshoots by 50-100 us.
    if (left > 200'000) std::this_thread::sleep_for(std::chrono::nanoseconds(left - 100'000));
    while (NowNs() < Due(i)) {
    }
    return true;
  }

 private:
  double interval_ns_;
  std::int64_t start_ns_;
};

// Resident set size of `pid` in bytes (VmRSS of /proc/PID/status), 0 when
// it cannot be read.
inline std::uint64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// CPU seconds (user + system) `pid` has used so far, from /proc/PID/stat;
// 0 when it cannot be read.
inline double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces) start past the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) {
      stime = std::stoull(field);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The result line: one JSON object, last on stdout, flushed.
inline void PrintResult(const nlohmann::json& result) {
  std::printf("%s\n", result.dump().c_str());
  std::fflush(stdout);
}

}  // namespace fleet::bench

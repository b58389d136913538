// A fixed-bucket histogram that a loop fills on its hot path without locks
// or allocation, and drains into a Prometheus histogram now and then
// (ObserveMultiple), so exporter threads never touch loop state.
//
// Not thread-safe: one owner.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fleet {

class BucketCounts {
 public:
  // `bounds`: increasing upper bounds; an implicit +Inf bucket follows.
  explicit BucketCounts(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0.0) {}

  void Observe(double v) {
    auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
    counts_[static_cast<std::size_t>(it - bounds_.begin())] += 1;
    sum_ += v;
    ++count_;
  }
  // Per-bucket (not cumulative) counts since the last Clear, +Inf last.
  const std::vector<double>& counts() const { return counts_; }
  const std::vector<double>& bounds() const { return bounds_; }
  double sum() const { return sum_; }
  std::uint64_t count() const { return count_; }
  void Clear() {
    std::fill(counts_.begin(), counts_.end(), 0.0);
    sum_ = 0;
    count_ = 0;
  }

 private:
  std::vector<double> bounds_;
  std::vector<double> counts_;
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

// Latency buckets in seconds, 100 us to 5 min.
inline std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    120,  300};
}

}  // namespace fleet

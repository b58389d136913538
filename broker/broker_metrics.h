// BrokerMetrics: the broker's Prometheus metrics (names in DESIGN.md),
// registered once and refreshed from BrokerCore by the loop on its
// housekeeping tick. The numbers fleet-ctl stats shows too come from
// broker/stats_table.h, so both report the same set. The exposer's threads only read prometheus-cpp's
// atomics; they never touch broker state.
//
// Not thread-safe apart from that: the loop is the only writer.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "broker/broker_core.h"
#include "broker/connection_guard.h"
#include "common/curve_monitor.h"
#include "common/string_map.h"

namespace fleet::broker {

class BrokerMetrics {
 public:
  // Registers every family in `registry`.
  explicit BrokerMetrics(prometheus::Registry& registry);

  // Copies gauges from `core`, adds counter deltas, drains its histograms.
  void Update(BrokerCore& core, TimePoint now);
  // Durable mode: the journal's counters (the series exist only then).
  void UpdateJournal(const JournalStats& stats);
  // With CURVE: refused handshakes by endpoint and reason (the series exist
  // only then, every endpoint and reason from the first call, at 0).
  void UpdateCurve(const CurveMonitor& monitor);
  // With --max-inbound-mb: connections refused by endpoint and reason, and
  // the budget's use (the series exist only then).
  void UpdateGuard(const ConnectionGuard& guard);

 private:
  struct WorkerSeries {
    prometheus::Gauge* idle;
    prometheus::Gauge* held;
    prometheus::Gauge* retiring;
    bool seen;
  };
  // Adds the growth of `current` since the last call to `counter`.
  static void Advance(prometheus::Counter& counter, std::uint64_t current,
                      std::uint64_t& last);

  struct JournalSeries {
    prometheus::Counter* commits;
    prometheus::Counter* syncs;
    prometheus::Counter* bytes;
    prometheus::Counter* compactions;  // compactions that took effect
    prometheus::Gauge* replayed;
    prometheus::Counter* deleted;
    prometheus::Counter* compaction_failures;
    prometheus::Counter* refused;
    prometheus::Gauge* disk_bytes;
    prometheus::Gauge* live_bytes;
    prometheus::Gauge* segments;
    prometheus::Gauge* recovered;
    std::uint64_t last_commits = 0, last_syncs = 0, last_bytes = 0, last_compactions = 0;
    std::uint64_t last_deleted = 0, last_compaction_failures = 0, last_refused = 0;
  };

  struct CurveSeries {
    prometheus::Counter* counter;
    std::uint64_t last = 0;
  };

  // One series per StatsTable() entry that has a metric name, in table
  // order (null for entries without one).
  struct TableSeries {
    prometheus::Counter* counter = nullptr;
    prometheus::Gauge* gauge = nullptr;
    std::uint64_t last = 0;  // counters: the value already added
  };

  struct GuardSeries {
    std::vector<CurveSeries> refused;  // endpoint-major, kReasonCount each
    prometheus::Gauge* reserved;
    prometheus::Gauge* budget;
    prometheus::Gauge* unproven;
  };

  prometheus::Registry& registry_;
  std::unique_ptr<JournalSeries> journal_;
  std::unique_ptr<GuardSeries> guard_;
  std::vector<CurveSeries> curve_;  // endpoint-major, CurveMonitor::kReasonCount each
  std::vector<TableSeries> table_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& worker_idle_;
  prometheus::Family<prometheus::Gauge>& worker_held_;
  prometheus::Family<prometheus::Gauge>& worker_retiring_;
  prometheus::Gauge& updated_;
  prometheus::Family<prometheus::Counter>& bad_messages_;
  prometheus::Counter* bad_by_code_[16] = {};
  std::uint64_t last_bad_by_code_[16] = {};
  prometheus::Histogram& wait_seconds_;
  prometheus::Histogram& processing_seconds_;

  StringMap<prometheus::Gauge*> queue_series_;
  StringMap<WorkerSeries> worker_series_;
};

}  // namespace fleet::broker

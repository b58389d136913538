// StatsTable: every number the broker reports about itself, named once.
// Each entry gives the name fleet-ctl stats shows (STATS_REPLY), the
// Prometheus family and label it is exported under, its help text, and
// how to read it from the core. ReplyStats and BrokerMetrics both walk this
// table, so a number cannot be added to one and forgotten in the other.
//
// Exported elsewhere, because their series are not one number: the depth of
// each queue (fleet_queue_depth{queue}), the per-worker series, the
// histograms, the messages refused by error code
// (fleet_messages_rejected_total{reason}), the journal's and CURVE's
// counters, and the refresh time.
#pragma once

#include <cstdint>
#include <span>

namespace fleet::broker {

class BrokerCore;

struct StatSpec {
  enum class Kind { kCounter, kGauge };
  const char* stat;         // STATS_REPLY name, "" when not in stats
  const char* metric;       // /metrics family, "" when not exported there
  const char* label_key;    // "" for a family without labels
  const char* label_value;
  Kind kind;
  const char* help;         // the family's help (the first entry of a family)
  double (*read)(const BrokerCore& core);
};

// The table, in the order fleet-ctl stats prints it (sorted by name there).
std::span<const StatSpec> StatsTable();

}  // namespace fleet::broker

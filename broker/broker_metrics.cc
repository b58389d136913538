#include "broker/broker_metrics.h"

#include "broker/stats_table.h"

#include <chrono>
#include <stdexcept>

namespace fleet::broker {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Histogram::BucketBoundaries Bounds() { return LatencyBuckets(); }

}  // namespace

BrokerMetrics::BrokerMetrics(prometheus::Registry& r)
    : registry_(r),
      queue_depth_(BuildGauge().Name("fleet_queue_depth")
                       .Help("Batches waiting for a worker, per queue").Register(r)),
      worker_idle_(BuildGauge().Name("fleet_worker_idle_seconds")
                       .Help("Seconds since the worker's last batch finished (or it "
                             "registered); 0 while it holds a batch").Register(r)),
      worker_held_(BuildGauge().Name("fleet_worker_held_batches")
                       .Help("Batches the worker holds").Register(r)),
      worker_retiring_(BuildGauge().Name("fleet_worker_retiring")
                           .Help("1 while the worker is retiring or draining").Register(r)),
      updated_(BuildGauge().Name("fleet_metrics_updated_timestamp_seconds")
                   .Help("Wall-clock time the broker's loop last refreshed these metrics; "
                         "readers tell a stuck loop from a quiet one by it")
                   .Register(r).Add({})),
      bad_messages_(BuildCounter().Name("fleet_messages_rejected_total")
                        .Help("Messages refused with an ERROR reply, by reason").Register(r)),
      wait_seconds_(BuildHistogram().Name("fleet_batch_wait_seconds")
                        .Help("Time from accepted to dispatched").Register(r)
                        .Add({}, Bounds())),
      processing_seconds_(BuildHistogram().Name("fleet_batch_processing_seconds")
                              .Help("Time from dispatched to result").Register(r)
                              .Add({}, Bounds())) {
  // The table's families, each registered once (with the help of its
  // first entry), and a child per entry.
  StringMap<prometheus::Family<prometheus::Counter>*> counters;
  StringMap<prometheus::Family<prometheus::Gauge>*> gauges;
  for (const StatSpec& spec : StatsTable()) {
    TableSeries series;
    if (*spec.metric != '\0') {
      prometheus::Labels labels;
      if (*spec.label_key != '\0') labels[spec.label_key] = spec.label_value;
      if (spec.kind == StatSpec::Kind::kCounter) {
        auto& family = counters[spec.metric];
        if (family == nullptr) {
          family = &BuildCounter().Name(spec.metric).Help(spec.help).Register(r);
        }
        series.counter = &family->Add(labels);
      } else {
        auto& family = gauges[spec.metric];
        if (family == nullptr) {
          family = &BuildGauge().Name(spec.metric).Help(spec.help).Register(r);
        }
        series.gauge = &family->Add(labels);
      }
    }
    table_.push_back(series);
  }
  for (std::size_t c = 1; c < 16; ++c) {
    const char* name = proto::ErrorCodeName(static_cast<proto::ErrorCode>(c));
    if (std::string(name) == "unknown_error") continue;
    bad_by_code_[c] = &bad_messages_.Add({{"reason", name}});
  }
}

void BrokerMetrics::Advance(prometheus::Counter& counter, std::uint64_t current,
                            std::uint64_t& last) {
  if (current > last) counter.Increment(static_cast<double>(current - last));
  last = current;
}

void BrokerMetrics::UpdateJournal(const JournalStats& s) {
  if (journal_ == nullptr) {
    auto counter = [&](const char* name, const char* help) {
      return &BuildCounter().Name(name).Help(help).Register(registry_).Add({});
    };
    journal_ = std::make_unique<JournalSeries>();
    journal_->commits = counter("fleet_journal_commits_total",
                                "Journal writes (one per loop turn with records)");
    journal_->syncs = counter("fleet_journal_syncs_total",
                              "fdatasync calls (turns that accepted batches)");
    journal_->bytes = counter("fleet_journal_bytes_total", "Bytes appended to the journal");
    journal_->compactions = counter("fleet_journal_compactions_total",
                                    "Journal compactions (live batches copied off the loop)");
    journal_->replayed = &BuildGauge().Name("fleet_journal_replayed_records")
                              .Help("Records replayed from the journal at start")
                              .Register(registry_).Add({});
    journal_->deleted = counter("fleet_journal_segments_deleted_total",
                                "Journal segments deleted because every batch in them finished");
    journal_->compaction_failures =
        counter("fleet_journal_compaction_failures_total",
                "Compactions that failed (the segments stay as they were; tried again later)");
    journal_->refused = counter("fleet_journal_refused_writes_total",
                                "Journal writes that failed (their new batches refused with "
                                "disk_full)");
    auto gauge = [&](const char* name, const char* help) {
      return &BuildGauge().Name(name).Help(help).Register(registry_).Add({});
    };
    journal_->disk_bytes = gauge("fleet_journal_disk_bytes", "Bytes of the journal's segments");
    journal_->live_bytes =
        gauge("fleet_journal_live_bytes", "Bytes of the records of unfinished batches");
    journal_->segments = gauge("fleet_journal_segments", "Journal segments on disk");
    journal_->recovered =
        gauge("fleet_journal_recovered_dropped_bytes",
              "Damaged bytes --journal-recover dropped at start (batches in them are lost)");
  }
  JournalSeries& j = *journal_;
  Advance(*j.commits, s.commits, j.last_commits);
  Advance(*j.syncs, s.syncs, j.last_syncs);
  Advance(*j.bytes, s.bytes_written, j.last_bytes);
  Advance(*j.compactions, s.compactions, j.last_compactions);
  Advance(*j.deleted, s.segments_deleted, j.last_deleted);
  Advance(*j.compaction_failures, s.compaction_failures, j.last_compaction_failures);
  Advance(*j.refused, s.refused_commits, j.last_refused);
  j.replayed->Set(static_cast<double>(s.records_replayed));
  j.disk_bytes->Set(static_cast<double>(s.bytes_on_disk));
  j.live_bytes->Set(static_cast<double>(s.live_bytes));
  j.segments->Set(static_cast<double>(s.segments));
  j.recovered->Set(static_cast<double>(s.recovered_bytes_dropped));
}

void BrokerMetrics::UpdateCurve(const CurveMonitor& monitor) {
  if (curve_.empty()) {
    auto& family = BuildCounter()
                       .Name("fleet_curve_refused_total")
                       .Help("CURVE handshakes refused, by endpoint (producers, workers, "
                             "control) and reason (key: not on the allowlist; mechanism: no "
                             "CURVE; cryptographic: wrong server key or damaged; other)")
                       .Register(registry_);
    for (std::size_t i = 0; i < monitor.size(); ++i) {
      for (int r = 0; r < CurveMonitor::kReasonCount; ++r) {
        curve_.push_back({&family.Add({{"endpoint", monitor.name(i)},
                                       {"reason", CurveMonitor::ReasonName(r)}})});
      }
    }
  }
  for (std::size_t i = 0; i < monitor.size(); ++i) {
    for (int r = 0; r < CurveMonitor::kReasonCount; ++r) {
      CurveSeries& s = curve_[i * CurveMonitor::kReasonCount + r];
      Advance(*s.counter, monitor.refused(i, r), s.last);
    }
  }
}

void BrokerMetrics::UpdateGuard(const ConnectionGuard& guard) {
  if (guard_ == nullptr) {
    guard_ = std::make_unique<GuardSeries>();
    auto& family = BuildCounter()
                       .Name("fleet_connections_refused_total")
                       .Help("Connections closed by the inbound budget (--max-inbound-mb), by "
                             "endpoint (producers, workers, control) and reason "
                             "(inbound_budget: a new connection refused; unproven_evicted: a "
                             "connection that sent nothing valid closed to make room)")
                       .Register(registry_);
    for (std::size_t i = 0; i < guard.size(); ++i) {
      for (int r = 0; r < ConnectionGuard::kReasonCount; ++r) {
        guard_->refused.push_back({&family.Add({{"endpoint", guard.name(i)},
                                                {"reason", ConnectionGuard::ReasonName(r)}})});
      }
    }
    auto gauge = [&](const char* name, const char* help) {
      return &BuildGauge().Name(name).Help(help).Register(registry_).Add({});
    };
    guard_->reserved = gauge("fleet_inbound_reserved_bytes",
                             "Worst-case bytes charged to connections that have not sent a "
                             "valid message yet (one frame each)");
    guard_->budget = gauge("fleet_inbound_budget_bytes", "--max-inbound-mb in bytes");
    guard_->unproven = gauge("fleet_connections_unproven",
                             "Connections that have not sent a valid message yet");
  }
  for (std::size_t i = 0; i < guard.size(); ++i) {
    for (int r = 0; r < ConnectionGuard::kReasonCount; ++r) {
      CurveSeries& s = guard_->refused[i * ConnectionGuard::kReasonCount + r];
      Advance(*s.counter, guard.refused(i, r), s.last);
    }
  }
  const InboundBudget& b = guard.budget();
  guard_->reserved->Set(static_cast<double>(b.reserved_bytes()));
  guard_->budget->Set(static_cast<double>(b.budget_bytes()));
  guard_->unproven->Set(static_cast<double>(b.unproven()));
}

void BrokerMetrics::Update(BrokerCore& core, TimePoint now) {
  const BatchStore& batches = core.batches();
  for (const auto& [name, depth] : batches.Depths()) {
    auto it = queue_series_.find(name);
    if (it == queue_series_.end()) {
      it = queue_series_.emplace(name, &queue_depth_.Add({{"queue", name}})).first;
    }
    it->second->Set(static_cast<double>(depth));
  }
  const auto table = StatsTable();
  for (std::size_t i = 0; i < table.size(); ++i) {
    TableSeries& s = table_[i];
    if (s.gauge != nullptr) {
      s.gauge->Set(table[i].read(core));
    } else if (s.counter != nullptr) {
      Advance(*s.counter, static_cast<std::uint64_t>(table[i].read(core)), s.last);
    }
  }

  // Per-worker series; those of workers that left are removed, so a dead
  // worker does not linger on dashboards or in the autoscaler's view.
  for (auto& [id, s] : worker_series_) s.seen = false;
  core.workers().ForEach([&](Worker& w) {
    auto it = worker_series_.find(w.id);
    if (it == worker_series_.end()) {
      prometheus::Labels labels{{"worker", w.id}};
      it = worker_series_
               .emplace(w.id, WorkerSeries{&worker_idle_.Add(labels), &worker_held_.Add(labels),
                                           &worker_retiring_.Add(labels), true})
               .first;
    }
    it->second.seen = true;
    it->second.idle->Set(w.IdleSeconds(now));
    it->second.held->Set(static_cast<double>(w.held.size()));
    it->second.retiring->Set(w.retiring ? 1 : 0);
  });
  for (auto it = worker_series_.begin(); it != worker_series_.end();) {
    if (it->second.seen) {
      ++it;
      continue;
    }
    worker_idle_.Remove(it->second.idle);
    worker_held_.Remove(it->second.held);
    worker_retiring_.Remove(it->second.retiring);
    it = worker_series_.erase(it);
  }
  updated_.Set(std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch()).count());

  const Counters& c = core.counters();
  for (std::size_t i = 0; i < 16; ++i) {
    if (bad_by_code_[i] != nullptr) {
      Advance(*bad_by_code_[i], c.malformed_by_code[i], last_bad_by_code_[i]);
    }
  }
  if (core.wait_seconds().count() > 0) {
    wait_seconds_.ObserveMultiple(core.wait_seconds().counts(), core.wait_seconds().sum());
    core.wait_seconds().Clear();
  }
  if (core.processing_seconds().count() > 0) {
    processing_seconds_.ObserveMultiple(core.processing_seconds().counts(),
                                        core.processing_seconds().sum());
    core.processing_seconds().Clear();
  }
}

}  // namespace fleet::broker

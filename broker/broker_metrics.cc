#include "broker/broker_metrics.h"

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
      inflight_(BuildGauge().Name("fleet_batches_inflight")
                    .Help("Batches dispatched to a worker and not yet reported").Register(r)
                    .Add({})),
      held_bytes_(BuildGauge().Name("fleet_batches_held_bytes")
                      .Help("Payload bytes of the batches held, queued and running "
                            "(capped by --max-queue-bytes)").Register(r)
                    .Add({})),
      workers_(BuildGauge().Name("fleet_workers")
                   .Help("Connected workers by state (idle, busy, retiring)").Register(r)),
      worker_idle_(BuildGauge().Name("fleet_worker_idle_seconds")
                       .Help("Seconds since the worker's last batch finished (or it "
                             "registered); 0 while it holds a batch").Register(r)),
      worker_held_(BuildGauge().Name("fleet_worker_held_batches")
                       .Help("Batches the worker holds").Register(r)),
      worker_retiring_(BuildGauge().Name("fleet_worker_retiring")
                           .Help("1 while the worker is retiring or draining").Register(r)),
      blacklisted_(BuildGauge().Name("fleet_blacklisted_workers")
                       .Help("Worker ids on the blacklist").Register(r).Add({})),
      results_retained_(BuildGauge().Name("fleet_results_retained")
                            .Help("Finished results kept for re-submits and fetches")
                            .Register(r).Add({})),
      updated_(BuildGauge().Name("fleet_metrics_updated_timestamp_seconds")
                   .Help("Wall-clock time the broker's loop last refreshed these metrics; "
                         "readers tell a stuck loop from a quiet one by it")
                   .Register(r).Add({})),
      submitted_(BuildCounter().Name("fleet_batches_submitted_total")
                     .Help("Batches accepted from producers").Register(r).Add({})),
      completed_(BuildCounter().Name("fleet_batches_completed_total")
                     .Help("Results returned to producers by outcome").Register(r)),
      completed_ok_(completed_.Add({{"outcome", "ok"}})),
      completed_failed_(completed_.Add({{"outcome", "failed"}})),
      requeued_(BuildCounter().Name("fleet_batches_requeued_total")
                    .Help("Batches put back in their queue after their worker died or left")
                    .Register(r).Add({})),
      dead_lettered_(BuildCounter().Name("fleet_batches_dead_lettered_total")
                         .Help("Batches failed after --max-attempts dispatches").Register(r)
                         .Add({})),
      duplicates_(BuildCounter().Name("fleet_results_duplicate_total")
                      .Help("Late results for batches that already had one, dropped")
                      .Register(r).Add({})),
      resubmitted_(BuildCounter().Name("fleet_batches_resubmitted_total")
                       .Help("Submits of ids already queued, running or finished (not run "
                             "again)").Register(r).Add({})),
      rejected_(BuildCounter().Name("fleet_batches_rejected_total")
                    .Help("Batches refused at submit, by reason").Register(r)),
      rejected_queue_full_(rejected_.Add({{"reason", "queue_full"}})),
      rejected_too_large_(rejected_.Add({{"reason", "too_large"}})),
      rejected_invalid_(rejected_.Add({{"reason", "invalid"}})),
      bad_messages_(BuildCounter().Name("fleet_messages_rejected_total")
                        .Help("Messages refused with an ERROR reply, by reason").Register(r)),
      undeliverable_(BuildCounter().Name("fleet_messages_undeliverable_total")
                         .Help("Messages to a peer that was gone or not reading")
                         .Register(r).Add({})),
      workers_registered_(BuildCounter().Name("fleet_workers_registered_total")
                              .Help("Worker registrations").Register(r).Add({})),
      workers_dead_(BuildCounter().Name("fleet_workers_dead_total")
                        .Help("Workers declared dead after missing heartbeats").Register(r)
                        .Add({})),
      workers_retired_(BuildCounter().Name("fleet_workers_retired_total")
                           .Help("Retirements accepted (retire and retire-if-idle)")
                           .Register(r).Add({})),
      retire_refused_(BuildCounter().Name("fleet_retire_refused_total")
                          .Help("retire-if-idle refused because the worker held batches")
                          .Register(r).Add({})),
      blacklist_refusals_(BuildCounter().Name("fleet_blacklist_refusals_total")
                              .Help("Registrations refused because the id is blacklisted")
                              .Register(r).Add({})),
      dispatched_to_retiring_(BuildCounter().Name("fleet_dispatched_to_retiring_total")
                                  .Help("Batches dispatched to a retiring worker (must stay 0)")
                                  .Register(r).Add({})),
      wait_seconds_(BuildHistogram().Name("fleet_batch_wait_seconds")
                        .Help("Time from accepted to dispatched").Register(r)
                        .Add({}, Bounds())),
      processing_seconds_(BuildHistogram().Name("fleet_batch_processing_seconds")
                              .Help("Time from dispatched to result").Register(r)
                              .Add({}, Bounds())) {
  const char* states[3] = {"idle", "busy", "retiring"};
  for (int i = 0; i < 3; ++i) workers_by_state_[i] = &workers_.Add({{"state", states[i]}});
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
                                    "Journal compactions (live batches rewritten)");
    journal_->replayed = &BuildGauge().Name("fleet_journal_replayed_records")
                              .Help("Records replayed from the journal at start")
                              .Register(registry_).Add({});
  }
  JournalSeries& j = *journal_;
  Advance(*j.commits, s.commits, j.last_commits);
  Advance(*j.syncs, s.syncs, j.last_syncs);
  Advance(*j.bytes, s.bytes_written, j.last_bytes);
  Advance(*j.compactions, s.compactions, j.last_compactions);
  j.replayed->Set(static_cast<double>(s.records_replayed));
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

void BrokerMetrics::Update(BrokerCore& core, TimePoint now) {
  const BatchStore& batches = core.batches();
  for (const auto& [name, depth] : batches.Depths()) {
    auto it = queue_series_.find(name);
    if (it == queue_series_.end()) {
      it = queue_series_.emplace(name, &queue_depth_.Add({{"queue", name}})).first;
    }
    it->second->Set(static_cast<double>(depth));
  }
  inflight_.Set(static_cast<double>(batches.running()));
  held_bytes_.Set(static_cast<double>(batches.bytes()));
  auto by_state = core.workers().CountByState();
  for (int i = 0; i < 3; ++i) workers_by_state_[i]->Set(static_cast<double>(by_state[i]));

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
  blacklisted_.Set(static_cast<double>(core.blacklist().size()));
  updated_.Set(std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch()).count());
  results_retained_.Set(static_cast<double>(core.results().size()));

  const Counters& c = core.counters();
  Advance(submitted_, c.submitted, last_.submitted);
  Advance(completed_ok_, c.completed_ok, last_.completed_ok);
  Advance(completed_failed_, c.completed_failed, last_.completed_failed);
  Advance(requeued_, c.requeued, last_.requeued);
  Advance(dead_lettered_, c.dead_lettered, last_.dead_lettered);
  Advance(duplicates_, c.duplicates, last_.duplicates);
  Advance(resubmitted_, c.resubmitted, last_.resubmitted);
  Advance(rejected_queue_full_, c.rejected_queue_full, last_.rejected_queue_full);
  Advance(rejected_too_large_, c.rejected_too_large, last_.rejected_too_large);
  Advance(rejected_invalid_, c.rejected_invalid, last_.rejected_invalid);
  for (std::size_t i = 0; i < 16; ++i) {
    if (bad_by_code_[i] != nullptr) {
      Advance(*bad_by_code_[i], c.malformed_by_code[i], last_.malformed_by_code[i]);
    }
  }
  Advance(undeliverable_, c.undeliverable, last_.undeliverable);
  Advance(workers_registered_, c.workers_registered, last_.workers_registered);
  Advance(workers_dead_, c.workers_dead, last_.workers_dead);
  Advance(workers_retired_, c.workers_retired, last_.workers_retired);
  Advance(retire_refused_, c.retire_refused, last_.retire_refused);
  Advance(blacklist_refusals_, c.blacklist_refusals, last_.blacklist_refusals);
  Advance(dispatched_to_retiring_, c.dispatched_to_retiring, last_.dispatched_to_retiring);

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

#include "broker/stats_table.h"

#include "broker/broker_core.h"

namespace fleet::broker {
namespace {

using Kind = StatSpec::Kind;

double D(std::uint64_t v) { return static_cast<double>(v); }

const StatSpec kTable[] = {
    {"queued", "", "", "", Kind::kGauge, "",
     [](const BrokerCore& c) { return D(c.batches().queued()); }},
    {"inflight", "fleet_batches_inflight", "", "", Kind::kGauge,
     "Batches dispatched to a worker and not yet reported",
     [](const BrokerCore& c) { return D(c.batches().running()); }},
    {"held_bytes", "fleet_batches_held_bytes", "", "", Kind::kGauge,
     "Payload bytes of the batches held, queued and running (capped by --max-queue-bytes)",
     [](const BrokerCore& c) { return D(c.batches().bytes()); }},
    {"workers_idle", "fleet_workers", "state", "idle", Kind::kGauge,
     "Connected workers by state (idle, busy, retiring)",
     [](const BrokerCore& c) { return D(c.worker_registry().CountByState()[0]); }},
    {"workers_busy", "fleet_workers", "state", "busy", Kind::kGauge, "",
     [](const BrokerCore& c) { return D(c.worker_registry().CountByState()[1]); }},
    {"workers_retiring", "fleet_workers", "state", "retiring", Kind::kGauge, "",
     [](const BrokerCore& c) { return D(c.worker_registry().CountByState()[2]); }},
    {"blacklisted", "fleet_blacklisted_workers", "", "", Kind::kGauge,
     "Worker ids on the blacklist",
     [](const BrokerCore& c) { return D(c.blacklist().size()); }},
    {"results_retained", "fleet_results_retained", "", "", Kind::kGauge,
     "Finished results kept for re-submits and fetches",
     [](const BrokerCore& c) { return D(c.results().size()); }},
    {"submitted", "fleet_batches_submitted_total", "", "", Kind::kCounter,
     "Batches accepted from producers",
     [](const BrokerCore& c) { return D(c.counters().submitted); }},
    {"resubmitted", "fleet_batches_resubmitted_total", "", "", Kind::kCounter,
     "Submits of ids already queued, running or finished (not run again)",
     [](const BrokerCore& c) { return D(c.counters().resubmitted); }},
    {"completed_ok", "fleet_batches_completed_total", "outcome", "ok", Kind::kCounter,
     "Results returned to producers by outcome",
     [](const BrokerCore& c) { return D(c.counters().completed_ok); }},
    {"completed_failed", "fleet_batches_completed_total", "outcome", "failed", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().completed_failed); }},
    {"dead_lettered", "fleet_batches_dead_lettered_total", "", "", Kind::kCounter,
     "Batches failed after --max-attempts dispatches",
     [](const BrokerCore& c) { return D(c.counters().dead_lettered); }},
    {"requeued", "fleet_batches_requeued_total", "", "", Kind::kCounter,
     "Batches put back in their queue after their worker died or left",
     [](const BrokerCore& c) { return D(c.counters().requeued); }},
    {"duplicates", "fleet_results_duplicate_total", "", "", Kind::kCounter,
     "Late results for batches that already had one, dropped",
     [](const BrokerCore& c) { return D(c.counters().duplicates); }},
    {"rejected", "", "", "", Kind::kCounter, "",
     [](const BrokerCore& c) {
       const Counters& k = c.counters();
       return D(k.rejected_queue_full + k.rejected_too_large + k.rejected_invalid +
                k.rejected_disk_full);
     }},
    {"rejected_queue_full", "fleet_batches_rejected_total", "reason", "queue_full",
     Kind::kCounter, "Batches refused at submit, by reason",
     [](const BrokerCore& c) { return D(c.counters().rejected_queue_full); }},
    {"rejected_too_large", "fleet_batches_rejected_total", "reason", "too_large",
     Kind::kCounter, "", [](const BrokerCore& c) { return D(c.counters().rejected_too_large); }},
    {"rejected_invalid", "fleet_batches_rejected_total", "reason", "invalid", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().rejected_invalid); }},
    {"rejected_disk_full", "fleet_batches_rejected_total", "reason", "disk_full",
     Kind::kCounter, "", [](const BrokerCore& c) { return D(c.counters().rejected_disk_full); }},
    {"journal_disk_full", "fleet_journal_refusing", "reason", "disk_full", Kind::kGauge,
     "1 while a durable broker refuses new batches because its journal cannot be written "
     "(disk_full: no space; write_error: another write or sync error)",
     [](const BrokerCore& c) {
       return D(c.journal() != nullptr && c.journal()->state() == JournalState::kNoSpace);
     }},
    {"journal_write_error", "fleet_journal_refusing", "reason", "write_error", Kind::kGauge, "",
     [](const BrokerCore& c) {
       return D(c.journal() != nullptr && c.journal()->state() == JournalState::kFailed);
     }},
    {"malformed", "", "", "", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().malformed); }},
    {"undeliverable", "fleet_messages_undeliverable_total", "", "", Kind::kCounter,
     "Messages to a peer that was gone or not reading",
     [](const BrokerCore& c) { return D(c.counters().undeliverable); }},
    {"workers_registered", "fleet_workers_registered_total", "", "", Kind::kCounter,
     "Worker registrations",
     [](const BrokerCore& c) { return D(c.counters().workers_registered); }},
    {"duplicate_worker_refusals", "fleet_duplicate_worker_refusals_total", "", "",
     Kind::kCounter,
     "HELLOs refused because their worker id is registered on another live connection",
     [](const BrokerCore& c) { return D(c.counters().duplicate_worker_refusals); }},
    {"workers_dead", "fleet_workers_dead_total", "", "", Kind::kCounter,
     "Workers declared dead: silent past liveness, or their connection gone",
     [](const BrokerCore& c) { return D(c.counters().workers_dead); }},
    {"workers_retired", "fleet_workers_retired_total", "", "", Kind::kCounter,
     "Retirements accepted (retire and retire-if-idle)",
     [](const BrokerCore& c) { return D(c.counters().workers_retired); }},
    {"retire_refused", "fleet_retire_refused_total", "", "", Kind::kCounter,
     "retire-if-idle refused because the worker held batches",
     [](const BrokerCore& c) { return D(c.counters().retire_refused); }},
    {"blacklist_refusals", "fleet_blacklist_refusals_total", "", "", Kind::kCounter,
     "Registrations refused because the id is blacklisted",
     [](const BrokerCore& c) { return D(c.counters().blacklist_refusals); }},
    {"dispatched_to_retiring", "fleet_dispatched_to_retiring_total", "", "", Kind::kCounter,
     "Batches dispatched to a retiring worker (must stay 0)",
     [](const BrokerCore& c) { return D(c.counters().dispatched_to_retiring); }},
    {"object_requests", "", "", "", Kind::kCounter, "",
     [](const BrokerCore& c) {
       std::uint64_t n = 0;
       for (std::uint64_t v : c.counters().object_answers) n += v;
       return D(n);
     }},
    {"", "fleet_object_requests_total", "status", "ok", Kind::kCounter,
     "Object requests answered to workers (OBJECT_DATA sent), by status",
     [](const BrokerCore& c) { return D(c.counters().object_answers[0]); }},
    {"", "fleet_object_requests_total", "status", "unknown_object", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().object_answers[1]); }},
    {"", "fleet_object_requests_total", "status", "producer_gone", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().object_answers[2]); }},
    {"", "fleet_object_requests_total", "status", "unknown_batch", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().object_answers[3]); }},
    {"", "fleet_object_requests_total", "status", "busy", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().object_answers[4]); }},
    {"", "fleet_object_requests_total", "status", "timeout", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().object_answers[5]); }},
    {"", "fleet_object_requests_total", "status", "bad_request", Kind::kCounter, "",
     [](const BrokerCore& c) { return D(c.counters().object_answers[6]); }},
    {"object_bytes", "fleet_object_bytes_total", "", "", Kind::kCounter,
     "Object data bytes relayed from producers to workers",
     [](const BrokerCore& c) { return D(c.counters().object_bytes); }},
    {"object_replies_dropped", "fleet_object_replies_dropped_total", "", "", Kind::kCounter,
     "OBJECT_REPLYs that matched no pending request (late after a timeout, or from another "
     "connection)",
     [](const BrokerCore& c) { return D(c.counters().object_replies_dropped); }},
    {"", "fleet_object_requests_pending", "", "", Kind::kGauge,
     "Object requests passed on to producers and not yet answered",
     [](const BrokerCore& c) { return D(c.objects().size()); }},
};

}  // namespace

std::span<const StatSpec> StatsTable() { return kTable; }

}  // namespace fleet::broker

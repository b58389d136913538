// The dispatch rule: which worker gets the next waiting batch. Part of
// BrokerCore (see broker_core.h); the order it walks is the registry's
// ready list (broker/worker_registry.h).
//
// Pack, then spread:
//  1. A batch goes to the worker that most recently had work (a result
//     came from it last) among those with a free slot (fewer batches held
//     than it runs at once) and credit, and that worker is filled before
//     the next is tried. Under partial load the same few workers stay busy
//     and the others go idle, long enough for the autoscaler to retire them.
//     A saturated fleet still fills every slot: a worker without a free
//     slot is passed over for the next one in the list.
//  2. Only when no listed worker has a free slot for the waiting batches is
//     prefetch credit (held beyond the slots, --prefetch) spent, one batch
//     per worker per round, so prefetched work is shared evenly and the
//     next slot to free anywhere finds a batch beside it.
// Newly registered workers join the list at its end, so a burst spills
// onto them only once the busy ones are full.
//
// Rejected: round robin over every worker with credit (the rule before).
// It gave each worker a batch in turn, so under a steady trickle every
// worker got one now and then, none was ever idle for --idle-seconds, and
// the pool never shrank below its peak. Rejected too: packing prefetch
// credit as well. A batch prefetched onto a busy worker waits for that
// worker's slot while another worker's slot may be free; spreading the
// prefetch keeps that wait short.
#include "broker/broker_core.h"

namespace fleet::broker {

void BrokerCore::Assign(Worker& w, BatchSeq seq, TimePoint now) {
  Batch* b = batches_.Get(seq);
  if (w.retiring) ++counters_.dispatched_to_retiring;  // never: retiring workers are unlisted
  wait_seconds_.Observe(SecondsBetween(b->enqueued_at, now));
  ++b->attempts;
  if (journal_ != nullptr) NoteAttempts(*b, seq);
  batches_.SetWorker(seq, w.id);
  b->dispatched_at = now;
  b->held_index = static_cast<std::uint32_t>(w.held.size());
  --w.credit;
  w.held.push_back(seq);
  if (w.outgoing.empty()) outbox_.dispatch_workers.push_back(w.id);
  w.outgoing.push_back(seq);
  w.last_sent = now;
}

void BrokerCore::Pump(TimePoint now) {
  if (batches_.queued() == 0) return;
  if (!demand_waiters_.empty()) AnswerDemand();
  if (workers_.ready_count() == 0) return;
  // 1. Pack onto free slots, most recently busy worker first.
  workers_.VisitReady([&](Worker& w) {
    while (w.credit > 0 && w.has_free_slot()) {
      const std::optional<BatchSeq> seq = batches_.Pop(w.queues);
      if (!seq) break;  // nothing waits in its queues
      Assign(w, *seq, now);
    }
    return batches_.queued() > 0;
  });
  // 2. Spread over prefetch credit, a batch per worker per round.
  while (batches_.queued() > 0 && workers_.ready_count() > 0) {
    bool assigned = false;
    workers_.VisitReady([&](Worker& w) {
      if (const std::optional<BatchSeq> seq = batches_.Pop(w.queues)) {
        Assign(w, *seq, now);
        assigned = true;
      }
      return batches_.queued() > 0;
    });
    if (!assigned) break;  // what waits is for queues no listed worker serves
  }
}

}  // namespace fleet::broker

// Counters the broker keeps as plain integers; the loop is their only
// writer. fleet-ctl stats and the metrics exporter read them.
#pragma once

#include <cstdint>

namespace fleet::broker {

struct Counters {
  std::uint64_t submitted = 0;          // accepted from producers
  std::uint64_t completed_ok = 0;       // results delivered, ok
  std::uint64_t completed_failed = 0;   // results delivered, failed
  std::uint64_t dead_lettered = 0;      // failed after max attempts
  std::uint64_t requeued = 0;           // put back after a worker died/left
  std::uint64_t duplicates = 0;         // late results for finished batches
  std::uint64_t resubmitted = 0;        // submits of ids already known
  std::uint64_t unknown_results = 0;    // results for ids never seen
  std::uint64_t rejected_queue_full = 0;
  std::uint64_t rejected_too_large = 0;
  std::uint64_t rejected_invalid = 0;
  std::uint64_t rejected_disk_full = 0;  // durable mode: the journal could not be written
  std::uint64_t malformed = 0;          // undecodable or misplaced messages
  std::uint64_t malformed_by_code[16] = {};  // by proto::ErrorCode
  std::uint64_t dispatched_to_retiring = 0;  // invariant: stays 0
  std::uint64_t undeliverable = 0;      // messages to a gone or full peer
  std::uint64_t workers_registered = 0;
  std::uint64_t workers_dead = 0;       // silent past liveness
  std::uint64_t workers_retired = 0;    // retire / retire-if-idle accepted
  std::uint64_t retire_refused = 0;     // retire-if-idle on a busy worker
  std::uint64_t blacklist_refusals = 0; // HELLO from a blacklisted id
  std::uint64_t duplicate_worker_refusals = 0;  // HELLO with a live worker's id
  std::uint64_t resets = 0;             // messages from unknown workers
  // Objects (docs/protocol.md section 5a).
  std::uint64_t object_answers[8] = {};  // OBJECT_DATA sent, by proto::ObjectStatus
  std::uint64_t object_bytes = 0;        // object data bytes relayed to workers
  std::uint64_t object_replies_dropped = 0;  // OBJECT_REPLYs matching no request
};

}  // namespace fleet::broker

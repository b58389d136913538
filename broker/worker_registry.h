// WorkerRegistry: the workers connected to the broker, by id and by routing
// id, with their credit, the batches they hold and their state, plus the
// round-robin list of workers that can take work now.
//
// Pure state: callers pass `now`. Not thread-safe; the broker loop owns it.
// Workers refer to batches by BatchSeq, never by pointer.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "broker/batch_store.h"
#include "common/clock.h"
#include "common/string_map.h"

namespace fleet::broker {

enum class WorkerState { kIdle, kBusy, kRetiring };

const char* WorkerStateName(WorkerState state);

struct Worker {
  std::string id;
  std::string identity;  // ZeroMQ routing id of its connection
  std::uint32_t concurrency = 1;
  std::uint32_t credit = 0;  // batches it will take now
  std::vector<std::string> queues;  // empty: every queue
  std::vector<BatchSeq> held;       // dispatched, no result yet
  std::vector<BatchSeq> outgoing;   // dispatched this loop turn, not yet sent
  bool retiring = false;    // gets nothing new
  bool self_drain = false;  // retiring because it said DRAIN (SIGTERM)
  bool stop_sent = false;   // told to stop; it will say BYE
  bool in_ready = false;    // listed in the ready round robin
  TimePoint registered_at;
  TimePoint idle_since;  // last result, or registration
  TimePoint last_seen;   // last message from it
  TimePoint last_sent;   // last message to it
  TimePoint retired_at;  // when retire / retire-if-idle was accepted
  std::uint64_t processed = 0;
  std::uint64_t failed = 0;

  WorkerState state() const {
    if (retiring) return WorkerState::kRetiring;
    return held.empty() ? WorkerState::kIdle : WorkerState::kBusy;
  }
  // Seconds since its last batch finished; 0 while it holds one.
  double IdleSeconds(TimePoint now) const {
    return held.empty() ? SecondsBetween(idle_since, now) : 0.0;
  }
};

class WorkerRegistry {
 public:
  Worker* Find(std::string_view id);
  Worker* FindByIdentity(std::string_view identity);

  // Registers a new worker. Requires: Find(id) and FindByIdentity(identity)
  // both empty.
  Worker& Add(std::string_view id, std::string_view identity, TimePoint now);
  // Forgets a worker. Its held batches are the caller's to requeue first.
  void Remove(std::string_view id);

  // Lists `w` as able to take work if it has credit and is not retiring.
  void MarkReady(Worker& w);
  // Next worker id in the round robin, removed from the list; empty when no
  // worker is listed. The caller re-lists it with MarkReady.
  std::optional<std::string> NextReady();

  std::size_t size() const { return by_id_.size(); }
  // Counts by state: [idle, busy, retiring].
  std::array<std::size_t, 3> CountByState() const;

  template <typename F>
  void ForEach(F&& f) {
    for (auto& [id, w] : by_id_) f(w);
  }
  // Ids of every worker, sorted.
  std::vector<std::string> Ids() const;

 private:
  StringMap<Worker> by_id_;
  StringMap<std::string> id_by_identity_;
  std::deque<std::string> ready_;
};

}  // namespace fleet::broker

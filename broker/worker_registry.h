// WorkerRegistry: the workers connected to the broker, by id and by routing
// id, with their credit, the batches they hold and their state, plus the
// list of workers that can take work now, most recently busy first (the
// order the dispatch rule, broker/dispatch_rule.cc, walks).
//
// Pure state: callers pass `now`. Not thread-safe; the broker loop owns it.
// Workers refer to batches by BatchSeq, never by pointer.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <list>
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
  std::string incarnation;  // from HELLO: one value per process run ("" unknown)
  std::uint32_t concurrency = 1;  // batches it may hold: slots + prefetch
  std::uint32_t slots = 1;        // batches it runs at once (<= concurrency)
  std::uint32_t credit = 0;  // batches it will take now
  std::vector<std::string> queues;  // empty: every queue
  std::vector<BatchSeq> held;       // dispatched, no result yet
  std::vector<BatchSeq> outgoing;   // dispatched this loop turn, not yet sent
  bool retiring = false;    // gets nothing new
  bool self_drain = false;  // retiring because it said DRAIN (SIGTERM)
  bool stop_sent = false;   // told to stop; it will say BYE
  bool in_ready = false;    // listed in the ready list (ready_pos valid)
  std::list<std::string>::iterator ready_pos;
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
  // True while fewer batches are held than it runs at once.
  bool has_free_slot() const { return held.size() < slots; }
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

  // Where MarkReady puts a worker in the ready list.
  enum class Recency {
    kJustBusy,  // it just had work (a result came): first
    kKeep,      // where it is; at the end if it was not listed (new, unretired)
  };
  // Lists `w` as able to take work if it has credit and is not retiring,
  // else takes it off the list.
  void MarkReady(Worker& w, Recency recency = Recency::kKeep);

  // Calls visit(worker) for each listed worker, most recently busy first,
  // until it returns false. `visit` may spend the worker's credit or retire
  // it: a worker left without credit leaves the list after its visit.
  template <typename F>
  void VisitReady(F&& visit) {
    for (auto it = ready_.begin(); it != ready_.end();) {
      Worker* w = Find(*it);
      const auto next = std::next(it);
      const bool go_on = visit(*w);
      if (w->credit == 0 || w->retiring) Unlist(*w);
      if (!go_on) return;
      it = next;
    }
  }
  std::size_t ready_count() const { return ready_.size(); }

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
  void Unlist(Worker& w);

  StringMap<Worker> by_id_;
  StringMap<std::string> id_by_identity_;
  // Ids of the workers with credit that are not retiring, most recently
  // busy first; each worker keeps its position (ready_pos) so moving or
  // removing it is O(1).
  std::list<std::string> ready_;
};

}  // namespace fleet::broker

// The process handler (`--handler process --exec CMD`): one persistent
// handler process per slot, started once and kept running, spoken to over
// its stdin and stdout with the framed protocol of docs/handler-protocol.md.
//
// Owns the handler processes (each in its own process group, with
// SIGKILL as its parent-death signal), their pipes and a supervisor thread
// that starts them, reads their `ready`, logs their stderr line by line,
// reaps those that exit and restarts them with backoff. Batches reach the
// processes one of two ways. The worker's loop queues them (Submit) and
// drives every exchange without blocking: it polls the pipes of the
// processes running a batch (PollItems) and collects the answers
// (Service), so a batch costs no thread hop beyond the handler's own
// process. Or slot threads call RunBatch, which blocks (the tests' way,
// and any caller without a loop). Either way the caller takes a ready,
// idle process for the batch and owns its stdin and stdout until every
// batch it sent is answered. On the loop, a process whose `ready` names a
// depth above 1 also gets batches while busy, queued behind its others
// (only when no process is idle), and answers them in order. State is
// guarded by one mutex; the loop hears of readiness changes through an
// eventfd.
//
// Destruction closes every handler's stdin, waits the grace period for
// them to exit, SIGKILLs the process groups of those left and reaps them
// all: no zombie and no stray process after it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "worker/handler.h"
#include "worker/slot_pool.h"

namespace fleet::worker {

class ProcessHandler : public Handler {
 public:
  struct Options {
    std::string command;           // run by `shell -c`; non-empty
    int slots = 1;                 // handler processes; 1..1024
    std::string worker_id;         // passed on as FLEET_WORKER_ID
    std::string shell = "/bin/sh";
    Timeout grace{5};              // to exit after stdin is closed
    std::size_t max_frame_bytes = (64u << 20) + (64u << 10);  // a handler's frame body
    std::chrono::milliseconds backoff_initial{100};
    std::chrono::milliseconds backoff_max{10000};
    // How long a batch waits for a ready handler when none is (they are
    // all restarting) before it is given back for another try.
    std::chrono::milliseconds ready_wait{30000};
    // Handlers may fetch objects: FLEET_HANDLER_FEATURES=objects, and a
    // `get` is taken (on the loop) instead of breaking the protocol.
    bool objects = false;
  };

  // Starts the supervisor, which starts every slot's process at once.
  // Throws std::invalid_argument on bad options, std::runtime_error when
  // the supervisor's descriptors cannot be made.
  explicit ProcessHandler(Options options);
  ~ProcessHandler() override;
  ProcessHandler(const ProcessHandler&) = delete;
  ProcessHandler& operator=(const ProcessHandler&) = delete;

  HandlerOutput Run(std::string payload, Timeout timeout) override;
  HandlerOutput RunBatch(const BatchInfo& batch, std::string payload,
                         Timeout timeout) override;
  // SIGKILLs every handler's process group and fails the batches waiting.
  void Abort() override;
  std::string_view name() const override { return "process"; }

  int ready_slots() const override;
  int ready_fd() const override { return ready_fd_; }
  void AckReady() override;

  // Processes started so far (first starts and restarts), for tests.
  int starts() const;

  // ---- on the worker's loop (one thread; not mixed with RunBatch) ----
  // Result and error caps, and the timeout, as Completion::Run has them.
  struct Limits {
    Timeout timeout{0};
    std::size_t max_result_bytes = 16u << 20;
    std::size_t max_error_bytes = 8u << 10;
  };
  // Queues `tasks` (left empty) in order; each starts on the first idle
  // ready process (now, if one is). A batch answered at once (a quick
  // handler on another core) is appended to `done`.
  void Submit(std::vector<Task>& tasks, const Limits& limits, std::vector<Completion>* done);
  // Appends what the loop must poll for the running batches: each busy
  // process's stdout, and its stdin while the batch is still being written.
  void PollItems(std::vector<zmq::pollitem_t>* items) const;
  // After the poll, with the items PollItems appended (their revents set):
  // advances those exchanges, fails batches past their timeout, appends
  // every finished batch to `done`, and starts queued batches on processes
  // now idle. Call it after every poll (also for readiness changes).
  void Service(const zmq::pollitem_t* items, std::size_t count, const Limits& limits,
               std::vector<Completion>* done);
  // The earliest batch timeout of the running ones, for the poll's wait.
  std::optional<std::chrono::steady_clock::time_point> NextDeadline() const;
  // Batches waiting for a process, and processes holding batches.
  std::size_t queued() const { return queue_.size(); }
  std::size_t running() const { return running_.size(); }

  // ---- objects (docs/handler-protocol.md, "Objects"; on the loop) ----
  // Requests a handler may keep out at once; the largest chunk asked for
  // (an `object` frame then fits the frames a handler takes from us).
  static constexpr std::uint32_t kMaxGetsPerHandler = 16;
  static constexpr std::uint64_t kMaxObjectChunk = 16u << 20;
  // A handler's `get`, for the worker to send as OBJECT_GET: `tag` is ours
  // (unique in this handler), on behalf of `batch_id`, the batch the
  // handler runs; `length` already at most kMaxObjectChunk.
  struct ObjectGetOut {
    std::uint64_t tag = 0;
    std::string batch_id;
    std::string digest;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  // The gets read since the last call, into *out (cleared first).
  void TakeObjectGets(std::vector<ObjectGetOut>* out);
  bool has_object_gets() const { return !new_gets_.empty(); }
  // The answer to the get `tag` names, passed on to the handler that asked
  // (as its own tag): kDelivered; kStale when that handler was restarted
  // (or is failing) since, and nobody gets it; kUnknown when no get is out
  // with that tag (answered already, or never ours).
  enum class Delivery { kDelivered, kStale, kUnknown };
  Delivery DeliverObject(std::uint64_t tag, std::uint32_t status, std::uint64_t total,
                         std::uint64_t offset, std::string_view data, std::string_view error);
  // Answers every get still out with `status` and `error` (the worker's
  // connection was replaced: the broker forgot them).
  void FailObjectGets(std::uint32_t status, std::string_view error);
  std::size_t object_gets_out() const { return gets_.size(); }

 private:
  struct Child;
  using Clock = std::chrono::steady_clock;

  void SupervisorMain();
  // Starts `c`'s process (called without the lock; `c` is kStarting).
  void Spawn(Child& c);
  // With the lock held: whatever `c`'s descriptors have for us.
  void ReadStderr(Child& c);
  void ReadStartup(Child& c);
  void Reap(Child& c, Clock::time_point now);
  // With the lock held: SIGKILLs `c`'s process group (still unreaped, so
  // the group id cannot have been reused) and marks it failed; the
  // supervisor reaps and restarts it.
  void KillLocked(Child& c, const std::string& why);
  void NotifyReady();
  void Wake();
  int CountReadyLocked() const;
  // With the lock held: an idle ready process, marked busy, or null.
  Child* AcquireIdleLocked();
  // A batch's answer, or its failure.
  struct Answer {
    std::string id;
    std::uint32_t attempt = 0;
    HandlerOutput out;
    Timeout took{0};
  };
  // The exchanges with `c` (marked busy by the caller). Send queues a
  // batch frame behind those it holds; Flush writes what its stdin takes;
  // Advance flushes, reads, and appends an Answer per answered batch:
  // kAnswered once it holds none, kPending while it holds some, kBroken
  // when it broke the protocol or its stdout ended. Release makes it idle
  // again (kAnswered); Fail kills it for a restart (kBroken, kTimedOut) and
  // returns the failure of its running batch, moving the batches waiting
  // behind that one to the front of `rest`.
  enum class Step { kPending, kAnswered, kBroken, kTimedOut };
  void SetDeadline(Child& c, Timeout timeout);
  void Send(Child& c, Task task, Timeout timeout);
  bool Flush(Child& c, std::string* failure);
  // `loop`: on the worker's loop, where a `get` becomes an ObjectGetOut;
  // RunBatch's gets are refused (bad_request): it has no broker to ask.
  Step Advance(Child& c, Timeout timeout, std::vector<Answer>* answers, std::string* failure,
               bool loop = true);
  // A `get` from `c` (busy) for its oldest batch: answered at once when it
  // is bad, one too many or cannot be relayed; else queued for the worker.
  void OnGet(Child& c, std::uint64_t tag, std::string_view digest, std::uint64_t offset,
             std::uint64_t length, bool loop);
  void Release(Child& c);
  Answer Fail(Child& c, Step step, std::string failure, Timeout timeout,
              std::chrono::milliseconds exit_wait, std::deque<Task>* rest);
  // Why `c`'s stdout ended: its exit status if it exits within `wait`.
  std::string DescribeExit(Child& c, std::chrono::milliseconds wait);
  // On the loop: Release or Fail `c` as `step` says, then answers_ (and
  // the failure) become completions in `done`. DropSettled takes the
  // processes that hold no batch any more out of running_.
  void Settle(Child& c, Step step, std::string failure, const Limits& limits,
              std::vector<Completion>* done);
  void DropSettled();
  // Starts queued batches on idle processes, or behind the batches of busy
  // ones that take more than one at once (loop).
  void StartQueued(const Limits& limits, std::vector<Completion>* done);

  const Options options_;
  const std::string kind_;  // "handler" in log lines
  int wake_fd_ = -1;        // eventfd: wakes the supervisor
  int ready_fd_ = -1;       // eventfd: readiness changed, for the loop

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;  // an idle ready child, abort or close
  std::vector<std::unique_ptr<Child>> children_;  // guarded by mu_ (their state)
  bool closing_ = false;    // guarded by mu_
  bool aborted_ = false;    // guarded by mu_
  int starts_ = 0;          // guarded by mu_
  std::thread supervisor_;

  // The loop's: batches waiting for a process, and the processes running
  // one; since when none has been ready while batches wait.
  std::deque<Task> queue_;
  std::vector<Child*> running_;       // holding batches
  std::vector<Child*> touched_;       // scratch: sent to in this round
  std::vector<Answer> answers_;       // scratch: answers of one Advance
  std::optional<Clock::time_point> none_ready_since_;

  // Gets relayed and not answered yet, by our tag; those read and not yet
  // taken by the worker.
  struct PendingGet {
    Child* child = nullptr;
    std::uint64_t generation = 0;  // the child's process when it asked
    std::uint64_t handler_tag = 0;
    std::uint64_t offset = 0;      // asked for: echoed in a refusal
  };
  std::unordered_map<std::uint64_t, PendingGet> gets_;
  std::vector<ObjectGetOut> new_gets_;
  std::uint64_t next_get_tag_ = 1;
};

}  // namespace fleet::worker

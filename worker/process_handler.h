// The process handler (`--handler process --exec CMD`): one persistent
// handler process per slot, started once and kept running, spoken to over
// its stdin and stdout with the framed protocol of docs/handler-protocol.md.
//
// Owns the handler processes (each in its own process group, with
// SIGKILL as its parent-death signal), their pipes and a supervisor thread
// that starts them, reads their `ready`, logs their stderr line by line,
// reaps those that exit and restarts them with backoff. Slot threads call
// RunBatch concurrently: each takes a ready, idle process for the batch and
// owns its stdin and stdout until the answer is in. State is guarded by
// one mutex; the loop hears of readiness changes through an eventfd.
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
#include <thread>
#include <vector>

#include "worker/handler.h"

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
  // A batch's exchange with `c`, which the caller has marked busy.
  HandlerOutput Exchange(Child& c, const BatchInfo& batch, const std::string& payload,
                         Timeout timeout);
  std::string DescribeExit(Child& c);

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
};

}  // namespace fleet::worker

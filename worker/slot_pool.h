// Handler slots: `slots` threads that each run one batch at a time, fed by a
// FIFO task queue, handing their results back to the event loop through a
// list under a mutex and an eventfd the loop polls.
//
// Rejected: an inproc PUSH per slot to a PULL of the loop's (the first
// design). Each result then cost a six-frame zmq message, its allocations
// and a signal through libzmq's mailbox; here a result is one move into a
// vector, and only the first of a run of results wakes the loop.
//
// Owns the slot threads, both queues and the eventfd. Borrows the handler,
// which must outlive the pool. Submit and Take are meant for the loop's
// thread (they are thread-safe all the same).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "worker/handler.h"

namespace fleet::worker {

// One batch to run, copied once out of the DISPATCH frame.
struct Task {
  std::string id;
  std::string queue;
  std::uint32_t attempt = 1;
  std::string payload;
};

// One finished batch as the loop takes it.
class Completion {
 public:
  Completion(std::string id, std::uint32_t attempt, HandlerOutput out, double seconds)
      : id_(std::move(id)),
        attempt_(attempt),
        ok_(out.ok),
        result_(std::move(out.result)),
        error_(std::move(out.error)),
        seconds_(seconds) {}

  std::string_view id() const { return id_; }
  std::uint32_t attempt() const { return attempt_; }
  bool ok() const { return ok_; }
  std::string_view result() const { return result_; }
  std::string_view error() const { return error_; }
  // How long the handler ran.
  double seconds() const { return seconds_; }
  // Bytes this completion adds to an encoded DONE (roughly).
  std::size_t size() const { return id_.size() + result_.size() + error_.size() + 32; }

 private:
  std::string id_;
  std::uint32_t attempt_;
  bool ok_;
  std::string result_;
  std::string error_;
  double seconds_;
};

class SlotPool {
 public:
  // Starts `slots` threads (>= 1). `timeout` > 0 fails any batch that runs
  // longer. The threads block SIGINT and SIGTERM so the signals reach the
  // loop's thread and wake its poll. Throws std::system_error when the
  // eventfd or a thread cannot be made.
  SlotPool(Handler& handler, int slots, Timeout timeout, std::size_t max_result_bytes,
           std::size_t max_error_bytes);
  // Waits for the batches being run to finish; drops queued ones (callers
  // destroy the pool only when it holds nothing, or on a hard exit path).
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // Queues tasks; the first free slot takes each (FIFO). The vector form
  // takes the lock once for a whole DISPATCH.
  void Submit(Task task);
  void Submit(std::vector<Task>& tasks);

  // Readable while finished batches wait to be taken: poll it for POLLIN.
  int wake_fd() const { return wake_fd_; }
  // Appends every finished batch to `out`, oldest first, and clears the
  // fd's readiness. Returns how many it appended.
  std::size_t Take(std::deque<Completion>* out);

  int slots() const { return static_cast<int>(threads_.size()); }

 private:
  void SlotMain();
  void Finish(Completion c);

  Handler& handler_;
  const Timeout timeout_;
  const std::size_t max_result_bytes_;
  const std::size_t max_error_bytes_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::mutex done_mu_;
  std::vector<Completion> done_;  // guarded by done_mu_
  std::vector<std::thread> threads_;
};

}  // namespace fleet::worker

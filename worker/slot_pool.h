// Handler slots: `slots` threads that each run one batch at a time, fed by a
// FIFO task queue and reporting each result over their own inproc PUSH
// socket to a PULL socket the event loop owns.
//
// A result is two frames: a small header (attempt, outcome, run time, id,
// error) and the result itself, handed over without a copy. Rejected: one
// frame per field (six per result, the first design; each frame is a pipe
// write on both sides); and a list under a mutex with an eventfd (a little
// cheaper still, but the loop would share state with the slots, where the
// style is that a loop hears from its threads over sockets it owns).
//
// Owns the slot threads, the task queue and the slots' PUSH sockets (each
// created, used and closed on its own thread). Borrows the zmq context and
// the handler, which must outlive the pool. Submit is thread-safe; the rest
// is meant for the loop's thread.
#pragma once

#include <zmq.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
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

// One finished batch as the loop receives it. Owns the inproc frames; the
// views are taken from them on each call, so moving a Completion (which
// moves the frames, small ones stored inline) keeps them right.
class Completion {
 public:
  // Receives one completion without blocking. Returns nullopt when nothing
  // is waiting or the message is not one a slot sends (then it is dropped,
  // and *dropped, when given, is set to true).
  static std::optional<Completion> Receive(zmq::socket_t& pull, bool* dropped = nullptr);

  // Runs `task` with `handler` on the calling thread: the timeout check,
  // the result and error caps, and exceptions turned into a failed result.
  // A slot thread sends what this returns (Send); the loop keeps it as it
  // is when it runs an inline handler itself.
  static Completion Run(Handler& handler, Task task, Timeout timeout,
                        std::size_t max_result_bytes, std::size_t max_error_bytes);
  // The same checks and caps for an output the caller got itself, after
  // the handler ran `took`.
  static Completion FromOutput(std::string_view id, std::uint32_t attempt, HandlerOutput out,
                               Timeout took, Timeout timeout, std::size_t max_result_bytes,
                               std::size_t max_error_bytes);

  // Sends the completion's two frames on `push` (blocking) and leaves it
  // empty.
  void Send(zmq::socket_t& push);

  std::string_view id() const { return Header(kIdAt, id_size_); }
  std::uint32_t attempt() const { return attempt_; }
  bool ok() const { return ok_; }
  // Failed, and the broker is asked for another try (DONE outcome retry).
  bool retry() const { return retry_; }
  std::string_view result() const {
    return {static_cast<const char*>(result_.data()), result_.size()};
  }
  std::string_view error() const {
    return Header(kIdAt + id_size_, header_.size() - kIdAt - id_size_);
  }
  // How long the handler ran.
  double seconds() const { return seconds_; }
  // Bytes this completion adds to an encoded DONE (roughly).
  std::size_t size() const { return header_.size() + result_.size() + 16; }

  // Header layout, host order (inproc never leaves the process): attempt
  // (4 bytes), outcome (1: 0 failed, 1 ok, 2 retry), seconds (8, a
  // double), id size (4), id, error.
  static constexpr std::size_t kIdAt = 4 + 1 + 8 + 4;

 private:
  std::string_view Header(std::size_t at, std::size_t n) const {
    return {static_cast<const char*>(header_.data()) + at, n};
  }
  zmq::message_t header_;
  zmq::message_t result_;
  std::uint32_t attempt_ = 0;
  std::uint32_t id_size_ = 0;
  bool ok_ = false;
  bool retry_ = false;
  double seconds_ = 0;
};

class SlotPool {
 public:
  // Starts `slots` threads (>= 1), each with a PUSH socket connected to
  // `results_endpoint`, which the caller must already have bound on
  // `context` (inproc needs bind before connect). `timeout` > 0 fails any
  // batch that runs longer. The threads block SIGINT and SIGTERM so the
  // signals reach the loop's thread and wake its poll.
  SlotPool(zmq::context_t& context, const std::string& results_endpoint,
           Handler& handler, int slots, Timeout timeout,
           std::size_t max_result_bytes, std::size_t max_error_bytes);
  // Waits for the batches being run to finish; drops queued ones (callers
  // destroy the pool only when it holds nothing, or on a hard exit path).
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // Queues tasks; the first free slot takes each (FIFO). The vector form
  // takes the lock once for a whole DISPATCH and leaves `tasks` empty.
  void Submit(Task task);
  void Submit(std::vector<Task>& tasks);

  int slots() const { return static_cast<int>(threads_.size()); }

 private:
  void SlotMain(zmq::context_t& context, const std::string& endpoint);

  Handler& handler_;
  const Timeout timeout_;
  const std::size_t max_result_bytes_;
  const std::size_t max_error_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace fleet::worker

#include "worker/slot_pool.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <new>

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace fleet::worker {
namespace {

// ThreadSanitizer (scripts/sanitize.sh tsan) cannot see that libzmq, which is
// not instrumented, orders a slot's send before the loop's receive of that
// message: it would report the result a slot built and the loop reads (and
// frees, in FreeString) as a race. Each completion sent releases this sync
// object and each one received acquires it; no-ops in other builds. One object for every
// pool is coarser than the truth (a receive is ordered after every earlier
// send), but every completion does reach the loop this way. Rejected: a
// race:AdoptString suppression, which would also hide real races on results.
[[maybe_unused]] char g_inproc_handoff;
void HandoffRelease() {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(&g_inproc_handoff);
#endif
}
void HandoffAcquire() {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(&g_inproc_handoff);
#endif
}

// Inproc frames of one completion: id, attempt (4 bytes, host order: inproc
// never leaves the process), ok (1 byte), result, error.
constexpr std::size_t kFrames = 6;

void FreeString(void* /*data*/, void* hint) { delete static_cast<std::string*>(hint); }

// A frame that takes over `s` instead of copying it; results can be 16 MiB.
zmq::message_t AdoptString(std::string&& s) {
  if (s.empty()) return zmq::message_t();
  auto* owned = new std::string(std::move(s));
  return zmq::message_t(owned->data(), owned->size(), &FreeString, owned);
}

}  // namespace

std::optional<Completion> Completion::Receive(zmq::socket_t& pull) {
  Completion c;
  zmq::message_t frame;
  if (!pull.recv(frame, zmq::recv_flags::dontwait)) return std::nullopt;
  HandoffAcquire();
  bool more = frame.more();
  c.frames_.reserve(kFrames);
  c.frames_.push_back(std::move(frame));
  while (more) {
    zmq::message_t part;
    if (!pull.recv(part, zmq::recv_flags::none)) break;
    more = part.more();
    c.frames_.push_back(std::move(part));
  }
  if (c.frames_.size() != kFrames || c.frames_[1].size() != sizeof(c.attempt_) ||
      c.frames_[2].size() != 1 || c.frames_[5].size() != sizeof(double)) {
    spdlog::error("slot sent a malformed completion ({} frames); dropped",
                  c.frames_.size());
    return std::nullopt;
  }
  std::memcpy(&c.attempt_, c.frames_[1].data(), sizeof(c.attempt_));
  c.ok_ = *static_cast<const char*>(c.frames_[2].data()) != 0;
  std::memcpy(&c.seconds_, c.frames_[5].data(), sizeof(c.seconds_));
  return c;
}

std::size_t Completion::size() const {
  return id().size() + result().size() + error().size() + 32;
}

SlotPool::SlotPool(zmq::context_t& context, const std::string& results_endpoint,
                   Handler& handler, int slots, Timeout timeout,
                   std::size_t max_result_bytes, std::size_t max_error_bytes)
    : handler_(handler),
      timeout_(timeout),
      max_result_bytes_(max_result_bytes),
      max_error_bytes_(max_error_bytes) {
  // Threads inherit the creating thread's mask: block the stop signals for
  // the slots only, then restore ours.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  try {
    for (int i = 0; i < slots; ++i) {
      threads_.emplace_back([this, &context, results_endpoint] {
        SlotMain(context, results_endpoint);
      });
    }
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

SlotPool::~SlotPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void SlotPool::Submit(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void SlotPool::SlotMain(zmq::context_t& context, const std::string& endpoint) {
  zmq::socket_t push(context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  push.set(zmq::sockopt::sndhwm, 0);  // the loop drains; never drop or block on HWM
  push.connect(endpoint);

  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }

    const auto start = std::chrono::steady_clock::now();
    HandlerOutput out;
    try {
      out = handler_.Run(std::move(task.payload), timeout_);
    } catch (const std::bad_alloc&) {
      out = HandlerOutput::Failed("handler ran out of memory");
    } catch (const std::exception& e) {
      out = HandlerOutput::Failed(std::string("handler threw: ") + e.what());
    }
    const Timeout took = std::chrono::steady_clock::now() - start;
    if (out.ok && timeout_.count() > 0 && took > timeout_) {
      out = HandlerOutput::Failed(TimeoutError(timeout_));
    }
    if (out.ok && out.result.size() > max_result_bytes_) {
      out = HandlerOutput::Failed("result of " + std::to_string(out.result.size()) +
                                  " bytes exceeds the maximum of " +
                                  std::to_string(max_result_bytes_));
    }
    if (out.error.size() > max_error_bytes_) {
      out.error.resize(max_error_bytes_);
      out.error += "...";
    }
    spdlog::debug("batch {} attempt {} {} in {:.3f}s", task.id, task.attempt,
                  out.ok ? "ok" : "failed", took.count());

    const char ok = out.ok ? 1 : 0;
    // Blocking sends: inproc to a live PULL with no HWM never blocks for
    // long, and a completion must never be dropped.
    push.send(zmq::buffer(task.id), zmq::send_flags::sndmore);
    push.send(zmq::buffer(&task.attempt, sizeof(task.attempt)), zmq::send_flags::sndmore);
    push.send(zmq::buffer(&ok, 1), zmq::send_flags::sndmore);
    push.send(AdoptString(std::move(out.result)), zmq::send_flags::sndmore);
    push.send(zmq::buffer(out.error), zmq::send_flags::sndmore);
    const double seconds = took.count();
    // After AdoptString: the loop cannot receive any frame before the last
    // one is sent (multipart messages arrive whole).
    HandoffRelease();
    push.send(zmq::buffer(&seconds, sizeof(seconds)), zmq::send_flags::none);
  }
}

}  // namespace fleet::worker

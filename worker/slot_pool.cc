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

void FreeString(void* /*data*/, void* hint) { delete static_cast<std::string*>(hint); }

// A frame that takes over `s` instead of copying it; results can be 16 MiB.
zmq::message_t AdoptString(std::string&& s) {
  if (s.empty()) return zmq::message_t();
  auto* owned = new std::string(std::move(s));
  return zmq::message_t(owned->data(), owned->size(), &FreeString, owned);
}

}  // namespace

std::optional<Completion> Completion::Receive(zmq::socket_t& pull, bool* dropped) {
  Completion c;
  if (!pull.recv(c.header_, zmq::recv_flags::dontwait)) return std::nullopt;
  HandoffAcquire();
  std::size_t frames = 1;
  bool more = c.header_.more();
  if (more) {
    // The rest of a multipart message is already here.
    (void)pull.recv(c.result_, zmq::recv_flags::none);
    ++frames;
    more = c.result_.more();
  }
  while (more) {  // not ours; read it all so the next message starts clean
    zmq::message_t extra;
    (void)pull.recv(extra, zmq::recv_flags::none);
    ++frames;
    more = extra.more();
  }
  const auto* h = static_cast<const char*>(c.header_.data());
  if (frames == 2 && c.header_.size() >= kIdAt) {
    std::uint8_t ok = 0;
    std::memcpy(&c.attempt_, h, 4);
    std::memcpy(&ok, h + 4, 1);
    std::memcpy(&c.seconds_, h + 5, 8);
    std::memcpy(&c.id_size_, h + 13, 4);
    c.ok_ = ok == 1;
    c.retry_ = ok == 2;
    if (c.id_size_ <= c.header_.size() - kIdAt) return c;
  }
  spdlog::error("slot sent a malformed completion ({} frames); dropped", frames);
  if (dropped != nullptr) *dropped = true;
  return std::nullopt;
}

Completion Completion::Run(Handler& handler, Task task, Timeout timeout,
                           std::size_t max_result_bytes, std::size_t max_error_bytes) {
  const auto start = std::chrono::steady_clock::now();
  HandlerOutput out;
  try {
    out = handler.RunBatch(BatchInfo{task.id, task.queue, task.attempt},
                           std::move(task.payload), timeout);
  } catch (const std::bad_alloc&) {
    out = HandlerOutput::Failed("handler ran out of memory");
  } catch (const std::exception& e) {
    out = HandlerOutput::Failed(std::string("handler threw: ") + e.what());
  }
  const Timeout took = std::chrono::steady_clock::now() - start;
  return FromOutput(task.id, task.attempt, std::move(out), took, timeout, max_result_bytes,
                    max_error_bytes);
}

Completion Completion::FromOutput(std::string_view id, std::uint32_t attempt,
                                  HandlerOutput out, Timeout took, Timeout timeout,
                                  std::size_t max_result_bytes, std::size_t max_error_bytes) {
  if (out.ok && timeout.count() > 0 && took > timeout) {
    out = HandlerOutput::Failed(TimeoutError(timeout));
  }
  if (out.ok && out.result.size() > max_result_bytes) {
    out = HandlerOutput::Failed("result of " + std::to_string(out.result.size()) +
                                " bytes exceeds the maximum of " +
                                std::to_string(max_result_bytes));
  }
  if (out.error.size() > max_error_bytes) {
    out.error.resize(max_error_bytes);
    out.error += "...";
  }
  spdlog::debug("batch {} attempt {} {} in {:.3f}s", id, attempt,
                out.ok ? "ok" : (out.retry ? "given back for a retry" : "failed"),
                took.count());

  Completion c;
  c.attempt_ = attempt;
  c.ok_ = out.ok;
  c.retry_ = !out.ok && out.retry;
  c.seconds_ = took.count();
  c.id_size_ = static_cast<std::uint32_t>(id.size());
  const std::uint8_t ok = out.ok ? 1 : (c.retry_ ? 2 : 0);
  c.header_.rebuild(kIdAt + id.size() + out.error.size());
  auto* h = static_cast<char*>(c.header_.data());
  std::memcpy(h, &c.attempt_, 4);
  std::memcpy(h + 4, &ok, 1);
  std::memcpy(h + 5, &c.seconds_, 8);
  std::memcpy(h + 13, &c.id_size_, 4);
  std::memcpy(h + kIdAt, id.data(), id.size());
  std::memcpy(h + kIdAt + id.size(), out.error.data(), out.error.size());
  c.result_ = AdoptString(std::move(out.result));
  return c;
}

void Completion::Send(zmq::socket_t& push) {
  // Blocking sends: inproc to a live PULL with no HWM never blocks for
  // long, and a completion must never be dropped.
  push.send(header_, zmq::send_flags::sndmore);
  // After both frames are built (the adopted result's string too, which
  // the loop frees): the loop cannot receive any frame before the last
  // one is sent (multipart messages arrive whole).
  HandoffRelease();
  push.send(result_, zmq::send_flags::none);
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

void SlotPool::Submit(std::vector<Task>& tasks) {
  if (tasks.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Task& t : tasks) queue_.push_back(std::move(t));
  }
  // Wake as many slots as there are tasks (each takes one and comes back
  // for more while the queue holds any).
  if (tasks.size() >= threads_.size()) {
    cv_.notify_all();
  } else {
    for (std::size_t i = 0; i < tasks.size(); ++i) cv_.notify_one();
  }
  tasks.clear();
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

    Completion c = Completion::Run(handler_, std::move(task), timeout_, max_result_bytes_,
                                   max_error_bytes_);
    c.Send(push);
  }
}

}  // namespace fleet::worker

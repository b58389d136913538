#include "worker/slot_pool.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <system_error>

namespace fleet::worker {

SlotPool::SlotPool(Handler& handler, int slots, Timeout timeout,
                   std::size_t max_result_bytes, std::size_t max_error_bytes)
    : handler_(handler),
      timeout_(timeout),
      max_result_bytes_(max_result_bytes),
      max_error_bytes_(max_error_bytes) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  // Threads inherit the creating thread's mask: block the stop signals for
  // the slots only, then restore ours.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  try {
    for (int i = 0; i < slots; ++i) threads_.emplace_back([this] { SlotMain(); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    close(wake_fd_);
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
  close(wake_fd_);
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
  if (tasks.size() == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
  tasks.clear();
}

std::size_t SlotPool::Take(std::deque<Completion>* out) {
  // Reset the fd first, then take: a result added after the take sets it
  // again, so none is left without a wake-up.
  std::uint64_t n;
  if (read(wake_fd_, &n, sizeof n) < 0 && errno != EAGAIN && errno != EINTR) {
    spdlog::error("slot pool: reading its eventfd failed: {}", std::strerror(errno));
  }
  std::vector<Completion> taken;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    taken.swap(done_);
  }
  for (Completion& c : taken) out->push_back(std::move(c));
  return taken.size();
}

void SlotPool::Finish(Completion c) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    was_empty = done_.empty();
    done_.push_back(std::move(c));
  }
  // Only the first result of a run wakes the loop; it takes them all.
  if (was_empty) {
    const std::uint64_t one = 1;
    while (write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
}

void SlotPool::SlotMain() {
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
    Finish(Completion(std::move(task.id), task.attempt, std::move(out), took.count()));
  }
}

}  // namespace fleet::worker

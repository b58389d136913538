#include "autoscaler/docker_launcher.h"

#include <spdlog/spdlog.h>

#include <map>
#include <set>
#include <thread>

namespace fleet::autoscaler {

DockerLauncher::DockerLauncher(DockerOptions options)
    : DockerLauncher(std::make_unique<DockerEngine>(std::move(options))) {}

DockerLauncher::DockerLauncher(std::unique_ptr<ContainerEngine> engine)
    : engine_(std::move(engine)) {
  // From here on only the engine thread calls the engine.
  engine_thread_ = std::thread([this] { EngineLoop(); });
}

DockerLauncher::~DockerLauncher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // A hung engine must not hold the exit for a call timeout per queued
    // call: what is not done by then is left (see EngineLoop).
    stop_deadline_ = std::chrono::steady_clock::now() + 2 * engine_->options().api_timeout;
  }
  work_cv_.notify_all();
  if (engine_thread_.joinable()) engine_thread_.join();
}

void DockerLauncher::EngineLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !calls_.empty(); });
    if (calls_.empty()) return;
    if (stop_) {
      // Stopping finishes the creates and removals queued (a create the
      // engine was asked for is made, and adopted by the next run, rather
      // than half done), within a deadline; signals and lists no longer
      // matter to anyone.
      std::erase_if(calls_, [](const EngineCall& c) {
        return c.op == Op::kSignal || c.op == Op::kList;
      });
      if (!calls_.empty() && std::chrono::steady_clock::now() >= stop_deadline_) {
        spdlog::warn("{} launcher: the engine is not answering; leaving {} calls undone "
                     "({}s of this pool left behind are adopted or removed by the next run)",
                     engine_->kind(), calls_.size(), engine_->unit_word());
        calls_.clear();
      }
      if (calls_.empty()) return;
    }
    EngineCall call = std::move(calls_.front());
    calls_.pop_front();
    busy_ = true;
    lock.unlock();
    EngineResult result = Execute(call);
    lock.lock();
    busy_ = false;
    if (result.op == Op::kStart || result.op == Op::kList || result.op == Op::kReap) {
      results_.push_back(std::move(result));
    }
    idle_cv_.notify_all();
  }
}

DockerLauncher::EngineResult DockerLauncher::Execute(const EngineCall& call) {
  EngineResult r{call.op, call.id, call.container, {}, -1, std::nullopt};
  switch (call.op) {
    case Op::kStart:
      r.container = engine_->Create(call.id, call.arg, &r.error);
      break;
    case Op::kList:
      r.listed = engine_->List(&r.error);
      break;
    case Op::kReap:
      r.exit_code = engine_->ExitCode(call.container, &r.error);
      engine_->Remove(call.container, ContainerName(call.id));
      break;
    case Op::kSignal:
      engine_->Signal(call.id, call.container, call.arg.c_str(), call.grace);
      break;
    case Op::kRemove:
      engine_->Remove(call.container, call.arg);
      break;
  }
  return r;
}

void DockerLauncher::Queue(EngineCall call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(std::move(call));
  }
  work_cv_.notify_one();
}

bool DockerLauncher::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return calls_.empty() && !busy_; });
}

bool DockerLauncher::Start(const std::string& id, TimePoint, std::string* error) {
  if (workers_.count(id) != 0) {
    *error = "a worker " + id + " is already started";
    return false;
  }
  workers_[id];  // booked; its container comes with the start's result
  Queue({Op::kStart, id, {}, CreateBody(id)});
  return true;
}

void DockerLauncher::Stop(const std::string& id, Duration grace, TimePoint now) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.term_at || it->second.termed) return;
  it->second.grace = grace;
  it->second.term_at = now + grace;
}

void DockerLauncher::CancelStop(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.termed) return;  // too late: it was signalled
  it->second.term_at.reset();
}

void DockerLauncher::Apply(EngineResult result, std::vector<Exited>* exited) {
  switch (result.op) {
    case Op::kStart: {
      auto it = workers_.find(result.id);
      if (it == workers_.end()) {
        // StopAll gave up on it while its start was still with the engine:
        // a container made after that is not wanted.
        if (!result.container.empty()) {
          spdlog::info("worker {}: its {} came up after the launcher stopped "
                       "waiting for it; removing it",
                       result.id, engine_->unit_word());
          Queue({Op::kRemove, {}, result.container, ContainerName(result.id)});
        }
        return;
      }
      if (!result.error.empty()) {
        exited->push_back({result.id, -1, std::move(result.error)});
        workers_.erase(it);
      } else {
        it->second.container = std::move(result.container);
      }
      return;
    }
    case Op::kReap:
      if (!result.error.empty()) {
        spdlog::warn("worker {} never ran: {}", result.id, result.error);
      }
      exited->push_back({result.id, result.exit_code, std::move(result.error)});
      workers_.erase(result.id);
      return;
    case Op::kList:
      list_queued_ = false;
      if (!result.listed) {
        if (!list_failing_) {
          spdlog::error("{} launcher: cannot list the pool's {}s: {}", engine_->kind(),
                        engine_->unit_word(), result.error);
        }
        list_failing_ = true;
        return;  // try again next poll; nothing is decided blind
      }
      if (list_failing_) spdlog::info("{} launcher: the engine answers again", engine_->kind());
      list_failing_ = false;
      ApplyList(*result.listed, exited);
      return;
    case Op::kSignal:
    case Op::kRemove:
      return;
  }
}

void DockerLauncher::ApplyList(const std::vector<Listed>& listed, std::vector<Exited>* exited) {
  // Calls run first in, first out and their results are applied in that
  // order, so every container known here was created before this list was
  // taken: one it lacks is gone. A worker whose start is still running has
  // no container yet and is left alone.
  std::map<std::string, const Listed*> by_container;
  for (const Listed& l : listed) by_container[l.handle] = &l;
  std::set<std::string> tracked_containers;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const std::string& id = it->first;
    Worker& w = it->second;
    if (w.container.empty()) {
      ++it;
      continue;
    }
    tracked_containers.insert(w.container);
    if (w.reaping) {
      ++it;
      continue;
    }
    auto found = by_container.find(w.container);
    if (found == by_container.end()) {
      if (w.killed) {
        spdlog::info("worker {}'s {} is gone", id, engine_->unit_word());
      } else {
        spdlog::warn("worker {}'s {} disappeared (removed outside the autoscaler)", id,
                     engine_->unit_word());
      }
      exited->push_back({id, -1, {}});
      it = workers_.erase(it);
      continue;
    }
    const std::string& state = found->second->state;
    if (state == "exited" || state == "dead") {
      w.reaping = true;  // reported once its exit code is read and it is removed
      Queue({Op::kReap, id, w.container, {}});
    }
    ++it;
  }

  for (const Listed& l : listed) {
    if (tracked_containers.count(l.handle) != 0) continue;
    const bool live = l.state == "running" || l.state == "restarting" || l.state == "paused";
    if (live && !l.worker_id.empty() && workers_.count(l.worker_id) == 0) {
      workers_[l.worker_id].container = l.handle;
      adopted_.push_back(l.worker_id);
      spdlog::info("adopted running {} {} (worker {}) of pool {}", engine_->unit_word(),
                   ContainerName(l.worker_id), l.worker_id, engine_->options().pool);
    } else if (!live) {
      spdlog::info("removing {} {} {} of pool {} left by an earlier run", l.state,
                   engine_->unit_word(),
                   l.worker_id.empty() ? l.handle.substr(0, 12) : ContainerName(l.worker_id),
                   engine_->options().pool);
      Queue({Op::kRemove, {}, l.handle, l.handle.substr(0, 12)});
    }
    // A running container of the pool with no worker id (made by hand) is
    // left alone.
  }
}

std::vector<Exited> DockerLauncher::Poll(TimePoint now) {
  std::vector<Exited> exited;
  std::deque<EngineResult> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(results_);
  }
  for (EngineResult& r : done) Apply(std::move(r), &exited);

  for (auto& [id, w] : workers_) {
    if (w.container.empty() || w.reaping) continue;  // signalled once it exists
    if (w.term_at && now >= *w.term_at) {
      spdlog::info("worker {} still running {:.1f} s after its stop: SIGTERM", id,
                   std::chrono::duration<double>(w.grace).count());
      Queue({Op::kSignal, id, w.container, "SIGTERM", w.grace});
      w.termed = true;
      w.term_at.reset();
      w.kill_at = now + w.grace;
    } else if (w.kill_at && now >= *w.kill_at) {
      spdlog::warn("worker {} ignored SIGTERM for {:.1f} s: SIGKILL", id,
                   std::chrono::duration<double>(w.grace).count());
      Queue({Op::kSignal, id, w.container, "SIGKILL", w.grace});
      w.kill_at.reset();
      w.killed = true;
    }
  }

  if (!list_queued_) {
    list_queued_ = true;
    Queue({Op::kList, {}, {}, {}});
  }
  return exited;
}

std::vector<std::string> DockerLauncher::TakeAdopted() {
  std::vector<std::string> out;
  out.swap(adopted_);
  return out;
}

std::vector<std::string> DockerLauncher::Alive() const {
  std::vector<std::string> ids;
  ids.reserve(workers_.size());
  for (const auto& [id, w] : workers_) ids.push_back(id);
  return ids;
}

void DockerLauncher::StopAll(Duration grace) {
  const auto start = std::chrono::steady_clock::now();
  // Shutdown may wait: first for the starts in progress, so that their
  // containers exist and get the signal too.
  const auto bound = std::chrono::duration_cast<std::chrono::milliseconds>(grace) + Seconds(5);
  if (!WaitIdle(bound)) {
    spdlog::warn("{} launcher: the engine is slow; stopping anyway", engine_->kind());
  }
  for (const Exited& e : Poll(std::chrono::steady_clock::now())) {
    spdlog::info("worker {} exited (status {})", e.id, e.status);
  }
  if (workers_.empty()) return;
  // SIGTERM makes a worker drain: it finishes what it holds and exits 0.
  for (auto& [id, w] : workers_) {
    if (w.container.empty() || w.termed) continue;
    Queue({Op::kSignal, id, w.container, "SIGTERM", grace});
    w.termed = true;
    w.term_at.reset();
  }
  bool killed = false;
  while (!workers_.empty()) {
    const auto now = std::chrono::steady_clock::now();
    for (const Exited& e : Poll(now)) {
      spdlog::info("worker {} exited (status {})", e.id, e.status);
    }
    if (workers_.empty()) break;
    if (!killed && now - start >= grace) {
      for (auto& [id, w] : workers_) {
        if (w.container.empty()) continue;
        spdlog::warn("worker {} did not drain within {:.1f} s: SIGKILL", id,
                     std::chrono::duration<double>(grace).count());
        Queue({Op::kSignal, id, w.container, "SIGKILL", grace});
        w.kill_at.reset();
        w.killed = true;
      }
      killed = true;
    }
    if (now - start >= 2 * grace + Seconds(5)) {
      for (auto& [id, w] : workers_) {
        if (!w.container.empty()) Queue({Op::kRemove, {}, w.container, ContainerName(id)});
      }
      spdlog::error("gave up waiting for {} containers; removing them by force", workers_.size());
      workers_.clear();
      WaitIdle(engine_->options().api_timeout * 2);
      break;
    }
    // Shutdown only: the engine has no event we could wait on cheaply here.
    // The calls Poll queued are done before the next look.
    WaitIdle(std::chrono::milliseconds(2000));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  adopted_.clear();
}

}  // namespace fleet::autoscaler

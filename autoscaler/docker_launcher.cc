#include "autoscaler/docker_launcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

namespace fleet::autoscaler {

namespace {

std::vector<std::unique_ptr<ContainerEngine>> One(std::unique_ptr<ContainerEngine> engine) {
  std::vector<std::unique_ptr<ContainerEngine>> v;
  v.push_back(std::move(engine));
  return v;
}

}  // namespace

DockerLauncher::DockerLauncher(DockerOptions options)
    : DockerLauncher(std::make_unique<DockerEngine>(std::move(options))) {}

DockerLauncher::DockerLauncher(std::unique_ptr<ContainerEngine> engine)
    : DockerLauncher(One(std::move(engine))) {}

DockerLauncher::DockerLauncher(std::vector<std::unique_ptr<ContainerEngine>> engines) {
  if (engines.empty()) throw std::invalid_argument("docker launcher: no engine");
  std::string down;  // why the engines that do not answer do not
  for (auto& e : engines) {
    auto lane = std::make_unique<Lane>();
    lane->engine = std::move(e);
    try {
      lane->engine->Check();
      lane->checked = true;
    } catch (const std::runtime_error& err) {
      // One engine of several that does not answer now is skipped until it
      // does; anything else it says (no image, no network, an old API) is a
      // mistake to fix before starting.
      if (engines.size() == 1 || !lane->engine->unreachable()) throw;
      spdlog::warn("{} launcher: engine {} does not answer; skipping it until it does: {}",
                   lane->engine->kind(), lane->engine->address(), err.what());
      down += (down.empty() ? "" : "; ") + std::string(err.what());
      lane->failing = true;
    }
    lanes_.push_back(std::move(lane));
  }
  if (std::all_of(lanes_.begin(), lanes_.end(), [](const auto& l) { return !l->checked; })) {
    throw std::runtime_error("docker launcher: no engine answers: " + down);
  }
  if (lanes_.size() > 1) {
    std::string all;
    for (const auto& l : lanes_) all += (all.empty() ? "" : ", ") + l->engine->address();
    spdlog::info("{} launcher: {} engines ({}); a start goes to the answering one with the "
                 "fewest workers",
                 name(), lanes_.size(), all);
  }
  // From here on only each engine's thread calls that engine.
  for (auto& lane : lanes_) {
    Lane* l = lane.get();
    l->thread = std::thread([this, l] { EngineLoop(l); });
  }
}

DockerLauncher::~DockerLauncher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // A hung engine must not hold the exit for a call timeout per queued
    // call: what is not done by then is left (see EngineLoop).
    stop_deadline_ = std::chrono::steady_clock::now() + 2 * engine().options().api_timeout;
  }
  work_cv_.notify_all();
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
}

void DockerLauncher::EngineLoop(Lane* lane) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !lane->calls.empty(); });
    if (lane->calls.empty()) return;
    if (stop_) {
      // Stopping finishes the creates and removals queued (a create the
      // engine was asked for is made, and adopted by the next run, rather
      // than half done), within a deadline; signals and lists no longer
      // matter to anyone.
      std::erase_if(lane->calls, [](const EngineCall& c) {
        return c.op == Op::kSignal || c.op == Op::kList;
      });
      if (!lane->calls.empty() && std::chrono::steady_clock::now() >= stop_deadline_) {
        spdlog::warn("{} launcher: engine {} is not answering; leaving {} calls undone "
                     "({}s of this pool left behind are adopted or removed by the next run)",
                     lane->engine->kind(), lane->engine->address(), lane->calls.size(),
                     lane->engine->unit_word());
        lane->calls.clear();
      }
      if (lane->calls.empty()) return;
    }
    EngineCall call = std::move(lane->calls.front());
    lane->calls.pop_front();
    lane->busy = true;
    const bool checked = lane->checked;
    lock.unlock();
    EngineResult result{call.op, call.id, call.container, {}, -1, std::nullopt, false};
    bool now_checked = checked;
    if (!checked && call.op == Op::kList) {
      // An engine that did not answer at start-up is checked again before
      // it is used: only a list (each poll's) comes to one in that state.
      try {
        lane->engine->Check();
        now_checked = true;
        spdlog::info("{} launcher: engine {} answers", lane->engine->kind(),
                     lane->engine->address());
      } catch (const std::exception& e) {
        result = EngineResult{Op::kList, {}, {}, e.what(), -1, std::nullopt,
                              lane->engine->unreachable()};
      }
    }
    // (Other calls never come to an unchecked engine: it gets no starts,
    // and has no workers until a list of it answers.)
    if (now_checked || call.op != Op::kList) result = Execute(lane, call);
    lock.lock();
    lane->checked = now_checked;
    lane->busy = false;
    if (result.op == Op::kStart || result.op == Op::kList || result.op == Op::kReap) {
      lane->results.push_back(std::move(result));
    }
    idle_cv_.notify_all();
  }
}

DockerLauncher::EngineResult DockerLauncher::Execute(Lane* lane, const EngineCall& call) {
  ContainerEngine& e = *lane->engine;
  EngineResult r{call.op, call.id, call.container, {}, -1, std::nullopt, false};
  switch (call.op) {
    case Op::kStart:
      r.container = e.Create(call.id, call.arg, &r.error);
      r.unreachable = r.container.empty() && e.unreachable();
      break;
    case Op::kList:
      r.listed = e.List(&r.error);
      r.unreachable = !r.listed && e.unreachable();
      break;
    case Op::kReap:
      r.exit_code = e.ExitCode(call.container, &r.error);
      e.Remove(call.container, e.UnitName(call.id));
      break;
    case Op::kSignal:
      e.Signal(call.id, call.container, call.arg.c_str(), call.grace);
      break;
    case Op::kRemove:
      e.Remove(call.container, call.arg);
      break;
  }
  return r;
}

void DockerLauncher::Queue(std::size_t lane, EngineCall call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    lanes_[lane]->calls.push_back(std::move(call));
  }
  work_cv_.notify_all();
}

bool DockerLauncher::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [this] {
    return std::all_of(lanes_.begin(), lanes_.end(),
                       [](const auto& l) { return l->calls.empty() && !l->busy; });
  });
}

std::vector<std::size_t> DockerLauncher::WorkersPerEngine() const {
  std::vector<std::size_t> n(lanes_.size(), 0);
  for (const auto& [id, w] : workers_) ++n[w.lane];
  return n;
}

bool DockerLauncher::Start(const std::string& id, TimePoint now, std::string* error) {
  if (workers_.count(id) != 0) {
    *error = "a worker " + id + " is already started";
    return false;
  }
  // The answering engine with the fewest workers (the first on a tie),
  // leaving out one whose last creates failed until its backoff is over;
  // when every answering engine is in backoff, the fewest of those (the
  // autoscaler paces its own retries).
  std::vector<std::size_t> per = WorkersPerEngine();
  std::optional<std::size_t> best, best_in_backoff;
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    const Lane& l = *lanes_[i];
    if (l.failing) continue;
    std::optional<std::size_t>& pick = now < l.starts_resume_at ? best_in_backoff : best;
    if (!pick || per[i] < per[*pick]) pick = i;
  }
  if (!best) best = best_in_backoff;
  if (!best) {
    *error = lanes_.size() == 1
                 ? "the engine does not answer"
                 : fmt::format("none of the {} engines answers", lanes_.size());
    return false;
  }
  workers_[id].lane = *best;  // booked; its container comes with the start's result
  Queue(*best, {Op::kStart, id, {}, CreateBody(id)});
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

void DockerLauncher::Apply(std::size_t lane_index, EngineResult result, TimePoint now,
                           std::vector<Exited>* exited) {
  Lane& lane = *lanes_[lane_index];
  const ContainerEngine& e = *lane.engine;
  switch (result.op) {
    case Op::kStart: {
      auto it = workers_.find(result.id);
      if (it == workers_.end()) {
        // StopAll gave up on it while its start was still with the engine:
        // a container made after that is not wanted.
        if (!result.container.empty()) {
          spdlog::info("worker {}: its {} came up after the launcher stopped "
                       "waiting for it; removing it",
                       result.id, e.unit_word());
          Queue(lane_index, {Op::kRemove, {}, result.container, ContainerName(result.id)});
        }
        return;
      }
      if (!result.error.empty()) {
        if (result.unreachable && lanes_.size() > 1 && !lane.failing) {
          spdlog::warn("{} launcher: engine {} does not answer; skipping it until it does",
                       e.kind(), e.address());
          lane.failing = true;
        }
        // An engine that answers but refuses creates (its image gone, out of
        // space) would otherwise take every start, having the fewest
        // workers: other engines get the starts for a while, doubling from
        // 1 s to 60 s while its creates keep failing.
        lane.bad_starts = std::min(lane.bad_starts + 1, 7);
        lane.starts_resume_at = now + Seconds(std::min(60, 1 << (lane.bad_starts - 1)));
        if (lanes_.size() > 1) {
          spdlog::warn("{} launcher: a create on engine {} failed ({} in a row): other engines "
                       "get the starts for {} s",
                       e.kind(), e.address(), lane.bad_starts,
                       std::min(60, 1 << (lane.bad_starts - 1)));
        }
        exited->push_back({result.id, -1, std::move(result.error)});
        workers_.erase(it);
      } else {
        lane.bad_starts = 0;
        lane.starts_resume_at = TimePoint{};
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
      lane.list_queued = false;
      if (!result.listed) {
        // Once per outage, and again when the reason changes (an engine
        // that comes back but fails its check for another reason).
        if (!lane.failing || result.error != lane.last_error) {
          spdlog::error("{} launcher: cannot list the pool's {}s on {}: {}{}", e.kind(),
                        e.unit_word(), e.address(), result.error,
                        lanes_.size() > 1 ? " (skipping it until it answers)" : "");
        }
        lane.failing = true;
        lane.last_error = std::move(result.error);
        return;  // try again next poll; nothing is decided blind
      }
      if (lane.failing) spdlog::info("{} launcher: engine {} answers again", e.kind(), e.address());
      lane.failing = false;
      lane.last_error.clear();
      ApplyList(lane_index, *result.listed, exited);
      return;
    case Op::kSignal:
    case Op::kRemove:
      return;
  }
}

void DockerLauncher::ApplyList(std::size_t lane, const std::vector<Listed>& listed,
                               std::vector<Exited>* exited) {
  const ContainerEngine& e = *lanes_[lane]->engine;
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
    if (w.lane != lane || w.container.empty()) {
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
      if (w.killed || w.termed) {
        spdlog::info("worker {}'s {} is gone", id, e.unit_word());
      } else {
        spdlog::warn("worker {}'s {} disappeared (removed outside the autoscaler)", id,
                     e.unit_word());
      }
      exited->push_back({id, -1, {}});
      it = workers_.erase(it);
      continue;
    }
    const std::string& state = found->second->state;
    if (found->second->note != w.note) {
      // Why it is not running yet (once per change): unschedulable, an
      // image it cannot pull, ...
      w.note = found->second->note;
      if (!w.note.empty()) spdlog::warn("worker {} is not running yet: {}", id, w.note);
    }
    if (state == "exited" || state == "dead") {
      w.reaping = true;  // reported once its exit code is read and it is removed
      Queue(lane, {Op::kReap, id, w.container, {}});
    }
    ++it;
  }

  for (const Listed& l : listed) {
    if (tracked_containers.count(l.handle) != 0) continue;
    const bool live = l.state == "running" || l.state == "restarting" || l.state == "paused";
    if (live && !l.worker_id.empty() && workers_.count(l.worker_id) == 0) {
      Worker& w = workers_[l.worker_id];
      w.lane = lane;
      w.container = l.handle;
      adopted_.push_back(l.worker_id);
      spdlog::info("adopted running {} {} (worker {}) of pool {}{}{}", e.unit_word(),
                   ContainerName(l.worker_id), l.worker_id, e.options().pool,
                   lanes_.size() > 1 ? " on " : "", lanes_.size() > 1 ? e.address() : "");
    } else if (!live) {
      spdlog::info("removing {} {} {} of pool {} left by an earlier run", l.state,
                   e.unit_word(),
                   l.worker_id.empty() ? l.handle.substr(0, 12) : ContainerName(l.worker_id),
                   e.options().pool);
      Queue(lane, {Op::kRemove, {}, l.handle, l.handle.substr(0, 12)});
    }
    // A running container of the pool with no worker id (made by hand) is
    // left alone.
  }
}

std::vector<Exited> DockerLauncher::Poll(TimePoint now) {
  std::vector<Exited> exited;
  std::vector<std::deque<EngineResult>> done(lanes_.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < lanes_.size(); ++i) done[i].swap(lanes_[i]->results);
  }
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    for (EngineResult& r : done[i]) Apply(i, std::move(r), now, &exited);
  }

  for (auto it = workers_.begin(); it != workers_.end();) {
    const std::string& id = it->first;
    Worker& w = it->second;
    const bool down = lanes_[w.lane]->failing;
    if (w.container.empty() || w.reaping) {  // signalled once it exists
      ++it;
      continue;
    }
    if (w.term_at && now >= *w.term_at) {
      spdlog::info("worker {} still running {:.1f} s after its stop: SIGTERM", id,
                   std::chrono::duration<double>(w.grace).count());
      Queue(w.lane, {Op::kSignal, id, w.container, "SIGTERM", w.grace});
      w.termed = true;
      w.term_at.reset();
      w.kill_at = now + w.grace;
    } else if (w.kill_at && now >= *w.kill_at) {
      if (!w.killed) {
        spdlog::warn("worker {} ignored SIGTERM for {:.1f} s: SIGKILL", id,
                     std::chrono::duration<double>(w.grace).count());
      } else {
        spdlog::warn("worker {}'s {} is still there: SIGKILL again", id,
                     lanes_[w.lane]->engine->unit_word());
      }
      Queue(w.lane, {Op::kSignal, id, w.container, "SIGKILL", w.grace});
      w.killed = true;
      // Again if it is still listed then: a kill the engine did not carry
      // out (a timeout, a refusal) must not leave it running for good.
      w.kill_at = now + std::max<Duration>(w.grace, Seconds(5));
    } else if (w.killed && down && lanes_.size() > 1) {
      // Its engine does not answer: nothing can make sure it is gone, and
      // waiting would hold its place in the pool. Counted gone; if the
      // engine comes back with it running, the next list adopts it.
      spdlog::warn("worker {}: its engine {} does not answer; counting it gone", id,
                   lanes_[w.lane]->engine->address());
      exited.push_back({id, -1, {}});
      it = workers_.erase(it);
      continue;
    }
    ++it;
  }

  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    if (!lanes_[i]->list_queued) {
      lanes_[i]->list_queued = true;
      Queue(i, {Op::kList, {}, {}, {}});
    }
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
    spdlog::warn("{} launcher: the engine is slow; stopping anyway", name());
  }
  for (const Exited& e : Poll(std::chrono::steady_clock::now())) {
    spdlog::info("worker {} exited (status {})", e.id, e.status);
  }
  if (workers_.empty()) return;
  // SIGTERM makes a worker drain: it finishes what it holds and exits 0.
  for (auto& [id, w] : workers_) {
    if (w.container.empty() || w.termed) continue;
    Queue(w.lane, {Op::kSignal, id, w.container, "SIGTERM", grace});
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
        Queue(w.lane, {Op::kSignal, id, w.container, "SIGKILL", grace});
        w.kill_at.reset();
        w.killed = true;
      }
      killed = true;
    }
    if (now - start >= 2 * grace + Seconds(5)) {
      for (auto& [id, w] : workers_) {
        if (!w.container.empty()) Queue(w.lane, {Op::kRemove, {}, w.container, ContainerName(id)});
      }
      spdlog::error("gave up waiting for {} containers; removing them by force", workers_.size());
      workers_.clear();
      WaitIdle(engine().options().api_timeout * 2);
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

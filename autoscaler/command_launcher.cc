#include "autoscaler/command_launcher.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include <cerrno>
#include <thread>

#include "autoscaler/process_launcher.h"

namespace fleet::autoscaler {

CommandLauncher::CommandLauncher(std::string start_template, std::string stop_template)
    : start_template_(std::move(start_template)), stop_template_(std::move(stop_template)) {}

CommandLauncher::~CommandLauncher() {
  for (auto& [id, w] : workers_) {
    if (w.start_pid > 0) {
      kill(w.start_pid, SIGKILL);
      waitpid(w.start_pid, nullptr, 0);
    }
  }
  for (pid_t p : helpers_) waitpid(p, nullptr, 0);
}

std::string CommandLauncher::Expand(const std::string& tmpl, const std::string& id) {
  std::string out;
  std::string quoted = ShellQuote(id);
  for (std::size_t i = 0; i < tmpl.size();) {
    if (tmpl.compare(i, 4, "{id}") == 0) {
      out += quoted;
      i += 4;
    } else {
      out += tmpl[i++];
    }
  }
  return out;
}

bool CommandLauncher::Start(const std::string& id, TimePoint, std::string* error) {
  if (workers_.count(id) != 0) {
    *error = "a worker " + id + " is already started";
    return false;
  }
  pid_t pid = SpawnShell(Expand(start_template_, id), error);
  if (pid < 0) return false;
  workers_[id].start_pid = pid;
  return true;
}

void CommandLauncher::RunStopCommand(const std::string& id) {
  if (stop_template_.empty()) return;
  std::string error;
  pid_t pid = SpawnShell(Expand(stop_template_, id), &error);
  if (pid < 0) {
    spdlog::error("stop command for worker {} could not run: {}", id, error);
    return;
  }
  helpers_.push_back(pid);
}

void CommandLauncher::ReapHelpers() {
  for (auto it = helpers_.begin(); it != helpers_.end();) {
    int st = 0;
    pid_t r = waitpid(*it, &st, WNOHANG);
    if (r == *it || (r < 0 && errno == ECHILD)) {
      if (r == *it && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        spdlog::warn("a stop command failed (status {})",
                     WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
      }
      it = helpers_.erase(it);
    } else {
      ++it;
    }
  }
}

void CommandLauncher::Stop(const std::string& id, Duration grace, TimePoint now) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.stop_at) return;
  it->second.grace = grace;
  it->second.stop_at = now + grace;
}

void CommandLauncher::CancelStop(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.stop_ran) return;  // too late
  it->second.stop_at.reset();
}

std::vector<Exited> CommandLauncher::Poll(TimePoint now) {
  ReapHelpers();
  std::vector<Exited> exited;
  for (auto it = workers_.begin(); it != workers_.end();) {
    Worker& w = it->second;
    if (w.start_pid > 0) {
      int st = 0;
      pid_t r = waitpid(w.start_pid, &st, WNOHANG);
      if (r == w.start_pid || (r < 0 && errno == ECHILD)) {
        int status = r == w.start_pid ? (WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)) : 0;
        w.start_pid = -1;
        if (status != 0 || w.stop_ran) {
          // A failed start, or a foreground worker that ended.
          exited.push_back({it->first, status, {}});
          it = workers_.erase(it);
          continue;
        }
        w.detached = true;  // handed to the orchestrator
      }
    }
    if (w.stop_at && !w.stop_ran && now >= *w.stop_at) {
      RunStopCommand(it->first);
      w.stop_ran = true;
      w.kill_at = now + w.grace;
      if (w.detached) {
        // Nothing of ours to watch any more: the stop command is the end.
        exited.push_back({it->first, 0, {}});
        it = workers_.erase(it);
        continue;
      }
    } else if (w.kill_at && w.start_pid > 0 && now >= *w.kill_at) {
      spdlog::warn("worker {}: start command still running after the stop command: SIGKILL",
                   it->first);
      kill(w.start_pid, SIGKILL);
      w.kill_at.reset();
    }
    ++it;
  }
  return exited;
}

std::vector<std::string> CommandLauncher::Alive() const {
  std::vector<std::string> ids;
  for (const auto& [id, w] : workers_) ids.push_back(id);
  return ids;
}

void CommandLauncher::StopAll(Duration grace) {
  for (auto& [id, w] : workers_) {
    if (!w.stop_ran) {
      RunStopCommand(id);
      w.stop_ran = true;
    }
    if (w.start_pid > 0) kill(w.start_pid, SIGTERM);
  }
  auto deadline = std::chrono::steady_clock::now() + grace;
  bool killed = false;
  while (true) {
    ReapHelpers();
    bool running = !helpers_.empty();
    for (auto& [id, w] : workers_) {
      if (w.start_pid <= 0) continue;
      pid_t r = waitpid(w.start_pid, nullptr, WNOHANG);
      if (r == w.start_pid || (r < 0 && errno == ECHILD)) {
        w.start_pid = -1;
      } else {
        running = true;
      }
    }
    if (!running) break;
    if (!killed && std::chrono::steady_clock::now() >= deadline) {
      for (auto& [id, w] : workers_) {
        if (w.start_pid > 0) kill(w.start_pid, SIGKILL);
      }
      for (pid_t p : helpers_) kill(p, SIGKILL);
      killed = true;
    }
    // Shutdown only: children have no descriptor to poll.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  workers_.clear();
}

}  // namespace fleet::autoscaler

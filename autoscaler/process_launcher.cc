#include "autoscaler/process_launcher.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

extern char** environ;

namespace fleet::autoscaler {

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string DefaultWorkerBin() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto beside = self.parent_path() / "fleet-worker";
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return "fleet-worker";
}

std::vector<std::string> ChildEnvironment(const char* const* env) {
  std::vector<std::string> out;
  if (env == nullptr) return out;
  for (const char* const* e = env; *e != nullptr; ++e) {
    if (std::strncmp(*e, kStrippedPrefix, std::strlen(kStrippedPrefix)) == 0) continue;
    out.emplace_back(*e);
  }
  return out;
}

pid_t SpawnShell(const std::string& command, std::string* error) {
  // Built before the fork: the autoscaler has threads, so the child must not
  // allocate between fork and exec.
  const std::vector<std::string> env = ChildEnvironment(environ);
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork failed: ") + std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    // Signals blocked or ignored by the autoscaler must not be inherited.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    _exit(127);
  }
  return pid;
}

ProcessLauncher::ProcessLauncher(std::string worker_bin, std::string worker_args)
    : worker_bin_(std::move(worker_bin)), worker_args_(std::move(worker_args)) {}

ProcessLauncher::~ProcessLauncher() {
  // Nothing may outlive us: StopAll should have run; this is the backstop.
  for (auto& [id, c] : children_) {
    kill(c.pid, SIGKILL);
    int st = 0;
    waitpid(c.pid, &st, 0);
  }
}

std::string ProcessLauncher::CommandFor(const std::string& id) const {
  std::string cmd = "exec " + ShellQuote(worker_bin_) + " --id " + ShellQuote(id);
  if (!worker_args_.empty()) cmd += " " + worker_args_;
  return cmd;
}

bool ProcessLauncher::Start(const std::string& id, TimePoint, std::string* error) {
  if (children_.count(id) != 0) {
    *error = "a worker " + id + " is already running";
    return false;
  }
  std::string cmd = CommandFor(id);
  pid_t pid = SpawnShell(cmd, error);
  if (pid < 0) return false;
  children_[id] = Child{pid, std::nullopt, std::nullopt, Duration{}, false};
  spdlog::debug("launched worker {} as pid {}: {}", id, pid, cmd);
  return true;
}

void ProcessLauncher::Stop(const std::string& id, Duration grace, TimePoint now) {
  auto it = children_.find(id);
  if (it == children_.end() || it->second.term_at) return;
  it->second.grace = grace;
  it->second.term_at = now + grace;
}

void ProcessLauncher::CancelStop(const std::string& id) {
  auto it = children_.find(id);
  if (it == children_.end() || it->second.termed) return;  // too late: it was signalled
  it->second.term_at.reset();
}

std::vector<Exited> ProcessLauncher::Poll(TimePoint now) {
  std::vector<Exited> exited;
  for (auto it = children_.begin(); it != children_.end();) {
    Child& c = it->second;
    int st = 0;
    pid_t r = waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid || (r < 0 && errno == ECHILD)) {
      int status = r == c.pid ? (WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)) : -1;
      exited.push_back({it->first, status, {}});
      it = children_.erase(it);
      continue;
    }
    if (c.term_at && !c.termed && now >= *c.term_at) {
      spdlog::warn("worker {} (pid {}) still running {:.1f} s after it was told to go: SIGTERM",
                   it->first, c.pid, std::chrono::duration<double>(c.grace).count());
      kill(c.pid, SIGTERM);
      c.termed = true;
      c.kill_at = now + c.grace;
    } else if (c.kill_at && now >= *c.kill_at) {
      spdlog::warn("worker {} (pid {}) ignored SIGTERM for {:.1f} s: SIGKILL", it->first, c.pid,
                   std::chrono::duration<double>(c.grace).count());
      kill(c.pid, SIGKILL);
      c.kill_at.reset();
    }
    ++it;
  }
  return exited;
}

std::vector<std::string> ProcessLauncher::Alive() const {
  std::vector<std::string> ids;
  for (const auto& [id, c] : children_) ids.push_back(id);
  return ids;
}

void ProcessLauncher::StopAll(Duration grace) {
  // SIGTERM makes a worker drain: it finishes what it holds and exits 0.
  for (auto& [id, c] : children_) {
    kill(c.pid, SIGTERM);
    c.termed = true;
  }
  auto deadline = std::chrono::steady_clock::now() + grace;
  bool killed = false;
  while (!children_.empty()) {
    Poll(std::chrono::steady_clock::now());
    if (children_.empty()) break;
    if (!killed && std::chrono::steady_clock::now() >= deadline) {
      for (auto& [id, c] : children_) {
        spdlog::warn("worker {} (pid {}) did not drain within {:.1f} s: SIGKILL", id, c.pid,
                     std::chrono::duration<double>(grace).count());
        kill(c.pid, SIGKILL);
      }
      killed = true;
    }
    // Reaping children has no file descriptor to poll; a short wait here
    // only runs at shutdown.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace fleet::autoscaler

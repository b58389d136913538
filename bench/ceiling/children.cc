#include "bench/ceiling/children.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench/bench_util.h"

namespace fleet::bench::ceiling {
namespace {

volatile sig_atomic_t g_stop = 0;
int g_stop_pipe[2] = {-1, -1};  // [0] is readable once a stop signal came

void OnStopSignal(int) {
  g_stop = 1;
  const int saved = errno;
  if (write(g_stop_pipe[1], "x", 1) < 0) {
    // Full: already readable.
  }
  errno = saved;
}

}  // namespace

// No SA_RESTART: a blocked syscall returns EINTR and its loop looks.
void InstallStopHandlers() {
  if (pipe2(g_stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0) throw std::runtime_error("pipe2 failed");
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool StopRequested() { return g_stop != 0; }

int StopFd() { return g_stop_pipe[0]; }

void Log(const std::string& what) {
  std::fprintf(stderr, "fleet-bench-ceiling: %s\n", what.c_str());
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

bool WaitReadable(int fd, std::int64_t deadline_ns, const std::function<void()>& check) {
  for (;;) {
    if (g_stop) throw Interrupted();
    check();
    pollfd p[2] = {{fd, POLLIN, 0}, {g_stop_pipe[0], POLLIN, 0}};
    const int rc = poll(p, 2, 100);
    if (g_stop) throw Interrupted();
    if (rc > 0 && p[0].revents != 0) return true;
    if (rc < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + strerror(errno));
    if (deadline_ns && NowNs() > deadline_ns) return false;
  }
}

void Children::Spawn(const std::string& name, const std::vector<std::string>& args,
                     int report_fd) {
  // Everything exec needs is built before fork.
  std::vector<std::string> all = {"fleet-bench-ceiling"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = StartChild();
  if (pid == 0) {
    if (report_fd == 3) fcntl(3, F_SETFD, 0);  // dup2 onto itself would keep CLOEXEC
    if (report_fd >= 0 && report_fd != 3 && dup2(report_fd, 3) < 0) _exit(127);
    dup2(2, 1);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  procs_.push_back({pid, name, true});
}

void Children::Fork(const std::string& name, const std::function<int()>& body) {
  const pid_t pid = StartChild();
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    int rc = 1;
    try {
      rc = body();
    } catch (const std::exception& e) {
      Log(name + ": " + e.what());
    }
    std::fflush(stderr);
    _exit(rc);
  }
  procs_.push_back({pid, name, false});
}

void Children::CheckServices() {
  for (auto& p : procs_) {
    if (!p.service || p.pid < 0) continue;
    int status = 0;
    if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
      p.pid = -1;
      throw std::runtime_error(p.name + " exited (status " + std::to_string(status) + ")");
    }
  }
}

void Children::StopAll() {
  for (auto& p : procs_) {
    if (p.pid > 0) kill(p.pid, SIGTERM);
  }
  const std::int64_t deadline = NowNs() + 2'000'000'000;
  for (;;) {
    bool left = false;
    for (auto& p : procs_) {
      if (p.pid > 0 && waitpid(p.pid, nullptr, WNOHANG) == p.pid) p.pid = -1;
      left = left || p.pid > 0;
    }
    if (!left || NowNs() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& p : procs_) {
    if (p.pid <= 0) continue;
    Log(p.name + " ignored SIGTERM for 2 s: killed");
    kill(p.pid, SIGKILL);
    waitpid(p.pid, nullptr, 0);
    p.pid = -1;
  }
  procs_.clear();
}

pid_t Children::StartChild() {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the driver died before prctl
  }
  return pid;
}

std::string ReportReader::Line(Children& kids, double timeout_s) {
  const std::int64_t deadline = NowNs() + static_cast<std::int64_t>(timeout_s * 1e9);
  for (;;) {
    const auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (!WaitReadable(fd_, deadline, [&] { kids.CheckServices(); })) {
      throw std::runtime_error("broker did not report in time");
    }
    char chunk[256];
    const ssize_t n = read(fd_, chunk, sizeof chunk);
    if (n == 0) throw std::runtime_error("broker closed its report pipe");
    if (n > 0) buf_.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace fleet::bench::ceiling

#include "worker/exec_handler.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/fmt/fmt.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>

extern char** environ;

namespace fleet::worker {
namespace {

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Close(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A pipe whose ends are close-on-exec, so a child started by another slot at
// the same moment never inherits them (an inherited write end would keep our
// reader from ever seeing EOF).
bool MakeFdPipe(Fd* read_end, Fd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  *read_end = Fd(fds[0]);
  *write_end = Fd(fds[1]);
  return true;
}

void SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Keeps only the last `cap` bytes of everything appended.
void AppendTail(std::string* tail, const char* data, std::size_t n,
                std::size_t cap) {
  tail->append(data, n);
  // Trim lazily (at twice the cap) so a chatty child costs amortised O(n).
  if (tail->size() > 2 * cap) tail->erase(0, tail->size() - cap);
}

std::string TailOf(const std::string& s, std::size_t cap) {
  return s.size() <= cap ? s : s.substr(s.size() - cap);
}

std::string ExitDescription(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("wait status {}", status);
}

}  // namespace

ExecHandler::ExecHandler(Options options) : options_(std::move(options)) {
  if (options_.command.empty()) {
    throw std::invalid_argument("exec handler needs a command");
  }
}

// posix_spawn rather than fork+exec: the worker is multithreaded, and between
// fork and exec only async-signal-safe calls are allowed; posix_spawn does
// the process-group, signal-mask and dup2 set-up for us correctly.
HandlerOutput ExecHandler::Run(std::string payload, Timeout timeout) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::optional<Clock::time_point> deadline;
  if (timeout.count() > 0) {
    deadline = start + std::chrono::duration_cast<Clock::duration>(timeout);
  }

  Fd in_r, in_w, out_r, out_w, err_r, err_w;
  if (!MakeFdPipe(&in_r, &in_w) || !MakeFdPipe(&out_r, &out_w) ||
      !MakeFdPipe(&err_r, &err_w)) {
    return HandlerOutput::Failed(
        fmt::format("exec: pipe failed: {}", std::strerror(errno)));
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_r.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out_w.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_w.get(), 2);

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Own process group (so a timeout kills the whole pipeline), an empty
  // signal mask (slot threads block SIGINT/SIGTERM) and default SIGPIPE
  // (the worker ignores it, and SIG_IGN survives exec).
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);

  std::string arg0 = options_.shell, arg1 = "-c", arg2 = options_.command;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = -1;
  int rc;
  {
    // Registered under the lock so Abort never misses a child just started.
    std::lock_guard<std::mutex> lock(mu_);
    rc = posix_spawn(&pid, options_.shell.c_str(), &actions, &attr, argv, environ);
    if (rc == 0) live_.insert(pid);
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return HandlerOutput::Failed(fmt::format("exec: cannot start {}: {}",
                                             options_.shell, std::strerror(rc)));
  }
  in_r.Close();
  out_w.Close();
  err_w.Close();
  SetNonBlocking(in_w.get());
  SetNonBlocking(out_r.get());
  SetNonBlocking(err_r.get());

  std::string out, err_tail;
  std::size_t written = 0;
  if (payload.empty()) in_w.Close();
  bool timed_out = false, overflow = false;
  char buf[64 * 1024];

  while (out_r.open() || err_r.open()) {
    pollfd fds[3];
    nfds_t n = 0;
    int in_i = -1, out_i = -1, err_i = -1;
    if (in_w.open()) { in_i = static_cast<int>(n); fds[n++] = {in_w.get(), POLLOUT, 0}; }
    if (out_r.open()) { out_i = static_cast<int>(n); fds[n++] = {out_r.get(), POLLIN, 0}; }
    if (err_r.open()) { err_i = static_cast<int>(n); fds[n++] = {err_r.get(), POLLIN, 0}; }
    int wait_ms = -1;
    if (deadline) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<long long>(left.count(), 60'000));
    }
    int ready = ::poll(fds, n, wait_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;  // cannot happen with valid fds; the child is killed below
    }
    if (ready == 0) continue;  // the deadline check at the top decides

    if (in_i >= 0 && fds[in_i].revents) {
      if (fds[in_i].revents & (POLLERR | POLLHUP)) {
        in_w.Close();  // the child closed stdin: it does not want the rest
      } else {
        std::size_t chunk = std::min(payload.size() - written, sizeof(buf));
        ssize_t w = ::write(in_w.get(), payload.data() + written, chunk);
        if (w > 0) written += static_cast<std::size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == payload.size()) {
          in_w.Close();  // EPIPE: same as above
        }
      }
    }
    if (out_i >= 0 && fds[out_i].revents) {
      ssize_t r = ::read(out_r.get(), buf, sizeof(buf));
      if (r > 0) {
        out.append(buf, static_cast<std::size_t>(r));
        if (out.size() > options_.max_output_bytes) {
          overflow = true;
          break;
        }
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        out_r.Close();
      }
    }
    if (err_i >= 0 && fds[err_i].revents) {
      ssize_t r = ::read(err_r.get(), buf, sizeof(buf));
      if (r > 0) {
        AppendTail(&err_tail, buf, static_cast<std::size_t>(r), options_.stderr_tail_bytes);
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        err_r.Close();
      }
    }
  }
  in_w.Close();
  out_r.Close();
  err_r.Close();

  {
    std::lock_guard<std::mutex> lock(mu_);
    // Killed before it is reaped, so the pid (and group id) cannot have been
    // reused by then.
    if (timed_out || overflow) ::kill(-pid, SIGKILL);
    live_.erase(pid);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }

  if (timed_out) return HandlerOutput::Failed(TimeoutError(timeout));
  if (overflow) {
    return HandlerOutput::Failed(fmt::format(
        "exec: stdout exceeded the maximum result size of {} bytes",
        options_.max_output_bytes));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return HandlerOutput::Ok(std::move(out));
  }
  std::string error = "exec: " + ExitDescription(status);
  std::string tail = TailOf(err_tail, options_.stderr_tail_bytes);
  if (!tail.empty()) error += "; stderr: " + tail;
  return HandlerOutput::Failed(std::move(error));
}

void ExecHandler::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  for (pid_t pid : live_) ::kill(-pid, SIGKILL);
}

}  // namespace fleet::worker

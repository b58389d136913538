#include "worker/process_handler.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "common/protocol.h"
#include "worker/handler_frames.h"

extern char** environ;

namespace fleet::worker {
namespace {

constexpr std::size_t kStderrLineMax = 4096;
constexpr std::size_t kStderrTailLines = 5;
constexpr std::size_t kReadChunk = 64 << 10;
// How long the worker's loop waits, after a busy handler's stdout ended,
// for its exit status (for the batch's error text). A process that closed
// its stdout by exiting is a zombie within microseconds.
constexpr std::chrono::milliseconds kLoopExitWait{20};
// A handler not ready this long after its start is logged (once).
constexpr std::chrono::seconds kSlowStartAfter{30};

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

// A close-on-exec pipe whose ends are both above 2, so the dup2 onto 0, 1
// and 2 in the child never clobbers another end.
bool MakePipe(int* read_end, int* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  for (int& fd : fds) {
    if (fd <= 2) {
      const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      ::close(fd);
      fd = moved;
    }
  }
  if (fds[0] < 0 || fds[1] < 0) {
    CloseFd(&fds[0]);
    CloseFd(&fds[1]);
    return false;
  }
  *read_end = fds[0];
  *write_end = fds[1];
  return true;
}

void SetNonBlockingFd(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void Signal(int eventfd) {
  const std::uint64_t one = 1;
  while (::write(eventfd, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

void Drain(int eventfd) {
  std::uint64_t n = 0;
  while (::read(eventfd, &n, sizeof(n)) < 0 && errno == EINTR) {
  }
}

std::string StatusText(int code, int status) {
  if (code == CLD_EXITED) return "exit status " + std::to_string(status);
  return "killed by signal " + std::to_string(status) + " (" + ::strsignal(status) + ")";
}

// The words of `command` when it needs no shell: plain words separated by
// blanks, the first naming a program found on PATH (not a shell keyword,
// builtin or variable assignment). Empty when the shell must run it.
std::vector<std::string> PlainCommand(const std::string& command) {
  static constexpr std::string_view kShellSyntax = "|&;<>()$`\\\"'*?[#~\n";
  if (command.find_first_of(kShellSyntax) != std::string::npos) return {};
  std::vector<std::string> words;
  std::size_t at = 0;
  while (true) {
    at = command.find_first_not_of(" \t", at);
    if (at == std::string::npos) break;
    const std::size_t end = std::min(command.find_first_of(" \t", at), command.size());
    words.push_back(command.substr(at, end - at));
    at = end;
  }
  if (words.empty() || words[0].find('=') != std::string::npos) return {};
  static const char* const kShellWords[] = {
      "!", "{", "}", "case", "do", "done", "elif", "else", "esac", "fi", "for", "if", "in",
      "then", "until", "while", ".", ":", "alias", "bg", "break", "cd", "command", "continue",
      "eval", "exec", "exit", "export", "fg", "getopts", "hash", "jobs", "local", "read",
      "readonly", "return", "set", "shift", "times", "trap", "type", "ulimit", "umask",
      "unalias", "unset", "wait"};
  for (const char* w : kShellWords) {
    if (words[0] == w) return {};
  }
  if (words[0].find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
    std::string found;
    std::size_t from = 0;
    while (found.empty() && from <= dirs.size()) {
      const std::size_t colon = std::min(dirs.find(':', from), dirs.size());
      std::string dir = dirs.substr(from, colon - from);
      if (dir.empty()) dir = ".";
      const std::string candidate = dir + "/" + words[0];
      if (::access(candidate.c_str(), X_OK) == 0) found = candidate;
      from = colon + 1;
    }
    if (found.empty()) return {};  // the shell says "not found" on stderr
    words[0] = found;
  }
  return words;
}

int MillisUntil(std::chrono::steady_clock::time_point t) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(t - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 60'000));
}

std::string NoneReadyError(std::chrono::milliseconds wait) {
  return fmt::format("no handler process was ready within {:g}s",
                     static_cast<double>(wait.count()) / 1000.0);
}

}  // namespace

struct ProcessHandler::Child {
  enum class State {
    kDown,      // no process; started again at restart_at (unless closing)
    kStarting,  // started, its `ready` not read yet
    kIdle,      // ready, holds no batch
    kBusy,      // holds batches; whoever made it busy drives the exchange
    kFailed,    // killed (or found dead); the supervisor reaps it
  };
  // A batch sent to it and not answered yet.
  struct Sent {
    Task task;                    // its payload kept only while it waits behind another
    std::uint64_t frame_end = 0;  // queued_bytes once its frame was queued
  };
  int slot = 0;
  State state = State::kDown;
  pid_t pid = -1;
  int pidfd = -1;
  int in = -1, out = -1, err = -1;  // our ends of its stdin, stdout, stderr
  std::uint32_t depth = 1;          // batches it takes at once (its ready's)
  bool exit_seen = false;           // its pidfd fired while it was busy
  std::string out_buf;              // stdout bytes not yet a whole frame
  // The batches it holds (kBusy), owned by whoever made it busy: oldest
  // first. It answers in order, so the oldest is the one running; the
  // others wait in its stdin.
  std::deque<Sent> inflight;
  std::string wbuf;                 // frames not yet all written to its stdin
  std::size_t wpos = 0;             // bytes of wbuf written
  std::uint64_t queued_bytes = 0;   // frame bytes put in wbuf since it started
  std::uint64_t written_bytes = 0;  // and written
  bool answered = false;            // it has answered a batch since it started
  Clock::time_point started{};      // the oldest batch began to run
  std::optional<Clock::time_point> deadline;  // and times out
  std::string err_line;             // stderr bytes not yet a whole line
  std::deque<std::string> err_tail;  // its last stderr lines
  Clock::time_point restart_at{};
  Clock::time_point started_at{};   // its process started (kStarting)
  bool slow_start_logged = false;   // "not ready yet" said once
  std::chrono::milliseconds backoff{0};
  std::string failure;  // why it was killed, for the restart log line
  // Objects: its process (counts starts, set under mu_), and the gets it
  // has out (reset with each process).
  std::uint64_t generation = 0;
  std::uint32_t gets_out = 0;
};

ProcessHandler::ProcessHandler(Options options)
    : options_(std::move(options)), kind_("handler") {
  if (options_.command.empty()) throw std::invalid_argument("process handler needs a command");
  if (options_.slots < 1 || options_.slots > 1024) {
    throw std::invalid_argument("process handler: slots must be in 1..1024");
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ready_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0 || ready_fd_ < 0) {
    CloseFd(&wake_fd_);
    CloseFd(&ready_fd_);
    throw std::runtime_error(std::string("process handler: eventfd: ") + std::strerror(errno));
  }
  for (int i = 0; i < options_.slots; ++i) {
    auto c = std::make_unique<Child>();
    c->slot = i;
    c->backoff = options_.backoff_initial;
    children_.push_back(std::move(c));
  }
  // The supervisor blocks the stop signals so they reach the loop's thread.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  supervisor_ = std::thread([this] { SupervisorMain(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

ProcessHandler::~ProcessHandler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Batches the loop still drives (the worker is going away without a
    // drain: an exception, a stop-now): their processes are killed, so the
    // supervisor can reap them; nobody will read their answers.
    for (Child* c : running_) KillLocked(*c, "the worker is stopping");
    running_.clear();
    queue_.clear();
    closing_ = true;
  }
  idle_cv_.notify_all();
  Wake();
  supervisor_.join();
  CloseFd(&wake_fd_);
  CloseFd(&ready_fd_);
}

void ProcessHandler::Wake() { Signal(wake_fd_); }
void ProcessHandler::NotifyReady() { Signal(ready_fd_); }
void ProcessHandler::AckReady() { Drain(ready_fd_); }

int ProcessHandler::CountReadyLocked() const {
  int n = 0;
  for (const auto& c : children_) {
    n += c->state == Child::State::kIdle || c->state == Child::State::kBusy;
  }
  return n;
}

int ProcessHandler::ready_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return CountReadyLocked();
}

int ProcessHandler::starts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starts_;
}

// ---- the supervisor ----

void ProcessHandler::SupervisorMain() {
  bool stdin_closed = false, killed = false;
  Clock::time_point close_deadline{};
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, int>> owners;  // per pollfd: child, 0 pidfd 1 out 2 err
  while (true) {
    std::vector<Child*> to_start;
    int timeout_ms = -1;
    fds.clear();
    owners.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      if (closing_) {
        if (!stdin_closed) {
          // No batch runs any more (the slots are gone): end of input is
          // the handlers' signal to exit.
          for (auto& c : children_) CloseFd(&c->in);
          stdin_closed = true;
          close_deadline = now + std::chrono::duration_cast<Clock::duration>(options_.grace);
        }
        bool any = false;
        for (auto& c : children_) any = any || c->pid > 0;
        if (!any) break;
        if (!killed && now >= close_deadline) {
          for (auto& c : children_) {
            if (c->pid <= 0) continue;
            spdlog::warn("{} slot {}: still running {:.1f}s after its stdin was closed; killed",
                         kind_, c->slot, options_.grace.count());
            ::kill(-c->pid, SIGKILL);
          }
          killed = true;
        }
        if (!killed) timeout_ms = MillisUntil(close_deadline);
      } else if (!aborted_) {
        for (auto& c : children_) {
          if (c->state != Child::State::kDown) continue;
          if (now >= c->restart_at) {
            c->state = Child::State::kStarting;  // nobody else touches it now
            to_start.push_back(c.get());
          } else {
            const int ms = MillisUntil(c->restart_at);
            timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
          }
        }
      }
      if (to_start.empty() && !closing_) {
        // One line for a handler slow to say ready: the worker waits for
        // it, and without this nothing would say why no work comes.
        for (auto& c : children_) {
          if (c->state != Child::State::kStarting || c->pid <= 0 || c->slow_start_logged) continue;
          const auto due = c->started_at + kSlowStartAfter;
          if (now >= due) {
            c->slow_start_logged = true;
            spdlog::warn("{} slot {} (pid {}): not ready {} s after it started; its slot "
                         "takes no work until it sends ready",
                         kind_, c->slot, c->pid, kSlowStartAfter.count());
          } else {
            const int ms = MillisUntil(due);
            timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
          }
        }
      }
      if (to_start.empty()) {
        for (auto& c : children_) {
          if (c->pid <= 0) continue;
          // A busy child's exit is its slot thread's to find (stdout ends);
          // once seen here, it is left out until that thread gives it up.
          if (!(c->state == Child::State::kBusy && c->exit_seen)) {
            fds.push_back({c->pidfd, POLLIN, 0});
            owners.emplace_back(c.get(), 0);
          }
          if (c->state == Child::State::kStarting && c->out >= 0) {
            fds.push_back({c->out, POLLIN, 0});
            owners.emplace_back(c.get(), 1);
          }
          if (c->err >= 0) {
            fds.push_back({c->err, POLLIN, 0});
            owners.emplace_back(c.get(), 2);
          }
        }
      }
    }
    if (!to_start.empty()) {
      for (Child* c : to_start) Spawn(*c);
      continue;
    }
    fds.push_back({wake_fd_, POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      spdlog::error("{}s: poll failed: {}", kind_, std::strerror(errno));
    }
    if (ready <= 0) continue;
    if (fds.back().revents != 0) Drain(wake_fd_);

    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    // stderr first, so a child's last words are logged before its exit.
    for (std::size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents != 0 && owners[i].second == 2) ReadStderr(*owners[i].first);
    }
    for (std::size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Child& c = *owners[i].first;
      if (owners[i].second == 1 && c.state == Child::State::kStarting) ReadStartup(c);
    }
    for (std::size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents == 0 || owners[i].second != 0) continue;
      Child& c = *owners[i].first;
      if (c.pid <= 0 || c.pidfd != fds[i].fd) continue;  // reaped already
      if (c.state == Child::State::kBusy) {
        // Whoever runs its batch finds the end of its stdout; kill what is
        // left of its process group, so that a child of it holding that
        // stdout cannot keep the batch waiting.
        c.exit_seen = true;
        ::kill(-c.pid, SIGKILL);
      } else {
        Reap(c, now);
      }
    }
  }
}

void ProcessHandler::ReadStderr(Child& c) {
  char buf[4096];
  // At most 64 KiB per wake-up: a handler writing without pause must not
  // keep the lock, which the worker's loop also takes, for long.
  for (int reads = 0; c.err >= 0 && reads < 16; ++reads) {
    const ssize_t n = ::read(c.err, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      if (!c.err_line.empty()) {
        spdlog::info("{} slot {}: {}", kind_, c.slot, c.err_line);
        c.err_tail.push_back(std::move(c.err_line));
        if (c.err_tail.size() > kStderrTailLines) c.err_tail.pop_front();
        c.err_line.clear();
      }
      CloseFd(&c.err);
      return;
    }
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == '\n') {
        spdlog::info("{} slot {}: {}", kind_, c.slot, c.err_line);
        c.err_tail.push_back(std::move(c.err_line));
        if (c.err_tail.size() > kStderrTailLines) c.err_tail.pop_front();
        c.err_line.clear();
      } else if (c.err_line.size() < kStderrLineMax) {
        c.err_line.push_back(buf[i]);
      }
    }
  }
}

void ProcessHandler::ReadStartup(Child& c) {
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(c.out, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EAGAIN: all read
    if (n == 0) {
      // It closed stdout before saying ready: it is exiting. Its pidfd
      // says when; stop watching stdout.
      CloseFd(&c.out);
      return;
    }
    c.out_buf.append(buf, static_cast<std::size_t>(n));
    if (c.out_buf.size() > 64 << 10) break;
  }
  std::size_t body = 0;
  switch (frames::ScanFrame(c.out_buf, 64 << 10, &body)) {
    case frames::Scan::kNeedMore:
      return;
    case frames::Scan::kTooLarge:
      KillLocked(c, "protocol error: a first frame of " + std::to_string(body) +
                        " bytes (expected ready)");
      return;
    case frames::Scan::kFrame:
      break;
  }
  frames::HandlerMessage m;
  std::string why;
  const std::string_view frame(c.out_buf.data() + frames::kHeaderBytes, body);
  if (!frames::DecodeHandlerMessage(frame, &m, &why)) {
    KillLocked(c, "protocol error: " + why + " (expected ready)");
    return;
  }
  if (m.kind != frames::HandlerMessage::Kind::kReady) {
    KillLocked(c, "protocol error: an answer before ready");
    return;
  }
  if (m.version != frames::kVersion) {
    KillLocked(c, "protocol error: handler protocol version " + std::to_string(m.version) +
                      " (this worker speaks " + std::to_string(frames::kVersion) + ")");
    return;
  }
  c.out_buf.erase(0, frames::kHeaderBytes + body);  // anything after it: found at the next batch
  c.depth = m.depth;
  c.state = Child::State::kIdle;
  if (c.depth > 1) {
    spdlog::info("{} slot {} ready (pid {}, takes {} batches at once)", kind_, c.slot, c.pid,
                 c.depth);
  } else {
    spdlog::info("{} slot {} ready (pid {})", kind_, c.slot, c.pid);
  }
  NotifyReady();
  idle_cv_.notify_one();
}

void ProcessHandler::Reap(Child& c, Clock::time_point now) {
  // Whatever the leader left in its process group goes with it. The
  // leader is a zombie until waitpid, so its id still names the group.
  ::kill(-c.pid, SIGKILL);
  int status = 0;
  while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (c.err >= 0) ReadStderr(c);  // its last lines, if the pipe holds any
  std::string how = WIFEXITED(status)
                        ? StatusText(CLD_EXITED, WEXITSTATUS(status))
                        : (WIFSIGNALED(status) ? StatusText(CLD_KILLED, WTERMSIG(status))
                                               : "wait status " + std::to_string(status));
  const Child::State was = c.state;
  const bool was_ready = was == Child::State::kIdle;
  CloseFd(&c.pidfd);
  CloseFd(&c.in);
  CloseFd(&c.out);
  CloseFd(&c.err);
  c.pid = -1;
  c.exit_seen = false;
  c.out_buf.clear();
  c.err_line.clear();
  c.state = Child::State::kDown;
  if (closing_ || aborted_) {
    spdlog::debug("{} slot {} exited ({})", kind_, c.slot, how);
    c.err_tail.clear();
    return;
  }
  c.restart_at = now + c.backoff;
  std::string tail;
  for (const auto& line : c.err_tail) tail += (tail.empty() ? "" : " | ") + line;
  c.err_tail.clear();
  if (was == Child::State::kFailed) {
    spdlog::warn("{} slot {} {}; restarting in {} ms", kind_, c.slot, c.failure,
                 c.backoff.count());
  } else {
    spdlog::warn("{} slot {} exited {} ({}){}; restarting in {} ms", kind_, c.slot,
                 was == Child::State::kStarting ? "before it was ready" : "while idle", how,
                 tail.empty() ? "" : "; last stderr: " + tail, c.backoff.count());
  }
  c.backoff = std::min(c.backoff * 2, options_.backoff_max);
  if (was_ready) NotifyReady();
}

void ProcessHandler::KillLocked(Child& c, const std::string& why) {
  const bool was_ready = c.state == Child::State::kIdle || c.state == Child::State::kBusy;
  if (c.pid > 0) ::kill(-c.pid, SIGKILL);
  c.failure = why;
  c.state = Child::State::kFailed;
  if (was_ready) NotifyReady();
  Wake();
}

void ProcessHandler::Spawn(Child& c) {
  int in_r = -1, in_w = -1, out_r = -1, out_w = -1, err_r = -1, err_w = -1;
  std::string error;
  if (!MakePipe(&in_r, &in_w) || !MakePipe(&out_r, &out_w) || !MakePipe(&err_r, &err_w)) {
    error = std::string("pipe: ") + std::strerror(errno);
  }
  // Everything the child needs is built before fork: between fork and exec
  // only async-signal-safe calls are made.
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view v(*e);
    if (v.rfind("FLEET_HANDLER_SLOT=", 0) == 0 || v.rfind("FLEET_WORKER_ID=", 0) == 0 ||
        v.rfind("FLEET_HANDLER_FEATURES=", 0) == 0) {
      continue;
    }
    env_strings.emplace_back(v);
  }
  env_strings.push_back("FLEET_HANDLER_SLOT=" + std::to_string(c.slot));
  env_strings.push_back("FLEET_WORKER_ID=" + options_.worker_id);
  if (options_.objects) env_strings.push_back("FLEET_HANDLER_FEATURES=objects");
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  // A plain command is run directly, so the handler is our child and gets
  // the parent-death signal itself (a shell would not pass it on).
  std::vector<std::string> words = PlainCommand(options_.command);
  if (words.empty()) words = {options_.shell, "-c", options_.command};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  pid_t pid = -1;
  int pidfd = -1;
  if (error.empty()) {
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      // Killed with the worker, whatever way it dies.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(in_r, 0);
      ::dup2(out_w, 1);
      ::dup2(err_w, 2);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      ::sigaction(SIGPIPE, &dfl, nullptr);
      ::sigaction(SIGINT, &dfl, nullptr);
      ::sigaction(SIGTERM, &dfl, nullptr);
      ::execve(argv[0], argv.data(), envp.data());
      static constexpr char kMsg[] = "fleet-worker: cannot execute the handler's command\n";
      (void)!::write(2, kMsg, sizeof(kMsg) - 1);
      ::_exit(127);
    }
    if (pid < 0) {
      error = std::string("fork: ") + std::strerror(errno);
    } else {
      ::setpgid(pid, pid);  // also here, so the group exists before any kill
      pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (pidfd < 0) {
        error = std::string("pidfd_open: ") + std::strerror(errno);
        ::kill(-pid, SIGKILL);
        ::kill(pid, SIGKILL);
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        pid = -1;
      }
    }
  }
  CloseFd(&in_r);
  CloseFd(&out_w);
  CloseFd(&err_w);

  std::lock_guard<std::mutex> lock(mu_);
  if (!error.empty()) {
    CloseFd(&in_w);
    CloseFd(&out_r);
    CloseFd(&err_r);
    c.state = Child::State::kDown;
    c.restart_at = Clock::now() + c.backoff;
    spdlog::error("{} slot {}: cannot start `{}`: {}; trying again in {} ms", kind_, c.slot,
                  options_.command, error, c.backoff.count());
    c.backoff = std::min(c.backoff * 2, options_.backoff_max);
    return;
  }
  SetNonBlockingFd(in_w);
  SetNonBlockingFd(out_r);
  SetNonBlockingFd(err_r);
  c.pid = pid;
  c.pidfd = pidfd;
  c.in = in_w;
  c.out = out_r;
  c.err = err_r;
  c.out_buf.clear();
  c.depth = 1;
  c.queued_bytes = c.written_bytes = 0;
  c.wbuf.clear();
  c.wpos = 0;
  c.answered = false;
  ++c.generation;  // answers to the gets of its last process are dropped
  c.gets_out = 0;
  ++starts_;
  spdlog::debug("{} slot {}: started pid {}", kind_, c.slot, pid);
  c.started_at = Clock::now();
  c.slow_start_logged = false;
  if (closing_) CloseFd(&c.in);  // started as the worker stops: let it go at once
}

// ---- batches ----

ProcessHandler::Child* ProcessHandler::AcquireIdleLocked() {
  for (auto& child : children_) {
    if (child->state != Child::State::kIdle) continue;
    Child& c = *child;
    c.state = Child::State::kBusy;
    // Output it wrote while it held no batch breaks the protocol; an end
    // of its stdout means it is on its way out. Either way it is not
    // used, and no batch is charged for it.
    char probe[256];
    ssize_t n;
    do {
      n = ::read(c.out, probe, sizeof(probe));
    } while (n < 0 && errno == EINTR);
    if (n >= 0 || !c.out_buf.empty()) {
      KillLocked(c, n == 0 ? "closed its stdout while idle"
                           : "protocol error: wrote to stdout while it held no batch");
      continue;
    }
    return &c;
  }
  return nullptr;
}

HandlerOutput ProcessHandler::Run(std::string payload, Timeout timeout) {
  return RunBatch(BatchInfo{}, std::move(payload), timeout);
}

HandlerOutput ProcessHandler::RunBatch(const BatchInfo& batch, std::string payload,
                                       Timeout timeout) {
  Child* c = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!idle_cv_.wait_for(lock, options_.ready_wait, [&] {
          return aborted_ || closing_ || (c = AcquireIdleLocked()) != nullptr;
        })) {
      return HandlerOutput::Retry(NoneReadyError(options_.ready_wait));
    }
    if (c == nullptr) return HandlerOutput::Retry("the worker is stopping its handlers");
  }
  Send(*c, Task{std::string(batch.id), std::string(batch.queue), batch.attempt, std::move(payload)},
       timeout);
  std::vector<Answer> answers;
  std::string failure;
  Step step;
  while ((step = Advance(*c, timeout, &answers, &failure, /*loop=*/false)) == Step::kPending) {
    pollfd fds[2];
    nfds_t n = 0;
    fds[n++] = {c->out, POLLIN, 0};
    if (c->wpos < c->wbuf.size()) fds[n++] = {c->in, POLLOUT, 0};
    int wait_ms = -1;
    if (c->deadline) {
      if (Clock::now() >= *c->deadline) {
        step = Step::kTimedOut;
        break;
      }
      wait_ms = std::max(1, MillisUntil(*c->deadline));
    }
    if (::poll(fds, n, wait_ms) < 0 && errno != EINTR) {
      step = Step::kBroken;
      failure = std::string("poll: ") + std::strerror(errno);
      break;
    }
  }
  if (step == Step::kAnswered) {
    Release(*c);
    return std::move(answers.front().out);
  }
  return Fail(*c, step, std::move(failure), timeout, std::chrono::milliseconds(1000), nullptr).out;
}

void ProcessHandler::SetDeadline(Child& c, Timeout timeout) {
  c.deadline.reset();
  if (timeout.count() > 0) {
    c.deadline = c.started + std::chrono::duration_cast<Clock::duration>(timeout);
  }
}

void ProcessHandler::Send(Child& c, Task task, Timeout timeout) {
  if (c.inflight.empty()) {
    c.started = Clock::now();
    SetDeadline(c, timeout);
  }
  const std::size_t before = c.wbuf.size();
  frames::AppendBatch(&c.wbuf, task.id, task.payload, task.attempt, task.queue);
  c.queued_bytes += c.wbuf.size() - before;
  // The one running is never sent again; one waiting behind it is, to
  // another process, if this one fails first.
  if (c.inflight.empty()) std::string().swap(task.payload);
  c.inflight.push_back(Child::Sent{std::move(task), c.queued_bytes});
}

bool ProcessHandler::Flush(Child& c, std::string* failure) {
  while (c.wpos < c.wbuf.size()) {
    const ssize_t w = ::write(c.in, c.wbuf.data() + c.wpos, c.wbuf.size() - c.wpos);
    if (w > 0) {
      c.wpos += static_cast<std::size_t>(w);
      c.written_bytes += static_cast<std::uint64_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && errno == EAGAIN) {
      return true;  // full; what it says meanwhile is still read
    } else {
      *failure = "handler exited";  // EPIPE: its stdin is closed
      return false;
    }
  }
  if (c.wbuf.capacity() > (1u << 20)) {
    std::string().swap(c.wbuf);  // a large payload is not kept per slot
  } else {
    c.wbuf.clear();
  }
  c.wpos = 0;
  return true;
}

ProcessHandler::Step ProcessHandler::Advance(Child& c, Timeout timeout,
                                             std::vector<Answer>* answers,
                                             std::string* failure, bool loop) {
  if (!Flush(c, failure)) return Step::kBroken;
  const std::uint64_t queued_before = c.queued_bytes;  // answers to gets come after
  // Whatever it wrote, also while frames are still going in, so a handler
  // that writes before it reads cannot deadlock us.
  std::string ended;  // why its stdout ended, if it did
  char buf[kReadChunk];
  while (true) {
    const ssize_t r = ::read(c.out, buf, sizeof(buf));
    if (r > 0) {
      c.out_buf.append(buf, static_cast<std::size_t>(r));
      if (static_cast<std::size_t>(r) < sizeof(buf)) break;  // drained
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) break;
    ended = r == 0 ? "handler exited" : std::string("handler stdout: ") + std::strerror(errno);
    break;
  }
  // Its answers, in the order of the batches: each one ends the oldest.
  std::size_t at = 0;
  const auto now = Clock::now();
  bool broken = false;
  while (!c.inflight.empty()) {
    std::size_t body = 0;
    const frames::Scan scan = frames::ScanFrame(
        std::string_view(c.out_buf).substr(at), options_.max_frame_bytes, &body);
    if (scan == frames::Scan::kNeedMore) break;
    broken = true;
    if (scan == frames::Scan::kTooLarge) {
      *failure = "protocol error: frame of " + std::to_string(body) + " bytes exceeds " +
                 std::to_string(options_.max_frame_bytes);
      break;
    }
    Child::Sent& head = c.inflight.front();
    if (c.written_bytes < head.frame_end) {
      *failure = "protocol error: an answer before the whole batch was read";
      break;
    }
    frames::HandlerMessage m;
    std::string why;
    const std::string_view frame(c.out_buf.data() + at + frames::kHeaderBytes, body);
    if (!frames::DecodeHandlerMessage(frame, &m, &why)) {
      *failure = "protocol error: " + why;
      break;
    }
    if (m.kind == frames::HandlerMessage::Kind::kReady) {
      *failure = "protocol error: ready while running a batch";
      break;
    }
    if (m.kind == frames::HandlerMessage::Kind::kGet) {
      if (!options_.objects) {
        *failure = "protocol error: get, but this worker offers no objects "
                   "(FLEET_HANDLER_FEATURES)";
        break;
      }
      broken = false;
      OnGet(c, m.tag, m.data, m.offset, m.length, loop);
      at += frames::kHeaderBytes + body;
      continue;
    }
    if (m.id != head.task.id) {
      *failure = "protocol error: an answer for batch \"" + std::string(m.id.substr(0, 64)) +
                 "\" while running \"" + head.task.id + "\"";
      break;
    }
    broken = false;
    answers->push_back(Answer{std::move(head.task.id), head.task.attempt,
                              m.kind == frames::HandlerMessage::Kind::kOk
                                  ? HandlerOutput::Ok(std::string(m.data))
                                  : HandlerOutput::Failed(std::string(m.data)),
                              now - c.started});
    c.inflight.pop_front();
    at += frames::kHeaderBytes + body;
    if (!c.inflight.empty()) {
      c.started = now;
      SetDeadline(c, timeout);
      std::string().swap(c.inflight.front().task.payload);  // now running
    }
    if (!c.answered) {
      c.answered = true;
      std::lock_guard<std::mutex> lock(mu_);
      c.backoff = options_.backoff_initial;  // it works: a next failure restarts it soon
    }
  }
  c.out_buf.erase(0, at);
  if (broken) return Step::kBroken;
  if (c.inflight.empty() && !c.out_buf.empty()) {
    // It wrote after its last answer (a `get` too late, say): it holds no
    // batch, so that breaks the protocol; restarted now, its answers kept.
    std::lock_guard<std::mutex> lock(mu_);
    spdlog::warn("{} slot {}: protocol error: wrote to stdout after answering its last batch; "
                 "restarting it",
                 kind_, c.slot);
    KillLocked(c, "protocol error: wrote to stdout while it held no batch");
    return Step::kAnswered;
  }
  // Answers to its gets made just now go out at once (a failed write shows
  // as the end of its stdout).
  if (c.queued_bytes != queued_before && c.wpos < c.wbuf.size()) {
    std::string ignored;
    Flush(c, &ignored);
  }
  if (c.inflight.empty()) return Step::kAnswered;
  if (!ended.empty()) {
    *failure = std::move(ended);
    return Step::kBroken;
  }
  return Step::kPending;
}

void ProcessHandler::Release(Child& c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (c.state != Child::State::kBusy) return;
  c.state = Child::State::kIdle;
  if (c.exit_seen) Wake();  // it answered, then exited: reap it
  c.exit_seen = false;
  idle_cv_.notify_one();
}

ProcessHandler::Answer ProcessHandler::Fail(Child& c, Step step, std::string failure,
                                            Timeout timeout,
                                            std::chrono::milliseconds exit_wait,
                                            std::deque<Task>* rest) {
  Answer a{};
  if (!c.inflight.empty()) {
    Child::Sent& head = c.inflight.front();
    a.id = std::move(head.task.id);
    a.attempt = head.task.attempt;
    a.took = Clock::now() - c.started;
    // The batches behind it never ran: another process takes them, at no
    // cost of an attempt.
    for (std::size_t i = c.inflight.size(); i-- > 1;) {
      if (rest != nullptr) rest->push_front(std::move(c.inflight[i].task));
    }
  }
  c.inflight.clear();
  c.wbuf.clear();
  c.wpos = 0;
  if (failure == "handler exited") {
    failure = "handler exited (" + DescribeExit(c, exit_wait) + ")";
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (step == Step::kTimedOut) {
    KillLocked(c, "ran batch " + a.id + " past --batch-timeout; killed");
    a.out = HandlerOutput::Failed(TimeoutError(timeout));
  } else {
    KillLocked(c, failure + " while running batch " + a.id);
    a.out = HandlerOutput::Retry(std::move(failure));
  }
  return a;
}

// ---- batches on the worker's loop ----

void ProcessHandler::Submit(std::vector<Task>& tasks, const Limits& limits,
                            std::vector<Completion>* done) {
  for (Task& t : tasks) queue_.push_back(std::move(t));
  tasks.clear();
  StartQueued(limits, done);
}

void ProcessHandler::Settle(Child& c, Step step, std::string failure, const Limits& limits,
                            std::vector<Completion>* done) {
  if (step == Step::kAnswered) {
    Release(c);
  } else if (step != Step::kPending) {
    answers_.push_back(Fail(c, step, std::move(failure), limits.timeout, kLoopExitWait, &queue_));
  }
  for (Answer& a : answers_) {
    done->push_back(Completion::FromOutput(a.id, a.attempt, std::move(a.out), a.took,
                                           limits.timeout, limits.max_result_bytes,
                                           limits.max_error_bytes));
  }
  answers_.clear();
}

void ProcessHandler::DropSettled() {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const Child* c) { return c->inflight.empty(); }),
                 running_.end());
}

void ProcessHandler::StartQueued(const Limits& limits, std::vector<Completion>* done) {
  const auto now = Clock::now();
  bool again = true;
  while (again && !queue_.empty()) {
    again = false;
    // Each batch to an idle process first; when none is idle, behind the
    // batches of the busy process with the most room (its ready's depth).
    touched_.clear();
    bool idle_left = true;
    while (!queue_.empty()) {
      Child* c = nullptr;
      if (idle_left) {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_ || closing_) return;
        c = AcquireIdleLocked();
        if (c == nullptr) {
          idle_left = false;
          // Every process busy is the normal wait; none ready at all is the
          // one that gives up after ready_wait.
          if (CountReadyLocked() > 0) {
            none_ready_since_.reset();
          } else if (!none_ready_since_) {
            none_ready_since_ = now;
          }
        } else {
          running_.push_back(c);
        }
      }
      if (c == nullptr) {
        for (Child* r : running_) {
          if (r->inflight.size() < r->depth &&
              (c == nullptr || r->inflight.size() < c->inflight.size())) {
            c = r;
          }
        }
        if (c == nullptr) break;
      }
      none_ready_since_.reset();
      Send(*c, std::move(queue_.front()), limits.timeout);
      queue_.pop_front();
      if (std::find(touched_.begin(), touched_.end(), c) == touched_.end()) {
        touched_.push_back(c);
      }
    }
    // Their frames go out in one write each; a quick handler on another
    // core may have answered already.
    for (Child* c : touched_) {
      std::string failure;
      const Step step = Advance(*c, limits.timeout, &answers_, &failure);
      // Room made, or batches given back: another round.
      again = again || step != Step::kPending || !answers_.empty();
      Settle(*c, step, std::move(failure), limits, done);
    }
    DropSettled();
  }
  if (!queue_.empty() && none_ready_since_ && now - *none_ready_since_ >= options_.ready_wait) {
    const std::string why = NoneReadyError(options_.ready_wait);
    spdlog::warn("{}s: {}; giving {} batches back", kind_, why, queue_.size());
    for (Task& t : queue_) {
      done->push_back(Completion::FromOutput(t.id, t.attempt, HandlerOutput::Retry(why),
                                             Timeout(0), limits.timeout,
                                             limits.max_result_bytes, limits.max_error_bytes));
    }
    queue_.clear();
    none_ready_since_.reset();
  }
}

void ProcessHandler::PollItems(std::vector<zmq::pollitem_t>* items) const {
  for (const Child* c : running_) {
    items->push_back({nullptr, c->out, ZMQ_POLLIN, 0});
    if (c->wpos < c->wbuf.size()) items->push_back({nullptr, c->in, ZMQ_POLLOUT, 0});
  }
}

void ProcessHandler::Service(const zmq::pollitem_t* items, std::size_t count,
                             const Limits& limits, std::vector<Completion>* done) {
  // The items follow running_'s order, one or two per process.
  std::size_t at = 0;
  const auto now = Clock::now();
  for (Child* c : running_) {
    const bool writing = c->wpos < c->wbuf.size();
    bool ready = false;
    for (std::size_t k = 0; k < (writing ? 2u : 1u) && at < count; ++k, ++at) {
      ready = ready || items[at].revents != 0;
    }
    std::string failure;
    Step step = ready ? Advance(*c, limits.timeout, &answers_, &failure) : Step::kPending;
    if (step == Step::kPending && c->deadline && now >= *c->deadline) step = Step::kTimedOut;
    Settle(*c, step, std::move(failure), limits, done);
  }
  DropSettled();  // before StartQueued, which gives batches to those in running_
  StartQueued(limits, done);
}

std::optional<std::chrono::steady_clock::time_point> ProcessHandler::NextDeadline() const {
  std::optional<Clock::time_point> next;
  for (const Child* c : running_) {
    if (c->deadline && (!next || *c->deadline < *next)) next = c->deadline;
  }
  if (!queue_.empty() && none_ready_since_) {
    const auto give_up = *none_ready_since_ + options_.ready_wait;
    if (!next || give_up < *next) next = give_up;
  }
  return next;
}

std::string ProcessHandler::DescribeExit(Child& c, std::chrono::milliseconds wait) {
  // Its stdout ended: wait a little for the process itself, then read its
  // status without reaping it (the supervisor does that).
  pollfd p{c.pidfd, POLLIN, 0};
  while (::poll(&p, 1, static_cast<int>(wait.count())) < 0 && errno == EINTR) {
  }
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(c.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid == c.pid) {
    return StatusText(info.si_code, info.si_status);
  }
  return "closed its stdout";
}

// ---- objects ----

void ProcessHandler::OnGet(Child& c, std::uint64_t tag, std::string_view digest,
                           std::uint64_t offset, std::uint64_t length, bool loop) {
  const auto answer_now = [&](proto::ObjectStatus status, std::string_view error) {
    const std::size_t before = c.wbuf.size();
    frames::AppendObject(&c.wbuf, tag, static_cast<std::uint32_t>(status), 0, offset, {}, error);
    c.queued_bytes += c.wbuf.size() - before;
  };
  if (digest.empty() || digest.size() > proto::kMaxDigestBytes || length == 0) {
    answer_now(proto::ObjectStatus::kBadRequest,
               "get needs a digest of 1 to 64 bytes and a length of at least 1");
    return;
  }
  if (!loop) {
    answer_now(proto::ObjectStatus::kBadRequest,
               "objects are fetched only on fleet-worker's loop, not by RunBatch");
    return;
  }
  std::uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = c.generation;
    if (c.gets_out >= kMaxGetsPerHandler) {
      generation = 0;
    } else {
      ++c.gets_out;
    }
  }
  if (generation == 0) {
    answer_now(proto::ObjectStatus::kBusy,
               "more than 16 requests out at once; ask again when one is answered");
    return;
  }
  const std::uint64_t ours = next_get_tag_++;
  gets_.emplace(ours, PendingGet{&c, generation, tag, offset});
  new_gets_.push_back(ObjectGetOut{ours, c.inflight.front().task.id, std::string(digest), offset,
                                   std::min(length, kMaxObjectChunk)});
}

void ProcessHandler::TakeObjectGets(std::vector<ObjectGetOut>* out) {
  out->clear();
  out->swap(new_gets_);
}

ProcessHandler::Delivery ProcessHandler::DeliverObject(std::uint64_t tag, std::uint32_t status,
                                                       std::uint64_t total, std::uint64_t offset,
                                                       std::string_view data,
                                                       std::string_view error) {
  const auto it = gets_.find(tag);
  if (it == gets_.end()) return Delivery::kUnknown;
  const PendingGet get = it->second;
  gets_.erase(it);
  Child& c = *get.child;
  std::lock_guard<std::mutex> lock(mu_);
  // A restarted handler gets no answer to its last process's requests.
  if (c.generation != get.generation) return Delivery::kStale;
  if (c.gets_out > 0) --c.gets_out;
  // A busy process's stdin is the loop's (polled for writing while frames
  // wait); an idle one takes what it can now, the rest before its next
  // batch. A failed one is on its way out.
  if (c.state != Child::State::kBusy && c.state != Child::State::kIdle) return Delivery::kStale;
  const std::size_t before = c.wbuf.size();
  frames::AppendObject(&c.wbuf, get.handler_tag, status, total, offset, data, error);
  c.queued_bytes += c.wbuf.size() - before;
  if (c.state == Child::State::kIdle) {
    std::string ignored;
    Flush(c, &ignored);
  }
  return Delivery::kDelivered;
}

void ProcessHandler::FailObjectGets(std::uint32_t status, std::string_view error) {
  std::vector<std::uint64_t> tags;
  tags.reserve(gets_.size());
  for (const auto& [tag, get] : gets_) tags.push_back(tag);
  std::sort(tags.begin(), tags.end());  // in the order they were asked
  for (std::uint64_t tag : tags) DeliverObject(tag, status, 0, gets_.at(tag).offset, {}, error);
}

void ProcessHandler::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  for (auto& c : children_) {
    if (c->pid > 0) ::kill(-c->pid, SIGKILL);
  }
  idle_cv_.notify_all();
}

}  // namespace fleet::worker

#include "tests/support/process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fleet::testing {

Process::Process(std::vector<std::string> argv, std::string log_path,
                 std::vector<std::string> env)
    : log_path_(std::move(log_path)) {
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    if (!log_path_.empty()) {
      int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    setpgid(0, 0);
    for (auto& e : env) putenv(e.data());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
}

Process::~Process() {
  if (!status_) {
    kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
}

void Process::Signal(int sig) const {
  if (!status_) kill(pid_, sig);
}

std::optional<int> Process::Wait(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool Process::Running() { return !Wait(std::chrono::milliseconds(0)).has_value(); }

std::string Process::ReadLog() const { return ReadFile(log_path_); }

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "fleet-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Bin(const std::string& name) { return std::string(FLEET_BIN_DIR) + "/" + name; }

std::vector<pid_t> WorkerPids(const std::string& prefix) {
  // "[-]-id": the shell running pgrep does not match its own pattern.
  return PidsMatching("[-]-id " + prefix);
}

std::vector<pid_t> PidsMatching(const std::string& pattern) {
  std::vector<pid_t> pids;
  std::string cmd = "pgrep -f -- '" + pattern + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return pids;
  int pid;
  while (std::fscanf(p, "%d", &pid) == 1) pids.push_back(pid);
  pclose(p);
  return pids;
}

}  // namespace fleet::testing

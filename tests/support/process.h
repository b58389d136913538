// A child process for integration tests: fork/exec with stdout and stderr
// sent to a log file, killed (SIGKILL) when the object goes away so a failed
// test leaves nothing running.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace fleet::testing {

class Process {
 public:
  // Starts `argv` (argv[0] a path). stdout+stderr go to `log_path` ("" keeps
  // the test's). `env` entries ("K=V") are added to the environment.
  Process(std::vector<std::string> argv, std::string log_path = "",
          std::vector<std::string> env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig) const;
  // Waits up to `timeout` for exit; returns the exit code (128+signal when
  // killed by a signal) or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  bool Running();
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string log_path_;
};

// A fresh temporary directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path);

// Pids of live processes started with "--id PREFIX..." (fleet workers of
// one autoscaler run), found with pgrep -f.
std::vector<pid_t> WorkerPids(const std::string& prefix);
inline int CountWorkers(const std::string& prefix) {
  return static_cast<int>(WorkerPids(prefix).size());
}

// Pids of live processes whose command line matches the extended regular
// expression `pattern` (pgrep -f); put one character of it in brackets
// ("[-]-marker x") so the shell running pgrep does not match itself.
std::vector<pid_t> PidsMatching(const std::string& pattern);

// Path of a program in build/bin.
std::string Bin(const std::string& name);

}  // namespace fleet::testing

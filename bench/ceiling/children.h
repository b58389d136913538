// Process plumbing for fleet-bench-ceiling's drivers: the stop signals, the
// child processes (broker and workers exec'd from this binary, producers
// forked) and the broker's report pipe.
//
// Not thread-safe: the drivers are single-threaded until their producer
// makes a ZeroMQ context, which happens after the last fork.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fleet::bench::ceiling {

// Installs SIGINT/SIGTERM handlers that only set a flag and make StopFd()
// readable, so a loop blocked in a poll that watches it wakes up (the flag
// alone races: a signal landing just before the poll syscall goes unseen
// until the next message; the broker was seen ignoring SIGTERM that way).
// Throws std::runtime_error when the pipe cannot be made.
void InstallStopHandlers();
bool StopRequested();
int StopFd();  // -1 before InstallStopHandlers

// Thrown by the waits below once a stop signal came.
struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// One line on stderr, prefixed with the program's name.
void Log(const std::string& what);

// Closes `fd` if open and sets it to -1.
void CloseFd(int& fd);

// Waits until `fd` is readable; false at `deadline_ns` (NowNs() clock; 0:
// none). Calls `check` every 100 ms (it may throw); throws Interrupted.
bool WaitReadable(int fd, std::int64_t deadline_ns, const std::function<void()>& check);

// The processes a driver starts. Services (broker, workers) must outlive the
// run; producers end by themselves. Every child gets SIGKILL from the kernel
// when this process dies (PR_SET_PDEATHSIG); the destructor stops and reaps
// them all. Not copyable.
class Children {
 public:
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() { StopAll(); }

  // fork + exec of this binary (/proc/self/exe) with `args`: a service.
  // `report_fd` (if >= 0) becomes the child's fd 3; the child's stdout goes
  // to our stderr, since our stdout carries the result. Throws when fork
  // fails.
  void Spawn(const std::string& name, const std::vector<std::string>& args, int report_fd = -1);

  // fork running `body`, whose return value is the exit code (1 if it
  // throws; logged). The child leaves with _exit: no destructors of the
  // parent's objects. Requires: this process has no ZeroMQ context yet.
  void Fork(const std::string& name, const std::function<int()>& body);

  // Throws std::runtime_error naming the first service that has exited.
  void CheckServices();

  // SIGTERM to all, up to 2 s to go, then SIGKILL; reaps every child.
  void StopAll();

 private:
  struct Proc {
    pid_t pid;
    std::string name;
    bool service;
  };

  static pid_t StartChild();

  std::vector<Proc> procs_;
};

// Reads the broker's report pipe (--report-fd) line by line.
class ReportReader {
 public:
  explicit ReportReader(int fd) : fd_(fd) {}
  // The next line without its newline. Throws after `timeout_s`, when the
  // pipe closes, when a service of `kids` exits, or Interrupted.
  std::string Line(Children& kids, double timeout_s);

 private:
  int fd_;
  std::string buf_;
};

}  // namespace fleet::bench::ceiling

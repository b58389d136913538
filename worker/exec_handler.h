// The exec handler: runs a shell command per batch (/bin/sh -c CMD) with the
// payload on stdin and returns its stdout.
//
// Owns the child processes it starts, each in its own process group, and
// reaps every one of them before Run returns. Thread-safe: slots run it
// concurrently; the set of live children is guarded by a mutex so Abort can
// kill them from another thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <mutex>
#include <set>
#include <string>

#include "worker/handler.h"

namespace fleet::worker {

class ExecHandler : public Handler {
 public:
  struct Options {
    std::string command;                          // passed to sh -c; non-empty
    std::string shell = "/bin/sh";                // absolute path
    std::size_t max_output_bytes = 16u << 20;     // stdout cap; 1 B..1 GiB
    std::size_t stderr_tail_bytes = 2048;         // kept for the error text
  };

  // Throws std::invalid_argument when options.command is empty.
  explicit ExecHandler(Options options);

  // Fails the batch when the command cannot start, exits non-zero (the error
  // carries the status and the tail of stderr), dies by a signal, writes more
  // than max_output_bytes to stdout, or outlives `timeout` (its process group
  // is then SIGKILLed and reaped). stdin, stdout and stderr are serviced
  // together with poll(), so a big payload or big output cannot deadlock.
  HandlerOutput Run(std::string payload, Timeout timeout) override;

  // SIGKILLs the process group of every running child.
  void Abort() override;

  std::string_view name() const override { return "exec"; }

 private:
  Options options_;
  std::mutex mu_;
  std::set<pid_t> live_;  // guarded by mu_: children not yet reaped
};

}  // namespace fleet::worker

// ProcessLauncher: starts each worker as a local child process:
//   /bin/sh -c 'exec WORKER_BIN --id ID WORKER_ARGS'
// (the shell only parses the user's --worker-args and is replaced by the
// worker, so the pid is the worker's). Children run in their own process
// group, so a Ctrl-C at the terminal reaches the autoscaler, which then
// drains them in order; and they get SIGTERM if the autoscaler dies
// (PR_SET_PDEATHSIG), so a killed autoscaler leaves no orphan running.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autoscaler/launcher.h"

namespace fleet::autoscaler {

class ProcessLauncher : public Launcher {
 public:
  // `worker_bin`: path of fleet-worker; `worker_args`: shell words appended
  // after --id.
  ProcessLauncher(std::string worker_bin, std::string worker_args);
  ~ProcessLauncher() override;

  const char* name() const override { return "process"; }
  bool Start(const std::string& id, TimePoint now, std::string* error) override;
  void Stop(const std::string& id, Duration grace, TimePoint now) override;
  void CancelStop(const std::string& id) override;
  std::vector<Exited> Poll(TimePoint now) override;
  std::vector<std::string> Alive() const override;
  void StopAll(Duration grace) override;

  // The shell command line used for `id` (for logs and tests).
  std::string CommandFor(const std::string& id) const;

 private:
  struct Child {
    pid_t pid = -1;
    std::optional<TimePoint> term_at;  // SIGTERM due
    std::optional<TimePoint> kill_at;  // SIGKILL due
    Duration grace{};
    bool termed = false;
  };

  std::string worker_bin_;
  std::string worker_args_;
  std::map<std::string, Child> children_;
};

// Forks /bin/sh -c `command` in its own process group, with default signal
// dispositions, SIGTERM when this process dies, and this process's
// environment minus every FLEET_* variable (ChildEnvironment). Returns the
// pid, or -1 with `error` set.
pid_t SpawnShell(const std::string& command, std::string* error);

// Variables starting with this are the autoscaler's own settings (every
// flag of every fleet program reads FLEET_<FLAG>): they never reach a
// worker or a start/stop command, which get their settings from
// --worker-args or the command template alone. Otherwise FLEET_METRICS,
// FLEET_CURVE_KEY or FLEET_LOG_LEVEL meant for the autoscaler would become
// every worker's --metrics, --curve-key or --log-level.
inline constexpr const char* kStrippedPrefix = "FLEET_";

// `env` (a NULL-terminated "K=V" array such as environ) without the
// variables named kStrippedPrefix*; everything else (PATH, HOME, LANG, ...)
// is kept in order.
std::vector<std::string> ChildEnvironment(const char* const* env);

// Quotes `s` for /bin/sh (single quotes).
std::string ShellQuote(const std::string& s);

// fleet-worker beside the running program (/proc/self/exe), or "fleet-worker"
// from PATH when that file does not exist.
std::string DefaultWorkerBin();

}  // namespace fleet::autoscaler

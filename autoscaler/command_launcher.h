// CommandLauncher: starts and stops workers with user commands, for any
// orchestrator: --start-command and --stop-command are /bin/sh templates in
// which {id} becomes the worker id. A start command may run the worker
// itself (it is then tracked like a process) or hand it to something else
// and exit 0 (`docker run -d ...`); a non-zero exit is a failed start.
// Stopping runs the stop command after the grace (the worker, retired at the
// broker, usually left by then), and kills a still-running start command
// after a second grace.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autoscaler/launcher.h"

namespace fleet::autoscaler {

class CommandLauncher : public Launcher {
 public:
  CommandLauncher(std::string start_template, std::string stop_template);
  ~CommandLauncher() override;

  const char* name() const override { return "command"; }
  bool Start(const std::string& id, TimePoint now, std::string* error) override;
  void Stop(const std::string& id, Duration grace, TimePoint now) override;
  void CancelStop(const std::string& id) override;
  std::vector<Exited> Poll(TimePoint now) override;
  std::vector<std::string> Alive() const override;
  void StopAll(Duration grace) override;

  // `tmpl` with every {id} replaced by the shell-quoted id.
  static std::string Expand(const std::string& tmpl, const std::string& id);

 private:
  struct Worker {
    pid_t start_pid = -1;         // the start command, while it runs
    bool detached = false;        // start command exited 0: worker runs elsewhere
    std::optional<TimePoint> stop_at;  // run the stop command
    std::optional<TimePoint> kill_at;  // SIGKILL a start command still running
    Duration grace{};
    bool stop_ran = false;
  };
  void RunStopCommand(const std::string& id);
  void ReapHelpers();

  std::string start_template_;
  std::string stop_template_;
  std::map<std::string, Worker> workers_;
  std::vector<pid_t> helpers_;  // stop commands still running
};

}  // namespace fleet::autoscaler

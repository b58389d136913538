// Launcher: how the autoscaler starts and stops workers. The process
// launcher forks fleet-worker locally; the command launcher runs user
// templates; the Docker launcher (deployment) drives the Engine API. The
// autoscaler retires a worker through the broker first and only then asks
// the launcher to make sure it is gone.
//
// Implementations are not thread-safe: the autoscaler loop is their only
// caller. None may block the loop on the outside world (a container engine,
// an orchestrator's API) except StopAll at shutdown: slow work runs off the
// loop (the Docker launcher's engine calls run on its own thread) and comes
// back through Poll.
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"

namespace fleet::autoscaler {

struct Exited {
  std::string id;
  int status = 0;     // exit code, or 128 + signal; -1 when unknown
  std::string error;  // set when the start itself failed (the worker never ran)
};

class Launcher {
 public:
  virtual ~Launcher() = default;

  // Short name for logs ("process", "command", "docker").
  virtual const char* name() const = 0;

  // Starts a worker with this id. Returns false with `error` set when the
  // start failed at once (the worker will not appear). True means started
  // or accepted and in progress: a start that fails later is reported by a
  // later Poll as an exit with `error` set (the pool book then counts a
  // start failure, as for a worker that exits before registering).
  virtual bool Start(const std::string& id, TimePoint now, std::string* error) = 0;

  // Makes sure the worker goes away: it is given `grace` to leave on its own
  // (a retired worker drains and exits), then SIGTERM (or the stop command),
  // then SIGKILL after `grace` more. Progress happens in Poll.
  virtual void Stop(const std::string& id, Duration grace, TimePoint now) = 0;

  // Cancels a pending Stop (the worker was taken back before it left).
  virtual void CancelStop(const std::string& id) = 0;

  // Reaps exited workers, escalates pending stops. Returns the workers that
  // exited since the last call.
  virtual std::vector<Exited> Poll(TimePoint now) = 0;

  // Workers it found running that it did not start in this run (the Docker
  // launcher adopts its pool's containers after an autoscaler restart),
  // reported once each, in the Poll that found them. The loop books them.
  virtual std::vector<std::string> TakeAdopted() { return {}; }

  // Workers it started that have not exited (as far as it can tell).
  virtual std::vector<std::string> Alive() const = 0;

  // Shutdown: stops every worker it started, waiting up to 2 x grace in all.
  virtual void StopAll(Duration grace) = 0;
};

}  // namespace fleet::autoscaler

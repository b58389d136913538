// Autoscaler: the fleet-autoscaler loop. Each poll it reads the broker's
// metrics, reconciles its pool book, asks the policy, and acts: take back
// retiring workers, launch new ones, retire idle ones through the broker
// (retire-if-idle, so a worker that became busy since the read is refused),
// and makes sure retired workers are gone through the launcher.
//
// Owns its PoolTracker and Policy; borrows the launcher, the metrics
// source, the control client and the clock. Not thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "autoscaler/autoscaler_metrics.h"
#include "autoscaler/launcher.h"
#include "autoscaler/metrics_source.h"
#include "autoscaler/policy.h"
#include "autoscaler/pool.h"
#include "client/control_client.h"
#include "client/demand_watch.h"
#include "common/clock.h"

namespace fleet::autoscaler {

struct AutoscalerOptions {
  PolicyOptions policy;
  PoolOptions pool;
  // A retired worker gets this long to drain and exit before SIGTERM (then
  // SIGKILL after as long again). Must exceed the longest batch. 0..1 h.
  Duration grace = Seconds(30);
  // Each control call (stats, retire, unretire) waits at most this. 
  std::chrono::milliseconds control_timeout{2000};
};

class Autoscaler {
 public:
  Autoscaler(AutoscalerOptions options, std::string run_tag, Launcher& launcher,
             MetricsSource& source, client::ControlClient& control, AutoscalerMetrics& metrics);

  // One poll at `now`. `demand`: the queue depth the broker's wait-demand
  // answer reported, when that answer is what woke this poll.
  void Step(TimePoint now, std::optional<double> demand = std::nullopt);

  // With a watch, Run keeps a wait-demand request out after each scheduled
  // poll that leaves the pool with no worker and sees no work, and polls at
  // once when the broker answers that work waits: scaling from zero does
  // not wait for the next poll. Borrowed; null (the default) polls on the
  // interval only.
  void SetDemandWatch(client::DemandWatch* watch) { watch_ = watch; }

  // Polls every policy.poll (and on demand, see SetDemandWatch) until
  // stop() is true, then stops every worker it started (they drain) and
  // returns 0.
  int Run(const Clock& clock, const std::function<bool()>& stop);

  const PoolTracker& pool() const { return pool_; }
  const Decision& last_decision() const { return last_; }

 private:
  std::optional<double> ControlQueued();
  // Sends op(id) on the control socket; true when the broker said ok.
  // `answered` is false when no reply came in time.
  bool ControlOp(const char* op, const std::string& id, std::string* message, bool* answered);
  void LogDecision(const Decision& d, const Observation& obs);

  AutoscalerOptions options_;
  PoolTracker pool_;
  Policy policy_;
  Launcher& launcher_;
  MetricsSource& source_;
  client::ControlClient& control_;
  client::DemandWatch* watch_ = nullptr;
  AutoscalerMetrics& metrics_;
  Decision last_;
  std::string last_logged_;       // reason of the last hold we logged
  bool source_failing_ = false;   // for one log line per outage, not per poll
};

}  // namespace fleet::autoscaler

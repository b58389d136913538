// Autoscaler: the fleet-autoscaler loop. Each poll it reads the broker's
// metrics, reconciles its pool book, asks the policy, and acts: take back
// retiring workers, launch new ones, retire idle ones through the broker
// (retire-if-idle, so a worker that became busy since the read is refused),
// and makes sure retired workers are gone through the launcher.
//
// The loop never waits on the outside world. The metrics read runs on a
// MetricsReader's thread with one deadline (--metrics-timeout); a poll
// decides as soon as its read is in, or after min(metrics timeout, poll)
// without it (then as on a stale read: scale-down frozen, scale-up from the
// broker's control stats). Launchers only queue their slow work (the Docker
// launcher's engine calls run on its own thread). The control calls to the
// broker are the one synchronous exchange left, and every one is bounded:
// each by control_timeout, all of one decision together by
// min(control_timeout, poll / 2), so the loop is free half of every poll
// even when the broker does not answer.
//
// Owns its PoolTracker, Policy and MetricsReader; borrows the launcher, the
// metrics source (used by the reader's thread only), the control client and
// the metrics. Not thread-safe: one thread calls Turn or Run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "autoscaler/autoscaler_metrics.h"
#include "autoscaler/launcher.h"
#include "autoscaler/metrics_reader.h"
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
  // Each control call (stats, retire, unretire) waits at most this, and the
  // control calls of one decision together at most min(this, poll / 2): calls
  // left when that is spent wait for the next poll. Real time (a call
  // blocks the loop). 10 ms .. 10 s.
  std::chrono::milliseconds control_timeout{2000};
  // One deadline for each metrics read, all of its queries together
  // (--metrics-timeout). A read that has not answered by then is a
  // timed-out read: counted, logged, and it changes nothing. 50 ms .. 60 s.
  Duration metrics_timeout = Seconds(2);
};

class Autoscaler {
 public:
  // Starts the metrics reader's thread.
  Autoscaler(AutoscalerOptions options, std::string run_tag, Launcher& launcher,
             MetricsSource& source, client::ControlClient& control, AutoscalerMetrics& metrics);

  // One turn of the loop at `now`; never waits except for the bounded
  // control calls of a decision. Takes a finished (or timed-out) metrics
  // read; opens a poll when one is due (its time came, or `demand`: the
  // queue depth of the broker's wait-demand answer) and starts its read;
  // decides once the poll's read is in or min(metrics timeout, poll) has
  // passed. Returns when the next turn is due, unless metrics_fd() or a
  // socket wakes the loop first.
  TimePoint Turn(TimePoint now, std::optional<double> demand = std::nullopt);

  // With a watch, Run keeps a wait-demand request out after each scheduled
  // poll that leaves the pool with no worker and sees no work, and polls at
  // once when the broker answers that work waits: scaling from zero does
  // not wait for the next poll. Borrowed; null (the default) polls on the
  // interval only.
  void SetDemandWatch(client::DemandWatch* watch) { watch_ = watch; }

  // Turns until stop() is true, sleeping in zmq_poll in between (woken by
  // the next deadline, a finished metrics read, the watch, or a signal),
  // then stops every worker it started (they drain) and returns 0. When
  // the broker refuses the control client's handshake for good, stops the
  // workers it started and throws fleet::AuthenticationError.
  int Run(const Clock& clock, const std::function<bool()>& stop);

  const PoolTracker& pool() const { return pool_; }
  const Decision& last_decision() const { return last_; }
  // Decisions made so far (one per poll).
  std::uint64_t decisions() const { return decisions_; }
  // Readable when a metrics read has finished (for a caller's own poll).
  int metrics_fd() const { return reader_.fd(); }

 private:
  int Loop(const Clock& clock, const std::function<bool()>& stop);
  // What is left of one decision's time for control calls (real time).
  // The control time of a decision: min(control_timeout, poll / 2).
  std::chrono::milliseconds ControlTime() const;
  struct ControlBudget {
    std::chrono::steady_clock::time_point deadline;
    int skipped = 0;  // calls not made: no time left
  };

  // The old Step: one decision on `read` (null: none finished in time).
  void Decide(TimePoint now, const MetricsRead* read, std::optional<double> demand);
  void NoteRead(const MetricsRead& read);
  std::optional<double> ControlQueued(ControlBudget& budget);
  // Sends op(id) on the control socket; true when the broker said ok.
  // `answered` is false when no reply came in time (or none was asked for:
  // the budget was spent).
  bool ControlOp(const char* op, const std::string& id, ControlBudget& budget,
                 std::string* message, bool* answered);
  void LogDecision(const Decision& d, const Observation& obs);

  AutoscalerOptions options_;
  PoolTracker pool_;
  Policy policy_;
  Launcher& launcher_;
  MetricsSource& source_;
  client::ControlClient& control_;
  client::DemandWatch* watch_ = nullptr;
  AutoscalerMetrics& metrics_;
  MetricsReader reader_;
  Decision last_;
  std::uint64_t decisions_ = 0;
  std::string last_logged_;       // reason of the last hold we logged
  bool source_failing_ = false;   // for one log line per outage, not per poll
  int timeouts_in_a_row_ = 0;     // timed-out reads since the last good one
  bool waiting_logged_ = false;   // "deciding without a read", once per episode

  // The poll in progress: opened at its time (or on demand), decided when
  // its read is in or at decide_by_.
  bool poll_open_ = false;
  bool poll_woken_ = false;  // opened by the broker's demand, before its time
  bool last_woken_ = false;  // the last decision's poll was
  TimePoint next_poll_{};    // the next scheduled poll (the first at once)
  TimePoint decide_by_{};
  std::optional<double> demand_;
  std::optional<MetricsRead> latest_;  // read finished since the poll's read started
};

}  // namespace fleet::autoscaler

// fleet-autoscaler-sim: runs a trace through the real autoscaler policy and
// pool bookkeeping on a simulated broker and prints the figures as
// key=value lines.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "autoscaler/policy.h"
#include "autoscaler/simulator.h"
#include "common/flags.h"

int main(int argc, char** argv) {
  using fleet::autoscaler::PolicyKind;
  fleet::autoscaler::SimOptions o;
  std::string trace_name = "burst";
  std::string trace_file;
  std::string policy = "backlog";
  std::string dispatch = "most-recent";
  double processing = 0.5;
  double idle = 60, cooldown = 30, stabilization = 60, drain = 10, start_timeout = 30;
  int poll_ms = 1000;
  int tick_ms = 10;
  bool verbose = false;

  CLI::App app{
      "fleet-autoscaler-sim: drives the autoscaler policy on a simulated broker and "
      "prints flaps, worker-seconds, queue wait, reaction and scale-down times"};
  app.add_option("--trace", trace_name,
                 "burst, steady, sawtooth, burst-after-scale-down, step-down (6 workers' worth "
                 "for 120 s, then 2 for 180 s)")
      ->check(CLI::IsMember({"burst", "steady", "sawtooth", "burst-after-scale-down", "step-down"}))
      ->capture_default_str();
  app.add_option("--trace-file", trace_file,
                 "CSV of arrival_seconds[,processing_seconds] (overrides --trace)");
  app.add_option("--processing-seconds", processing, "processing time for CSV lines without one")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--policy", policy, "backlog or throughput")
      ->check(CLI::IsMember({"backlog", "throughput"}))
      ->capture_default_str();
  app.add_option("--min", o.policy.min_workers, "fewest workers")->capture_default_str();
  app.add_option("--max", o.policy.max_workers, "most workers")->capture_default_str();
  app.add_option("--initial", o.policy.initial_workers, "workers at start")->capture_default_str();
  app.add_option("--target-per-worker", o.policy.target_per_worker,
                 "backlog policy: batches (queued + in flight) per worker")
      ->capture_default_str();
  app.add_option("--max-step", o.policy.max_step, "most workers added per poll")
      ->capture_default_str();
  app.add_option("--max-step-down", o.policy.max_step_down, "most workers retired per poll")
      ->capture_default_str();
  app.add_option("--min-survivors", o.policy.min_survivors, "never retire below this")
      ->capture_default_str();
  app.add_option("--idle-seconds", idle, "retire only workers idle this long")
      ->capture_default_str();
  app.add_option("--cooldown-seconds", cooldown, "between scale-downs")->capture_default_str();
  app.add_option("--stabilization-seconds", stabilization,
                 "scale down to the highest desired of this window")
      ->capture_default_str();
  app.add_option("--target-drain-seconds", drain, "throughput policy: drain the queue within")
      ->capture_default_str();
  app.add_option("--start-timeout-seconds", start_timeout, "kill starts not registered by then")
      ->capture_default_str();
  app.add_option("--poll-ms", poll_ms, "poll interval")->capture_default_str();
  app.add_option("--tick-ms", tick_ms, "simulation step (divides --poll-ms)")
      ->capture_default_str();
  app.add_option("--startup-seconds", o.startup_seconds, "launch -> registered")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--concurrency", o.concurrency, "slots per worker")->capture_default_str();
  app.add_option("--drain-seconds", o.drain_seconds, "retired idle worker -> exited")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--failing-starts", o.failing_starts, "the first N launches never register")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--metrics-lag-polls", o.metrics_lag_polls, "metrics are this many polls old")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--dispatch", dispatch,
                 "most-recent (the broker's packing: the worker that most recently had work and "
                 "has a free slot) or round-robin (the older broker's order, which spreads "
                 "partial load over every worker)")
      ->check(CLI::IsMember({"round-robin", "most-recent"}))
      ->capture_default_str();
  app.add_option("--outage-from", o.outage_from, "metrics fail from this second")
      ->capture_default_str();
  app.add_option("--outage-to", o.outage_to, "... until this second")->capture_default_str();
  app.add_option("--max-seconds", o.max_seconds, "stop the simulation at")
      ->check(CLI::Range(1.0, 1e7))
      ->capture_default_str();
  app.add_flag("--verbose", verbose, "print every decision that is not a steady hold");
  fleet::AddEnvNames(app);
  if (int rc = fleet::ParseFlags(app, argc, argv); rc >= 0) return rc;

  try {
    o.policy.kind = *fleet::autoscaler::ParsePolicyKind(policy);
    o.policy.idle =
        std::chrono::duration_cast<fleet::Duration>(std::chrono::duration<double>(idle));
    o.policy.cooldown =
        std::chrono::duration_cast<fleet::Duration>(std::chrono::duration<double>(cooldown));
    o.policy.stabilization =
        std::chrono::duration_cast<fleet::Duration>(std::chrono::duration<double>(stabilization));
    o.policy.target_drain =
        std::chrono::duration_cast<fleet::Duration>(std::chrono::duration<double>(drain));
    o.policy.poll = fleet::Millis(poll_ms);
    o.policy.rate_window = std::max<fleet::Duration>(o.policy.rate_window, 2 * o.policy.poll);
    o.pool.start_timeout =
        std::chrono::duration_cast<fleet::Duration>(std::chrono::duration<double>(start_timeout));
    o.tick = fleet::Millis(tick_ms);
    o.dispatch = dispatch == "most-recent" ? fleet::autoscaler::DispatchOrder::kMostRecent
                                           : fleet::autoscaler::DispatchOrder::kRoundRobin;
    if (verbose) {
      o.on_decision = [](double t, const fleet::autoscaler::Decision& d) {
        if (d.action == "hold" && d.reason_code == "steady") return;
        std::printf("# t=%.1f desired=%d pool=%d action=%s reason=%s: %s\n", t, d.desired, d.pool,
                    d.action.c_str(), d.reason_code.c_str(), d.reason.c_str());
      };
    }
    const fleet::autoscaler::Trace trace =
        trace_file.empty() ? fleet::autoscaler::BuiltinTrace(trace_name)
                           : fleet::autoscaler::LoadCsvTrace(trace_file, processing);
    const fleet::autoscaler::SimReport report = fleet::autoscaler::Simulate(trace, o);
    std::cout << report.ToKeyValues();
    return report.retired_while_holding == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::cerr << "fleet-autoscaler-sim: " << e.what() << "\n";
    return 2;
  }
}

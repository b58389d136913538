#include "autoscaler/autoscaler_metrics.h"


namespace fleet::autoscaler {
namespace {

prometheus::Counter& Plain(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

AutoscalerMetrics::AutoscalerMetrics(const std::string& bind_address,
                                     const std::optional<BasicAuth>& auth)
    : registry_(std::make_shared<prometheus::Registry>()),
      desired_(prometheus::BuildGauge()
                   .Name("fleet_autoscaler_desired_workers")
                   .Help("Pool size the autoscaler's policy wants")
                   .Register(*registry_)
                   .Add({})),
      workers_(prometheus::BuildGauge()
                   .Name("fleet_autoscaler_workers")
                   .Help("Workers as the autoscaler sees them, by state")
                   .Register(*registry_)),
      starting_(workers_.Add({{"state", "starting"}})),
      running_(workers_.Add({{"state", "running"}})),
      retiring_(workers_.Add({{"state", "retiring"}})),
      decisions_(prometheus::BuildCounter()
                     .Name("fleet_autoscaler_decisions_total")
                     .Help("Scaling decisions by action and reason")
                     .Register(*registry_)),
      start_failures_(Plain(*registry_, "fleet_autoscaler_start_failures_total",
                            "Workers that failed to start or register in time")),
      source_errors_(Plain(*registry_, "fleet_autoscaler_metric_source_errors_total",
                           "Metric reads that failed, timed out or were stale")),
      source_timeouts_(Plain(*registry_, "fleet_autoscaler_metric_source_timeouts_total",
                             "Metric reads that ran into --metrics-timeout (also counted as "
                             "errors); each changed nothing")),
      launched_(Plain(*registry_, "fleet_autoscaler_workers_launched_total", "Workers started")),
      retired_(Plain(*registry_, "fleet_autoscaler_workers_retired_total",
                     "Workers retired through the broker")),
      retire_refused_(Plain(*registry_, "fleet_autoscaler_retire_refused_total",
                            "retire-if-idle refused by the broker (the worker became busy)")) {
  // The acting decisions exist at 0 from the start, so increase() and the
  // dashboard count the first scale-up of a run too.
  for (const auto& [action, reason] : {std::pair<const char*, const char*>{"scale_up", "demand"},
                                       {"scale_up", "unretire"},
                                       {"scale_down", "idle"}}) {
    decision_series_.emplace(std::make_pair(std::string(action), std::string(reason)),
                             &decisions_.Add({{"action", action}, {"reason", reason}}));
  }
  if (!bind_address.empty()) served_ = ServeMetrics(bind_address, registry_, auth);
}

void AutoscalerMetrics::Decision(const std::string& action, const std::string& reason) {
  auto key = std::make_pair(action, reason);
  auto it = decision_series_.find(key);
  if (it == decision_series_.end()) {
    it = decision_series_
             .emplace(key, &decisions_.Add({{"action", action}, {"reason", reason}}))
             .first;
  }
  it->second->Increment();
}

}  // namespace fleet::autoscaler

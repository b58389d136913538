// The autoscaler's own Prometheus metrics: its decision, the pool as it
// sees it, decisions by action and reason, start failures, metric-source
// errors and timeouts. Registered once; the loop only sets and increments.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/metrics_server.h"

namespace fleet::autoscaler {

class AutoscalerMetrics {
 public:
  // Serves /metrics on `bind_address` unless it is empty, behind basic auth
  // when `auth` is set. Throws std::invalid_argument on a bad address,
  // std::runtime_error naming it when it cannot bind.
  explicit AutoscalerMetrics(const std::string& bind_address,
                             const std::optional<BasicAuth>& auth = std::nullopt);

  void SetDesired(int desired) { desired_.Set(desired); }
  void SetPool(int starting, int running, int retiring) {
    starting_.Set(starting);
    running_.Set(running);
    retiring_.Set(retiring);
  }
  void Decision(const std::string& action, const std::string& reason);
  void StartFailure() { start_failures_.Increment(); }
  void SourceError() { source_errors_.Increment(); }
  // A read that ran into --metrics-timeout (counted in SourceError too).
  void SourceTimeout() { source_timeouts_.Increment(); }
  void Launched() { launched_.Increment(); }
  void Retired() { retired_.Increment(); }
  void RetireRefused() { retire_refused_.Increment(); }
  // http://HOST:PORT/metrics, or "" when not served.
  const std::string& url() const { return served_.url(); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge& desired_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Gauge& starting_;
  prometheus::Gauge& running_;
  prometheus::Gauge& retiring_;
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Counter& start_failures_;
  prometheus::Counter& source_errors_;
  prometheus::Counter& source_timeouts_;
  prometheus::Counter& launched_;
  prometheus::Counter& retired_;
  prometheus::Counter& retire_refused_;
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> decision_series_;
  MetricsServer served_;
};

}  // namespace fleet::autoscaler

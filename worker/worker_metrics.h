// WorkerMetrics: fleet-worker's own Prometheus metrics, served when
// --metrics is given: batches processed by outcome, busy and total slots,
// handler time. Registered once; the worker loop only increments and sets.
// The exposer's threads read prometheus-cpp's atomics (the histogram takes
// its own short lock).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <optional>
#include <string>

#include "common/metrics_server.h"

namespace fleet::worker {

class WorkerMetrics {
 public:
  // Serves /metrics on `bind_address` ("0.0.0.0:9752", "127.0.0.1:0"),
  // behind basic auth when `auth` is set. Throws std::invalid_argument on a
  // bad address, std::runtime_error naming it when it cannot bind.
  WorkerMetrics(const std::string& bind_address, int slots,
                const std::optional<BasicAuth>& auth = std::nullopt);

  void OnCompleted(bool ok, double seconds) {
    (ok ? processed_ok_ : processed_failed_).Increment();
    handler_seconds_.Observe(seconds);
  }
  void SetBusy(std::uint32_t held) { busy_.Set(static_cast<double>(held)); }
  // Object data passed to a handler; an OBJECT_DATA no handler waited for.
  void OnObjectBytes(std::size_t n) { object_bytes_.Increment(static_cast<double>(n)); }
  void OnObjectDataDropped() { object_dropped_.Increment(); }
  // http://HOST:PORT/metrics as bound.
  const std::string& url() const { return served_.url(); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& processed_ok_;
  prometheus::Counter& processed_failed_;
  prometheus::Gauge& busy_;
  prometheus::Gauge& slots_;
  prometheus::Histogram& handler_seconds_;
  prometheus::Counter& object_bytes_;
  prometheus::Counter& object_dropped_;
  MetricsServer served_;
};

}  // namespace fleet::worker

#include "worker/worker_metrics.h"

#include <prometheus/family.h>


#include "common/histogram.h"

namespace fleet::worker {
namespace {

std::shared_ptr<prometheus::Registry> NewRegistry() {
  return std::make_shared<prometheus::Registry>();
}

prometheus::Family<prometheus::Counter>& Processed(prometheus::Registry& r) {
  return prometheus::BuildCounter()
      .Name("fleet_worker_batches_processed_total")
      .Help("Batches this worker ran, by outcome")
      .Register(r);
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& bind_address, int slots,
                             const std::optional<BasicAuth>& auth)
    : registry_(NewRegistry()),
      processed_ok_(Processed(*registry_).Add({{"outcome", "ok"}})),
      processed_failed_(Processed(*registry_).Add({{"outcome", "failed"}})),
      busy_(prometheus::BuildGauge()
                .Name("fleet_worker_busy_slots")
                .Help("Batches the worker holds now, running or waiting for a slot")
                .Register(*registry_)
                .Add({})),
      slots_(prometheus::BuildGauge()
                 .Name("fleet_worker_slots")
                 .Help("Slots in total (--concurrency)")
                 .Register(*registry_)
                 .Add({})),
      handler_seconds_(prometheus::BuildHistogram()
                           .Name("fleet_worker_handler_seconds")
                           .Help("Time the handler took per batch")
                           .Register(*registry_)
                           .Add({}, LatencyBuckets())),
      object_bytes_(prometheus::BuildCounter()
                        .Name("fleet_worker_object_bytes_total")
                        .Help("Object bytes passed to the handlers (OBJECT_DATA)")
                        .Register(*registry_)
                        .Add({})),
      object_dropped_(prometheus::BuildCounter()
                          .Name("fleet_worker_object_data_dropped_total")
                          .Help("OBJECT_DATA answering no request that was out")
                          .Register(*registry_)
                          .Add({})) {
  slots_.Set(slots);
  served_ = ServeMetrics(bind_address, registry_, auth);
}

}  // namespace fleet::worker

#include "worker/worker_metrics.h"

#include <prometheus/family.h>

#include <stdexcept>

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

WorkerMetrics::WorkerMetrics(const std::string& bind_address, int slots)
    : registry_(NewRegistry()),
      processed_ok_(Processed(*registry_).Add({{"outcome", "ok"}})),
      processed_failed_(Processed(*registry_).Add({{"outcome", "failed"}})),
      busy_(prometheus::BuildGauge()
                .Name("fleet_worker_busy_slots")
                .Help("Slots running a batch now")
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
                           .Add({}, LatencyBuckets())) {
  slots_.Set(slots);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(bind_address);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot serve metrics on " + bind_address + ": " + e.what());
  }
  exposer_->RegisterCollectable(registry_);
  std::string host = bind_address.substr(0, bind_address.rfind(':'));
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  auto ports = exposer_->GetListeningPorts();
  url_ = "http://" + host + ":" + std::to_string(ports.empty() ? 0 : ports[0]) + "/metrics";
}

}  // namespace fleet::worker

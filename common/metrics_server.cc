#include "common/metrics_server.h"

#include <stdexcept>

namespace fleet {

MetricsServer ServeMetrics(const std::string& bind_address,
                           std::shared_ptr<prometheus::Registry> registry) {
  MetricsServer s;
  try {
    s.exposer = std::make_unique<prometheus::Exposer>(bind_address);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot serve metrics on " + bind_address + ": " + e.what());
  }
  s.exposer->RegisterCollectable(registry);
  std::string host = bind_address.substr(0, bind_address.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  auto ports = s.exposer->GetListeningPorts();
  s.url = "http://" + host + ":" + (ports.empty() ? std::string("0") : std::to_string(ports[0])) +
          "/metrics";
  return s;
}

}  // namespace fleet

// Serving a prometheus-cpp registry on /metrics, shared by every program.
#pragma once

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace fleet {

struct MetricsServer {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string url;  // http://HOST:PORT/metrics as bound (port 0 resolved)
};

// Serves `registry` on `bind_address` ("0.0.0.0:9750", "127.0.0.1:0").
// Throws std::runtime_error naming the address when it cannot bind.
MetricsServer ServeMetrics(const std::string& bind_address,
                           std::shared_ptr<prometheus::Registry> registry);

}  // namespace fleet

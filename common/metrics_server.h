// Serving a prometheus-cpp registry on /metrics, shared by every program:
// the bind address (--metrics ADDRESS:PORT), optional HTTP basic auth
// (--metrics-auth-file FILE), and nothing but GET /metrics: every other
// path is answered 404 before any handler or auth check runs.
#pragma once

#include <CLI/CLI.hpp>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <memory>
#include <optional>
#include <string>

#include "common/basic_auth.h"

namespace fleet {

// A running /metrics page. Stops on destruction, within milliseconds: the
// embedded civetweb server checks for a stop only between polls of its
// listening socket, which wait up to 2 s (measured: 1.3 s on average for
// every program with --metrics to exit, enough for a restart at once to
// find the port still taken). Stop() first shuts the listening socket
// down, which ends that poll at once. Move-only.
class MetricsServer {
 public:
  MetricsServer() = default;
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string url, int listen_fd);
  MetricsServer(MetricsServer&& other) noexcept;
  MetricsServer& operator=(MetricsServer&& other) noexcept;
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer() { Stop(); }

  // Stops serving and frees the port; a no-op when not serving.
  void Stop();
  bool serving() const { return exposer_ != nullptr; }
  prometheus::Exposer* exposer() const { return exposer_.get(); }
  const std::string& url() const { return url_; }  // http://HOST:PORT/metrics as bound

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string url_;
  int listen_fd_ = -1;  // civetweb's listening socket (civetweb closes it), or -1
};

// Checks that `bind_address` is ADDRESS:PORT with a numeric address
// (0.0.0.0:9750, 127.0.0.1:0, [::]:9750, [::1]:9750) and a port 0..65535.
// CheckListenAddress (common/endpoint.h) under the name --metrics.
// Throws std::invalid_argument saying what is wrong, with examples; a host
// alone ("127.0.0.1") or a port alone is refused rather than guessed.
void CheckMetricsAddress(const std::string& bind_address);

// Serves `registry` on `bind_address` (checked as above); with `auth`, a
// request without those credentials gets 401. Requests are not logged.
// Throws std::invalid_argument on a bad address and std::runtime_error
// naming the address when it cannot bind.
MetricsServer ServeMetrics(const std::string& bind_address,
                           std::shared_ptr<prometheus::Registry> registry,
                           const std::optional<BasicAuth>& auth = std::nullopt);

// Adds --metrics-auth-file to a program that serves /metrics.
void AddMetricsAuthFlag(CLI::App& app, std::string* auth_file);

// The flags of a program that serves /metrics, checked before it starts:
// the address (unless empty: off) and the credentials of `auth_file` (unless
// empty). Throws std::invalid_argument or std::runtime_error with a message
// naming the flag and the file; the caller exits 2.
std::optional<BasicAuth> LoadMetricsFlags(const std::string& bind_address,
                                          const std::string& auth_file);

}  // namespace fleet

#include "common/metrics_server.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <civetweb.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "common/endpoint.h"

// "Nothing else served": civetweb hands a request for /metrics/anything to
// the /metrics handler too (prefix match), and its own fallbacks answer the
// rest. A begin_request callback sees every request first and answers 404
// to any path but exactly /metrics, so the served surface is that one page
// whatever civetweb's matching rules are. It runs before the auth check,
// which is fine: a 404 says nothing about the credentials.
//
// The address is checked here rather than left to civetweb, which reads
// "127.0.0.1" as port 127 followed by junk and fails with "null context",
// and reads "9750" as every interface.
//
// Rejected: comparing credentials inside begin_request (a second auth path
// next to prometheus-cpp's RegisterAuth, which already answers 401 with a
// WWW-Authenticate header).

namespace fleet {
namespace {

int AnswerOnlyMetrics(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri != nullptr && ri->local_uri != nullptr && std::strcmp(ri->local_uri, "/metrics") == 0) {
    return 0;  // civetweb goes on: auth, then the metrics handler
  }
  mg_send_http_error(conn, 404, "%s", "Not Found: only /metrics is served here\n");
  return 404;
}

// The listening TCP socket of this process bound to `host`:`port` (host as
// in --metrics: numeric, IPv6 without brackets), or -1. The Exposer does
// not expose civetweb's descriptor; a scan of a few hundred getsockopt
// calls, once at start, finds it. The address counts too: a ZeroMQ
// endpoint may listen on the same port of another address.
int FindListeningSocket(const std::string& host, int port) {
  in_addr want4{};
  in6_addr want6{};
  const bool v4 = inet_pton(AF_INET, host.c_str(), &want4) == 1;
  const bool v6 = !v4 && inet_pton(AF_INET6, host.c_str(), &want6) == 1;
  for (int fd = 0; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) {
      continue;
    }
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) continue;
    if (addr.ss_family == AF_INET && v4) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      if (ntohs(a->sin_port) == port && a->sin_addr.s_addr == want4.s_addr) return fd;
    } else if (addr.ss_family == AF_INET6 && v6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      if (ntohs(a->sin6_port) == port && std::memcmp(&a->sin6_addr, &want6, sizeof want6) == 0) {
        return fd;
      }
    }
  }
  return -1;
}

}  // namespace

void CheckMetricsAddress(const std::string& a) { CheckListenAddress("--metrics", a); }

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string url,
                             int listen_fd)
    : exposer_(std::move(exposer)), url_(std::move(url)), listen_fd_(listen_fd) {}

MetricsServer::MetricsServer(MetricsServer&& other) noexcept
    : exposer_(std::move(other.exposer_)),
      url_(std::move(other.url_)),
      listen_fd_(std::exchange(other.listen_fd_, -1)) {}

MetricsServer& MetricsServer::operator=(MetricsServer&& other) noexcept {
  if (this != &other) {
    Stop();
    exposer_ = std::move(other.exposer_);
    url_ = std::move(other.url_);
    listen_fd_ = std::exchange(other.listen_fd_, -1);
  }
  return *this;
}

void MetricsServer::Stop() {
  if (exposer_ == nullptr) return;
  // Wakes civetweb's poll of this socket (Linux reports a shut-down
  // listening socket as hung up), so the stop below does not wait out its
  // 2 s poll. civetweb still owns and closes the descriptor.
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  listen_fd_ = -1;
  exposer_.reset();
}

MetricsServer ServeMetrics(const std::string& bind_address,
                           std::shared_ptr<prometheus::Registry> registry,
                           const std::optional<BasicAuth>& auth) {
  CheckMetricsAddress(bind_address);
  std::unique_ptr<prometheus::Exposer> exposer;
  CivetCallbacks callbacks;  // copied by the server
  callbacks.begin_request = &AnswerOnlyMetrics;
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind_address, 2, &callbacks);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot serve metrics on " + bind_address + ": " + e.what() +
                             " (is the port in use, or the address not one of this host's?)");
  }
  // Auth before the registry: the /metrics endpoint exists from the first
  // call on, and until RegisterAuth it would serve whatever it holds openly.
  if (auth) {
    // The callback runs on the exposer's threads and only reads `creds`.
    exposer->RegisterAuth(
        [creds = *auth](const std::string& user, const std::string& password) {
          return creds.Matches(user, password);
        },
        "fleet metrics");
  }
  exposer->RegisterCollectable(registry);
  std::string host = bind_address.substr(0, bind_address.rfind(':'));
  std::string bound_host = host;
  if (bound_host.size() > 2 && bound_host.front() == '[') {
    bound_host = bound_host.substr(1, bound_host.size() - 2);
  }
  if (host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  auto ports = exposer->GetListeningPorts();
  const int port = ports.empty() ? 0 : ports[0];
  std::string url = "http://" + host + ":" + std::to_string(port) + "/metrics";
  const int fd = port > 0 ? FindListeningSocket(bound_host, port) : -1;
  return MetricsServer(std::move(exposer), std::move(url), fd);
}

void AddMetricsAuthFlag(CLI::App& app, std::string* auth_file) {
  app.add_option("--metrics-auth-file", *auth_file,
                 "HTTP basic auth on /metrics: a file holding one line user:password, "
                 "mode 0600 or 0400 (never a password on the command line); without it "
                 "/metrics is open to whoever reaches the port");
}

std::optional<BasicAuth> LoadMetricsFlags(const std::string& bind_address,
                                          const std::string& auth_file) {
  if (!bind_address.empty()) CheckMetricsAddress(bind_address);
  if (auth_file.empty()) return std::nullopt;
  if (bind_address.empty()) {
    throw std::invalid_argument("--metrics-auth-file is set but --metrics is off");
  }
  try {
    return ReadBasicAuthFile(auth_file);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--metrics-auth-file: ") + e.what());
  }
}

}  // namespace fleet

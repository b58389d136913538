#include "common/metrics_server.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <civetweb.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

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

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

void CheckMetricsAddress(const std::string& a) {
  auto bad = [&a](const std::string& why) {
    throw std::invalid_argument(
        "--metrics '" + a + "': " + why +
        "; want ADDRESS:PORT with a numeric address: 0.0.0.0:9750 (every interface), "
        "127.0.0.1:9750 (this host only), [::]:9750 or [::1]:9750; port 0 picks a free one");
  };
  std::string host, port;
  if (!a.empty() && a[0] == '[') {
    const auto close = a.find(']');
    if (close == std::string::npos || a.compare(close + 1, 1, ":") != 0) {
      bad("no port after the IPv6 address");
    }
    host = a.substr(1, close - 1);
    port = a.substr(close + 2);
    in6_addr v6{};
    if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) bad("'" + host + "' is not an IPv6 address");
  } else {
    const auto colon = a.rfind(':');
    if (colon == std::string::npos) bad(AllDigits(a) ? "a port alone" : "no port");
    host = a.substr(0, colon);
    port = a.substr(colon + 1);
    in_addr v4{};
    if (host.empty()) bad("no address");
    if (inet_pton(AF_INET, host.c_str(), &v4) != 1) {
      bad("'" + host + "' is not an IPv4 address (an IPv6 one goes in brackets)");
    }
  }
  if (!AllDigits(port) || port.size() > 5 || std::stoul(port) > 65535) {
    bad("'" + port + "' is not a port (0..65535)");
  }
}

MetricsServer ServeMetrics(const std::string& bind_address,
                           std::shared_ptr<prometheus::Registry> registry,
                           const std::optional<BasicAuth>& auth) {
  CheckMetricsAddress(bind_address);
  MetricsServer s;
  CivetCallbacks callbacks;  // copied by the server
  callbacks.begin_request = &AnswerOnlyMetrics;
  try {
    s.exposer = std::make_unique<prometheus::Exposer>(bind_address, 2, &callbacks);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot serve metrics on " + bind_address + ": " + e.what() +
                             " (is the port in use, or the address not one of this host's?)");
  }
  // Auth before the registry: the /metrics endpoint exists from the first
  // call on, and until RegisterAuth it would serve whatever it holds openly.
  if (auth) {
    // The callback runs on the exposer's threads and only reads `creds`.
    s.exposer->RegisterAuth(
        [creds = *auth](const std::string& user, const std::string& password) {
          return creds.Matches(user, password);
        },
        "fleet metrics");
  }
  s.exposer->RegisterCollectable(registry);
  std::string host = bind_address.substr(0, bind_address.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  auto ports = s.exposer->GetListeningPorts();
  s.url = "http://" + host + ":" + (ports.empty() ? std::string("0") : std::to_string(ports[0])) +
          "/metrics";
  return s;
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

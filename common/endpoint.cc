#include "common/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

// Why not leave this to libzmq: it binds tcp://*:99999 (the port wraps to
// one it picks), reports a malformed connect only as "Invalid argument",
// and accepts tcp://:5555 as every interface. A check before the first
// socket gives one message with the flag and the value instead.

namespace fleet {
namespace {

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A port of 0..65535 in decimal; false for anything else (signs, spaces,
// more than five digits).
bool ParsePort(const std::string& s, unsigned* port) {
  if (!AllDigits(s) || s.size() > 5) return false;
  *port = static_cast<unsigned>(std::stoul(s));
  return *port <= 65535;
}

bool HostChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' || c == '_';
}

}  // namespace

void CheckEndpoint(const std::string& flag, const std::string& endpoint, EndpointUse use) {
  const bool bind = use == EndpointUse::kBind;
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument(
        flag + " '" + endpoint + "': " + why + "; want tcp://HOST:PORT or ipc://PATH, e.g. " +
        (bind ? "tcp://*:5555 (every interface), tcp://127.0.0.1:5555, tcp://*:* (a free port)"
              : "tcp://127.0.0.1:5555, tcp://broker.example:5555, tcp://[::1]:5555"));
  };
  if (endpoint.empty()) bad("empty");
  const auto sep = endpoint.find("://");
  if (sep == std::string::npos) bad("no scheme (tcp:// or ipc://)");
  const std::string scheme = endpoint.substr(0, sep);
  const std::string rest = endpoint.substr(sep + 3);
  if (scheme == "ipc") {
    if (rest.empty()) bad("no path after ipc://");
    if (rest == "*" && !bind) bad("ipc://* only names a path to bind, not one to connect to");
    return;
  }
  if (scheme == "inproc") {
    bad("inproc:// reaches only sockets in the same process, never another fleet program");
  }
  if (scheme != "tcp") bad("unsupported scheme '" + scheme + "://'");

  std::string host, port;
  if (!rest.empty() && rest[0] == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos || rest.compare(close + 1, 1, ":") != 0) {
      bad("no port after the IPv6 address (tcp://[ADDRESS]:PORT)");
    }
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
    in6_addr v6{};
    if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) bad("'" + host + "' is not an IPv6 address");
  } else {
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos) bad("no port (tcp://HOST:PORT)");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.empty()) bad("no host before the port" + std::string(bind ? " (* for every interface)" : ""));
    if (host == "*") {
      if (!bind) bad("* is not a host to connect to (the broker's address, e.g. 127.0.0.1)");
    } else if (host.find(':') != std::string::npos) {
      bad("'" + host + "' is not a host (an IPv6 address goes in brackets: tcp://[::1]:PORT)");
    } else if (!std::all_of(host.begin(), host.end(), HostChar)) {
      bad("'" + host + "' is not a host name or address");
    }
  }
  if (bind && (port == "*" || port == "0")) return;
  unsigned n = 0;
  if (!ParsePort(port, &n) || n == 0) {
    bad(port.empty() ? std::string("no port after the host")
                     : "port '" + port + "' is out of range (1..65535" +
                           (bind ? ", or * or 0 for a free one)" : ")"));
  }
}

void CheckListenAddress(const std::string& flag, const std::string& a) {
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument(
        flag + " '" + a + "': " + why +
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
  unsigned n = 0;
  if (!ParsePort(port, &n)) bad("'" + port + "' is not a port (0..65535)");
}

}  // namespace fleet

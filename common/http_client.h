// A small HTTP client on libcurl: scraping /metrics, the Prometheus HTTP API,
// and the Docker Engine API over its unix socket.
//
// HttpClient owns one curl easy handle, so consecutive requests on the same
// object reuse open connections. It is move-only and not thread-safe: use one
// object per thread. Network failures never throw; they come back in
// HttpResponse::error. Proxy settings from the environment (http_proxy,
// all_proxy, ...) are ignored, so a request goes exactly where its URL says.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fleet::http {

enum class Method { kGet, kPost, kPut, kDelete };

struct HttpOptions {
  // Extra request headers, each "Name: value". A non-empty body gets
  // "Content-Type: application/json" unless one is given here.
  std::vector<std::string> headers;
  // Connect through this unix socket instead of TCP (the URL's host is then
  // only sent as the Host header), e.g. "/var/run/docker.sock".
  std::string unix_socket_path;
  // HTTPS: the CA to verify the server with instead of the system's, and a
  // client certificate and key (PEM files), e.g. a TLS Docker engine's.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // HTTP basic auth when username is non-empty.
  std::string username;
  std::string password;
  // The response body is refused past this many bytes (the transfer is
  // aborted and error set); 1 byte..1 GiB.
  std::size_t max_body_bytes = 16u << 20;
};

struct HttpResponse {
  long status = 0;    // HTTP status; 0 when no response arrived
  std::string body;   // empty when error is set
  std::string error;  // empty when a complete response arrived (any status)

  // A complete response with a 2xx status.
  bool ok() const { return error.empty() && status >= 200 && status < 300; }
};

class HttpClient {
 public:
  // Throws std::runtime_error if libcurl cannot be initialised (a setup
  // error, not a network one).
  HttpClient();
  ~HttpClient();
  HttpClient(HttpClient&& other) noexcept;
  HttpClient& operator=(HttpClient&& other) noexcept;
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs one request and waits for the whole response, at most
  // `timeout` in total (connect included; a non-positive timeout counts as
  // 1 ms). Requires an http:// or https:// URL; redirects are not followed.
  // Never throws: failures (refused, timed out, body over the limit, a
  // moved-from client, ...) set error and leave status 0 unless a status
  // line had arrived.
  HttpResponse Perform(Method method, const std::string& url, std::string_view body,
                       std::chrono::milliseconds timeout, const HttpOptions& options = {});

  HttpResponse Get(const std::string& url, std::chrono::milliseconds timeout,
                   const HttpOptions& options = {}) {
    return Perform(Method::kGet, url, {}, timeout, options);
  }
  HttpResponse Post(const std::string& url, std::string_view body,
                    std::chrono::milliseconds timeout, const HttpOptions& options = {}) {
    return Perform(Method::kPost, url, body, timeout, options);
  }
  HttpResponse Delete(const std::string& url, std::chrono::milliseconds timeout,
                      const HttpOptions& options = {}) {
    return Perform(Method::kDelete, url, {}, timeout, options);
  }

 private:
  struct Handle;
  std::unique_ptr<Handle> handle_;
};

// Percent-encodes `s` for a URL query or path segment: everything but
// A-Z a-z 0-9 - . _ ~ becomes %XX.
std::string UrlEncode(std::string_view s);

}  // namespace fleet::http

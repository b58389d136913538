#include "common/http_client.h"

#include <curl/curl.h>

#include <exception>
#include <mutex>
#include <stdexcept>

// Each request starts with curl_easy_reset, which clears every option but
// keeps the handle's connection cache, so options from one request never leak
// into the next while keep-alive connections are still reused. Rejected: a
// fresh easy handle per request (a new TCP connection per scrape) and a
// curl_share across clients (needs locking, and one client per thread is
// enough for one loop per process).
//
// The body limit is enforced twice: CURLOPT_MAXFILESIZE refuses an announced
// Content-Length before any byte is read, and the write callback aborts a
// chunked or lying body as soon as it crosses the limit.

namespace fleet::http {
namespace {

std::once_flag g_curl_init_once;
CURLcode g_curl_init_result = CURLE_OK;

struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
using Slist = std::unique_ptr<curl_slist, SlistDeleter>;

struct WriteState {
  std::string* body;
  std::size_t limit;
  bool over_limit = false;
  bool out_of_memory = false;
};

// A C callback: must not throw. Returning less than asked aborts the
// transfer with CURLE_WRITE_ERROR.
std::size_t WriteBody(char* data, std::size_t size, std::size_t n, void* user) {
  auto* state = static_cast<WriteState*>(user);
  std::size_t bytes = size * n;
  if (bytes > state->limit - state->body->size()) {
    state->over_limit = true;
    return 0;
  }
  try {
    state->body->append(data, bytes);
  } catch (...) {
    state->out_of_memory = true;
    return 0;
  }
  return bytes;
}

bool HasHeader(const std::vector<std::string>& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (h.size() <= name.size() || h[name.size()] != ':') continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i) {
      char a = h[i], b = name[i];
      if (a >= 'A' && a <= 'Z') a = static_cast<char>(a - 'A' + 'a');
      if (b >= 'A' && b <= 'Z') b = static_cast<char>(b - 'A' + 'a');
      same = a == b;
    }
    if (same) return true;
  }
  return false;
}

}  // namespace

struct HttpClient::Handle {
  CURL* curl = nullptr;
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

HttpClient::HttpClient() {
  std::call_once(g_curl_init_once,
                 [] { g_curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (g_curl_init_result != CURLE_OK) {
    throw std::runtime_error(std::string("curl_global_init failed: ") +
                             curl_easy_strerror(g_curl_init_result));
  }
  handle_ = std::make_unique<Handle>();
  handle_->curl = curl_easy_init();
  if (handle_->curl == nullptr) throw std::runtime_error("curl_easy_init failed");
}

HttpClient::~HttpClient() = default;
HttpClient::HttpClient(HttpClient&& other) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&& other) noexcept = default;

HttpResponse HttpClient::Perform(Method method, const std::string& url, std::string_view body,
                                 std::chrono::milliseconds timeout, const HttpOptions& options) {
  HttpResponse response;
  if (!handle_ || handle_->curl == nullptr) {
    response.error = "HttpClient used after move";
    return response;
  }
  try {
    CURL* curl = handle_->curl;
    curl_easy_reset(curl);
    char error_buffer[CURL_ERROR_SIZE] = {};
    WriteState state{&response.body, options.max_body_bytes};
    long timeout_ms = timeout.count() > 0 ? static_cast<long>(timeout.count()) : 1L;

    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS, long{CURLPROTO_HTTP | CURLPROTO_HTTPS});
#endif
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM; other threads run
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_PROXY, "");
    curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &state);
    curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE,
                     static_cast<curl_off_t>(options.max_body_bytes));
    if (!options.unix_socket_path.empty()) {
      curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, options.unix_socket_path.c_str());
    }
    if (!options.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options.ca_file.c_str());
    if (!options.cert_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT, options.cert_file.c_str());
    }
    if (!options.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, options.key_file.c_str());
    if (!options.username.empty()) {
      curl_easy_setopt(curl, CURLOPT_HTTPAUTH, long{CURLAUTH_BASIC});
      curl_easy_setopt(curl, CURLOPT_USERNAME, options.username.c_str());
      curl_easy_setopt(curl, CURLOPT_PASSWORD, options.password.c_str());
    }

    switch (method) {
      case Method::kGet:
        curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
        break;
      case Method::kPost:
      case Method::kPut:
      case Method::kDelete:
        // POSTFIELDS with an explicit size sends the body as is (no copy, no
        // strlen) and a Content-Length, even 0, which the Docker API wants.
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
        if (method == Method::kPut) curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
        if (method == Method::kDelete) curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "DELETE");
        break;
    }

    Slist headers;
    auto add_header = [&headers](const char* h) {
      curl_slist* next = curl_slist_append(headers.get(), h);
      if (next == nullptr) throw std::bad_alloc();
      headers.release();
      headers.reset(next);
    };
    for (const auto& h : options.headers) add_header(h.c_str());
    if (!body.empty() && !HasHeader(options.headers, "Content-Type")) {
      add_header("Content-Type: application/json");
    }
    // Without this, curl waits up to a second for "100 Continue" before
    // sending a large body.
    if (method != Method::kGet && !HasHeader(options.headers, "Expect")) add_header("Expect:");
    if (headers) curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());

    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    // The options point into locals (error_buffer, state, headers): clear
    // them before those go out of scope, keeping the connection cache.
    curl_easy_reset(curl);

    response.status = status;
    if (rc == CURLE_OK) return response;
    response.body.clear();
    if (state.over_limit || rc == CURLE_FILESIZE_EXCEEDED) {
      response.error =
          "response body over the limit of " + std::to_string(options.max_body_bytes) + " bytes";
    } else if (state.out_of_memory) {
      response.error = "out of memory reading the response body";
    } else {
      response.error = curl_easy_strerror(rc);
      if (error_buffer[0] != '\0') response.error += std::string(": ") + error_buffer;
    }
  } catch (const std::exception& e) {
    curl_easy_reset(handle_->curl);  // drop pointers into this frame
    response.body.clear();
    response.error = std::string("request failed: ") + e.what();
  }
  return response;
}

std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace fleet::http

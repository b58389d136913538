#include "common/http_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fleet::http {
namespace {

using std::chrono::milliseconds;

struct Request {
  std::string method;
  std::string target;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

// Raw bytes to send back, or nothing: the server then holds the connection
// open without a word until it stops.
using Responder = std::function<std::optional<std::string>(const Request&)>;

std::string Reply(int status, const std::string& body, const std::string& extra_headers = "") {
  return "HTTP/1.1 " + std::to_string(status) +
         " Whatever\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nContent-Type: text/plain\r\n" + extra_headers + "\r\n" + body;
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A one-thread HTTP/1.1 server on 127.0.0.1:0 (or a unix socket) for tests:
// keep-alive, Content-Length request bodies, canned answers. The thread
// waits in poll() on its sockets and a wake pipe, so stopping is immediate.
class TestServer {
 public:
  explicit TestServer(Responder responder, const std::string& unix_path = "")
      : responder_(std::move(responder)) {
    if (pipe(wake_) != 0) throw std::runtime_error("pipe");
    if (unix_path.empty()) {
      listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = 0;
      if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        throw std::runtime_error("bind");
      }
      socklen_t len = sizeof(addr);
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
      url_ = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    } else {
      listen_fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, unix_path.c_str(), sizeof(addr.sun_path) - 1);
      if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        throw std::runtime_error("bind unix");
      }
      url_ = "http://localhost";
    }
    if (listen(listen_fd_, 16) != 0) throw std::runtime_error("listen");
    thread_ = std::thread([this] { Run(); });
  }

  ~TestServer() {
    char c = 'x';
    (void)!write(wake_[1], &c, 1);
    thread_.join();
    for (const auto& conn : conns_) close(conn.fd);
    close(listen_fd_);
    close(wake_[0]);
    close(wake_[1]);
  }

  const std::string& url() const { return url_; }
  std::vector<Request> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int connections() const { return accepted_.load(); }

 private:
  struct Conn {
    int fd;
    std::string in;
  };

  void Run() {
    for (;;) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (const auto& conn : conns_) fds.push_back({conn.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) {
        int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd >= 0) {
          conns_.push_back({fd, {}});
          ++accepted_;
        }
      }
      // Connections accepted just now were not polled; fds[2 + i] is conns_[i].
      for (std::size_t i = 0; i + 2 < fds.size(); ++i) {
        if (fds[i + 2].revents == 0) continue;
        if (!Serve(conns_[i])) {
          close(conns_[i].fd);
          conns_[i].fd = -1;
        }
      }
      std::erase_if(conns_, [](const Conn& c) { return c.fd < 0; });
    }
  }

  // Reads what arrived and answers every complete request; false to close.
  bool Serve(Conn& conn) {
    char buf[65536];
    ssize_t n = recv(conn.fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    conn.in.append(buf, static_cast<std::size_t>(n));
    for (;;) {
      std::size_t head_end = conn.in.find("\r\n\r\n");
      if (head_end == std::string::npos) return true;
      Request req;
      std::size_t line_end = conn.in.find("\r\n");
      std::string request_line = conn.in.substr(0, line_end);
      std::size_t sp1 = request_line.find(' ');
      std::size_t sp2 = request_line.find(' ', sp1 + 1);
      req.method = request_line.substr(0, sp1);
      req.target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
      std::size_t pos = line_end + 2;
      while (pos < head_end) {
        std::size_t eol = conn.in.find("\r\n", pos);
        std::string line = conn.in.substr(pos, eol - pos);
        std::size_t colon = line.find(':');
        std::size_t value = line.find_first_not_of(' ', colon + 1);
        req.headers[Lower(line.substr(0, colon))] =
            value == std::string::npos ? "" : line.substr(value);
        pos = eol + 2;
      }
      std::size_t length = 0;
      if (auto it = req.headers.find("content-length"); it != req.headers.end()) {
        length = std::stoul(it->second);
      }
      if (conn.in.size() < head_end + 4 + length) return true;
      req.body = conn.in.substr(head_end + 4, length);
      conn.in.erase(0, head_end + 4 + length);
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(req);
      }
      std::optional<std::string> answer = responder_(req);
      if (!answer) continue;  // never answer; keep the connection open
      std::size_t sent = 0;
      while (sent < answer->size()) {
        ssize_t w = send(conn.fd, answer->data() + sent, answer->size() - sent, MSG_NOSIGNAL);
        if (w <= 0) return false;  // the client gave up (e.g. body over its limit)
        sent += static_cast<std::size_t>(w);
      }
      if (answer->find("Connection: close\r\n") != std::string::npos) return false;
    }
  }

  Responder responder_;
  int wake_[2] = {-1, -1};
  int listen_fd_ = -1;
  std::string url_;
  std::thread thread_;
  std::vector<Conn> conns_;  // only the server thread touches these
  std::atomic<int> accepted_{0};
  mutable std::mutex mu_;
  std::vector<Request> requests_;
};

constexpr milliseconds kTimeout{10000};  // generous: only a hang would reach it

TEST(HttpClientTest, GetReturnsStatusAndBody) {
  TestServer server([](const Request&) { return Reply(200, "fleet_queue_depth 3\n"); });
  HttpClient client;
  HttpResponse r = client.Get(server.url() + "/metrics", kTimeout);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "fleet_queue_depth 3\n");
  EXPECT_EQ(r.error, "");
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "GET");
  EXPECT_EQ(requests[0].target, "/metrics");
  EXPECT_EQ(requests[0].headers.count("authorization"), 0u);
}

TEST(HttpClientTest, ReturnsServerErrorStatusAndBodyWithoutError) {
  TestServer server([](const Request&) { return Reply(500, "boom"); });
  HttpClient client;
  HttpResponse r = client.Get(server.url() + "/", kTimeout);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.body, "boom");
  EXPECT_EQ(r.error, "");
}

TEST(HttpClientTest, ReusesTheConnectionAcrossRequests) {
  int n = 0;
  TestServer server([&n](const Request&) { return Reply(200, std::to_string(++n)); });
  HttpClient client;
  EXPECT_EQ(client.Get(server.url() + "/a", kTimeout).body, "1");
  EXPECT_EQ(client.Get(server.url() + "/b", kTimeout).body, "2");
  HttpResponse third = client.Post(server.url() + "/c", "{}", kTimeout);
  EXPECT_EQ(third.body, "3");
  EXPECT_EQ(server.requests().size(), 3u);
  EXPECT_EQ(server.connections(), 1);
}

TEST(HttpClientTest, TimesOutWhenTheServerNeverAnswers) {
  TestServer server([](const Request&) { return std::nullopt; });
  HttpClient client;
  HttpResponse r = client.Get(server.url() + "/slow", milliseconds(200));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(r.body.empty());
  EXPECT_NE(r.error.find("Timeout"), std::string::npos) << r.error;
}

TEST(HttpClientTest, RefusesAnnouncedBodyOverTheLimit) {
  TestServer server([](const Request&) { return Reply(200, std::string(5000, 'x')); });
  HttpClient client;
  HttpOptions options;
  options.max_body_bytes = 1000;
  HttpResponse r = client.Get(server.url() + "/big", kTimeout, options);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.body.empty());
  EXPECT_NE(r.error.find("over the limit of 1000 bytes"), std::string::npos) << r.error;
  // Exactly at the limit is fine, and the client still works after an abort.
  options.max_body_bytes = 5000;
  r = client.Get(server.url() + "/big", kTimeout, options);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body.size(), 5000u);
}

TEST(HttpClientTest, RefusesChunkedBodyOverTheLimit) {
  // No Content-Length: the limit can only be found while reading. 2 MiB in
  // 64 KiB chunks, so the client aborts mid-stream.
  TestServer server([](const Request&) {
    std::string chunk(65536, 'y');
    std::string out = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 32; ++i) out += "10000\r\n" + chunk + "\r\n";
    out += "0\r\n\r\n";
    return out;
  });
  HttpClient client;
  HttpOptions options;
  options.max_body_bytes = 100000;
  HttpResponse r = client.Get(server.url() + "/stream", kTimeout, options);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.body.empty());
  EXPECT_NE(r.error.find("over the limit"), std::string::npos) << r.error;
  options.max_body_bytes = 32 * 65536;
  r = client.Get(server.url() + "/stream", kTimeout, options);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body.size(), 32u * 65536u);
}

TEST(HttpClientTest, ReportsConnectionRefused) {
  // A bound socket that never listens: connecting to it is refused at once.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  HttpClient client;
  HttpResponse r =
      client.Get("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/", kTimeout);
  close(fd);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.error.empty());
}

TEST(HttpClientTest, RejectsNonHttpUrlsAndGarbage) {
  HttpClient client;
  for (const char* url : {"file:///etc/passwd", "ftp://127.0.0.1/", "not a url", ""}) {
    HttpResponse r = client.Get(url, kTimeout);
    EXPECT_FALSE(r.ok()) << url;
    EXPECT_FALSE(r.error.empty()) << url;
    EXPECT_TRUE(r.body.empty()) << url;
  }
}

TEST(HttpClientTest, ReportsAServerThatIsNotHttp) {
  TestServer server([](const Request&) { return std::string("SSH-2.0-OpenSSH\r\n"); });
  HttpClient client;
  HttpResponse r = client.Get(server.url() + "/", kTimeout);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.error.empty());
}

TEST(HttpClientTest, PostsJsonWithHeadersAndBasicAuth) {
  TestServer server([](const Request&) { return Reply(201, R"({"Id":"abc"})"); });
  HttpClient client;
  HttpOptions options;
  options.headers = {"X-Fleet: 1"};
  options.username = "user";
  options.password = "secret";
  const std::string body = R"({"Image":"fleet-worker","Labels":{"fleet":"1"}})";
  HttpResponse r =
      client.Post(server.url() + "/containers/create?name=w-1", body, kTimeout, options);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body, R"({"Id":"abc"})");
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "POST");
  EXPECT_EQ(requests[0].target, "/containers/create?name=w-1");
  EXPECT_EQ(requests[0].body, body);
  EXPECT_EQ(requests[0].headers["content-type"], "application/json");
  EXPECT_EQ(requests[0].headers["x-fleet"], "1");
  EXPECT_EQ(requests[0].headers["authorization"], "Basic dXNlcjpzZWNyZXQ=");
  EXPECT_EQ(requests[0].headers.count("expect"), 0u);
}

TEST(HttpClientTest, PostsAnEmptyBodyWithZeroLength) {
  TestServer server([](const Request&) { return Reply(204, ""); });
  HttpClient client;
  HttpOptions options;
  options.headers = {"Content-Type: text/plain"};
  HttpResponse r = client.Post(server.url() + "/containers/abc/start", "", kTimeout, options);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 204);
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].headers["content-length"], "0");
  EXPECT_EQ(requests[0].headers["content-type"], "text/plain");
}

TEST(HttpClientTest, SendsDeleteAndPut) {
  TestServer server([](const Request& req) { return Reply(200, req.method); });
  HttpClient client;
  EXPECT_EQ(client.Delete(server.url() + "/containers/abc?force=1", kTimeout).body, "DELETE");
  EXPECT_EQ(client.Perform(Method::kPut, server.url() + "/x", "{}", kTimeout).body, "PUT");
  // A GET after a DELETE is a GET again: nothing carries over between calls.
  EXPECT_EQ(client.Get(server.url() + "/y", kTimeout).body, "GET");
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].target, "/containers/abc?force=1");
  EXPECT_EQ(requests[1].body, "{}");
  EXPECT_EQ(requests[2].body, "");
}

TEST(HttpClientTest, TalksHttpOverAUnixSocket) {
  char dir[] = "/tmp/fleet-http-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/docker.sock";
  {
    TestServer server([](const Request& req) { return Reply(200, "[] " + req.target); }, path);
    HttpClient client;
    HttpOptions options;
    options.unix_socket_path = path;
    HttpResponse r = client.Get("http://localhost/v1.41/containers/json", kTimeout, options);
    EXPECT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.body, "[] /v1.41/containers/json");
    EXPECT_EQ(server.requests().at(0).headers["host"], "localhost");
  }
  unlink(path.c_str());
  rmdir(dir);
}

TEST(HttpClientTest, IgnoresProxyEnvironment) {
  TestServer server([](const Request&) { return Reply(200, "direct"); });
  const char* names[] = {"http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* name : names) {
    const char* old = getenv(name);
    saved[name] = old ? std::optional<std::string>(old) : std::nullopt;
    setenv(name, "http://127.0.0.1:9", 1);  // discard port: nothing listens
  }
  HttpClient client;
  HttpResponse r = client.Get(server.url() + "/", kTimeout);
  for (const auto& [name, value] : saved) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body, "direct");
  EXPECT_EQ(server.requests().at(0).target, "/");  // not an absolute proxy URI
}

TEST(HttpClientTest, MovedFromClientReturnsAnError) {
  TestServer server([](const Request&) { return Reply(200, "ok"); });
  HttpClient a;
  HttpClient b(std::move(a));
  EXPECT_EQ(b.Get(server.url() + "/", kTimeout).body, "ok");
  HttpResponse r = a.Get(server.url() + "/", kTimeout);  // NOLINT(bugprone-use-after-move)
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.error.empty());
  HttpClient c;
  c = std::move(b);
  EXPECT_EQ(c.Get(server.url() + "/", kTimeout).body, "ok");
}

TEST(HttpClientTest, UrlEncodesReservedCharacters) {
  EXPECT_EQ(UrlEncode("AZaz09-._~"), "AZaz09-._~");
  EXPECT_EQ(UrlEncode("a b/c?d=e&f#g%"), "a%20b%2Fc%3Fd%3De%26f%23g%25");
  EXPECT_EQ(UrlEncode(std::string("\0\xff", 2)), "%00%FF");
  EXPECT_EQ(UrlEncode(""), "");
}

}  // namespace
}  // namespace fleet::http

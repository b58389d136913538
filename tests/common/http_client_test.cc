#include "common/http_client.h"

#include "tests/support/http_server.h"

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

using fleet::testing::Reply;
using fleet::testing::Request;
using fleet::testing::TestServer;

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

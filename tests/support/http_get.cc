#include "tests/support/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>

namespace fleet::testing {

HttpReply HttpFetch(const std::string& url, const std::string& extra_headers) {
  HttpReply reply;
  const std::string prefix = "http://";
  if (url.rfind(prefix, 0) != 0) return reply;
  std::string rest = url.substr(prefix.size());
  auto slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  auto colon = hostport.rfind(':');
  if (colon == std::string::npos) return reply;
  std::string host = hostport.substr(0, colon);
  int port = std::stoi(hostport.substr(colon + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return reply;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string req =
        "GET " + path + " HTTP/1.0\r\nHost: " + hostport + "\r\n" + extra_headers + "\r\n";
    if (send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof buf, 0)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  auto body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) return reply;
  reply.status = std::atoi(response.c_str() + response.find(' ') + 1);
  reply.headers = response.substr(0, body + 2);
  reply.body = response.substr(body + 4);
  return reply;
}

std::string HttpGet(const std::string& url) {
  HttpReply r = HttpFetch(url);
  return r.status == 200 ? r.body : "";
}

}  // namespace fleet::testing

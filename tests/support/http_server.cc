#include "tests/support/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <stdexcept>

namespace fleet::testing {

namespace {

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::string Reply(int status, const std::string& body, const std::string& extra_headers) {
  return "HTTP/1.1 " + std::to_string(status) +
         " Whatever\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nContent-Type: text/plain\r\n" + extra_headers + "\r\n" + body;
}

TestServer::TestServer(Responder responder, const std::string& unix_path)
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

TestServer::~TestServer() {
  char c = 'x';
  (void)!write(wake_[1], &c, 1);
  thread_.join();
  for (const auto& conn : conns_) close(conn.fd);
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

void TestServer::Run() {
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

bool TestServer::Serve(Conn& conn) {
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

}  // namespace fleet::testing

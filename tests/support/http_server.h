// TestServer: a one-thread HTTP/1.1 server for tests, on 127.0.0.1:0 or a
// unix socket, answering each request with whatever a Responder returns.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace fleet::testing {

struct Request {
  std::string method;
  std::string target;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

// Raw bytes to send back, or nothing: the server then holds the connection
// open without a word until it stops.
using Responder = std::function<std::optional<std::string>(const Request&)>;

// A response with this status and body (Content-Length set), raw bytes.
std::string Reply(int status, const std::string& body, const std::string& extra_headers = "");

// A one-thread HTTP/1.1 server on 127.0.0.1:0 (or a unix socket) for tests:
// keep-alive, Content-Length request bodies, canned answers. The thread
// waits in poll() on its sockets and a wake pipe, so stopping is immediate.
class TestServer {
 public:
  explicit TestServer(Responder responder, const std::string& unix_path = "");
  ~TestServer();
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

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

  void Run();
  // Reads what arrived and answers every complete request; false to close.
  bool Serve(Conn& conn);

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

}  // namespace fleet::testing

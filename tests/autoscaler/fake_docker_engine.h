// FakeDockerEngine: a scripted Docker Engine on a unix socket for the
// launcher and loop tests. It answers by "METHOD target-prefix", the
// longest matching prefix winning; the defaults make a healthy engine with
// image and network. Hold(prefix) makes it a slow engine: a matching
// request gets no answer until Release() (or a 30 s bound, so a launcher
// that waits for it fails its test instead of hanging it).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/http_server.h"

namespace fleet::autoscaler::testing {

class FakeDockerEngine {
 public:
  explicit FakeDockerEngine(const std::string& socket);
  ~FakeDockerEngine();  // releases a hold first

  void Set(const std::string& key, int status, const std::string& body);
  // From now on the container list answers these entries (JSON objects
  // with an "Id"), and a DELETE of one drops it, as the engine does.
  void SetContainers(std::vector<std::string> entries);
  // The same for a swarm's services (JSON objects with an "ID"): the list,
  // each one by id, and a DELETE drops it.
  void SetServices(std::vector<std::string> entries);
  // Requests whose "METHOD target" starts with `prefix` are not answered
  // until Release().
  void Hold(const std::string& prefix);
  void Release();
  // Answers sent to requests starting with `prefix` (a held request counts
  // once its answer went out).
  int Answered(const std::string& prefix) const;

  std::vector<fleet::testing::Request> requests() const { return server_.requests(); }
  // Requests whose "METHOD target" starts with `prefix`.
  std::vector<std::string> Matching(const std::string& prefix) const;
  // The body of the last request starting with `prefix`.
  std::string LastBody(const std::string& prefix) const;

 private:
  std::optional<std::string> Answer(const fleet::testing::Request& r);

  mutable std::mutex mu_;
  std::condition_variable released_cv_;
  std::map<std::string, std::pair<int, std::string>> routes_;
  std::optional<std::string> hold_;
  std::optional<std::vector<std::string>> containers_;
  std::optional<std::vector<std::string>> services_;
  std::vector<std::string> answered_;  // "METHOD target" of each answer sent
  fleet::testing::TestServer server_;  // last: stops before the routes go
};

}  // namespace fleet::autoscaler::testing

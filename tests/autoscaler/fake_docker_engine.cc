#include "tests/autoscaler/fake_docker_engine.h"

#include <chrono>

namespace fleet::autoscaler::testing {

using fleet::testing::Reply;
using fleet::testing::Request;

FakeDockerEngine::FakeDockerEngine(const std::string& socket)
    : server_([this](const Request& r) { return Answer(r); }, socket) {
  Set("GET /_ping", 200, "OK");
  Set("GET /version", 200, R"({"ApiVersion":"1.41","Version":"20.10.24"})");
  Set("GET /v1.41/images/", 200, R"({"Id":"sha256:abc"})");
  Set("GET /v1.41/networks/", 200, R"({"Name":"net"})");
  Set("GET /v1.41/containers/json", 200, "[]");
  Set("POST /v1.41/containers/create", 201, R"({"Id":"c1","Warnings":[]})");
  Set("POST /v1.41/containers/c1/start", 204, "");
  Set("POST /v1.41/containers/", 204, "");    // kill
  Set("DELETE /v1.41/containers/", 204, "");  // remove
}

FakeDockerEngine::~FakeDockerEngine() { Release(); }

void FakeDockerEngine::Set(const std::string& key, int status, const std::string& body) {
  std::lock_guard<std::mutex> lock(mu_);
  routes_[key] = {status, body};
}

void FakeDockerEngine::SetContainers(std::vector<std::string> entries) {
  std::lock_guard<std::mutex> lock(mu_);
  containers_ = std::move(entries);
}

void FakeDockerEngine::SetServices(std::vector<std::string> entries) {
  std::lock_guard<std::mutex> lock(mu_);
  services_ = std::move(entries);
}

void FakeDockerEngine::Hold(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_ = prefix;
}

void FakeDockerEngine::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold_.reset();
  }
  released_cv_.notify_all();
}

int FakeDockerEngine::Answered(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const std::string& line : answered_) n += line.rfind(prefix, 0) == 0;
  return n;
}

std::vector<std::string> FakeDockerEngine::Matching(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const Request& r : server_.requests()) {
    std::string line = r.method + " " + r.target;
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

std::string FakeDockerEngine::LastBody(const std::string& prefix) const {
  std::string body;
  for (const Request& r : server_.requests()) {
    if ((r.method + " " + r.target).rfind(prefix, 0) == 0) body = r.body;
  }
  return body;
}

std::optional<std::string> FakeDockerEngine::Answer(const Request& r) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::string line = r.method + " " + r.target;
  // The slow engine: the server's one thread waits here, as a busy engine
  // keeps its client waiting.
  released_cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return !hold_ || line.rfind(*hold_, 0) != 0; });
  answered_.push_back(line);
  if (containers_ && line.rfind("GET /v1.41/containers/json", 0) == 0) {
    std::string list = "[";
    for (const std::string& c : *containers_) list += (list.size() > 1 ? "," : "") + c;
    return Reply(200, list + "]");
  }
  const std::string remove = "DELETE /v1.41/containers/";
  if (containers_ && line.rfind(remove, 0) == 0) {
    const std::string id = line.substr(remove.size(), line.find('?') - remove.size());
    std::erase_if(*containers_, [&](const std::string& c) {
      return c.find("\"Id\":\"" + id + "\"") != std::string::npos;
    });
  }
  if (services_) {
    const std::string one = "GET /v1.41/services/", gone = "DELETE /v1.41/services/";
    auto has_id = [](const std::string& entry, const std::string& id) {
      return entry.find("\"ID\":\"" + id + "\"") != std::string::npos;
    };
    if (line.rfind("GET /v1.41/services?", 0) == 0) {
      std::string list = "[";
      for (const std::string& e : *services_) list += (list.size() > 1 ? "," : "") + e;
      return Reply(200, list + "]");
    }
    if (line.rfind(one, 0) == 0) {
      const std::string id = line.substr(one.size());
      for (const std::string& e : *services_) {
        if (has_id(e, id)) return Reply(200, e);
      }
      return Reply(404, R"({"message":"service not found"})");
    }
    if (line.rfind(gone, 0) == 0) {
      const std::string id = line.substr(gone.size());
      if (std::erase_if(*services_, [&](const std::string& e) { return has_id(e, id); }) == 0) {
        return Reply(404, R"({"message":"service not found"})");
      }
      return Reply(200, "");
    }
  }
  const std::pair<int, std::string>* best = nullptr;
  std::size_t best_len = 0;
  for (const auto& [key, value] : routes_) {
    if (line.rfind(key, 0) == 0 && key.size() >= best_len) {
      best = &value;
      best_len = key.size();
    }
  }
  if (best == nullptr) return Reply(404, R"({"message":"page not found"})");
  return Reply(best->first, best->second);
}

}  // namespace fleet::autoscaler::testing

#include "autoscaler/docker_launcher.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <thread>

#include "autoscaler/process_launcher.h"

namespace fleet::autoscaler {

namespace {

using nlohmann::json;

constexpr const char* kPoolLabel = "fleet.pool";
constexpr const char* kIdLabel = "fleet.worker-id";

// "1.41" -> 141; 0 when malformed.
int ApiNumber(const std::string& v) {
  auto dot = v.find('.');
  if (dot == std::string::npos) return 0;
  try {
    return std::stoi(v.substr(0, dot)) * 100 + std::stoi(v.substr(dot + 1));
  } catch (const std::exception&) {
    return 0;
  }
}

bool SpecialNetwork(const std::string& n) {
  return n.empty() || n == "host" || n == "bridge" || n == "none" || n == "default" ||
         n.starts_with("container:");
}

}  // namespace

std::string DockerErrorMessage(const http::HttpResponse& response) {
  if (!response.error.empty()) return response.error;
  json j = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    return fmt::format("{} (HTTP {})", j["message"].get<std::string>(), response.status);
  }
  std::string body = response.body.substr(0, 200);
  return fmt::format("HTTP {}{}{}", response.status, body.empty() ? "" : ": ", body);
}

std::optional<std::int64_t> ParseByteSize(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 15) return std::nullopt;
  std::int64_t n = std::stoll(text.substr(0, i));
  std::string unit;
  for (char c : text.substr(i)) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    shift = 30;
  } else {
    return std::nullopt;
  }
  if (n > (std::int64_t{1} << (62 - shift))) return std::nullopt;
  return n << shift;
}

DockerLauncher::DockerLauncher(DockerOptions options) : options_(std::move(options)) {
  http_options_.unix_socket_path = options_.socket_path;
  CheckDockerMounts(options_.mounts, options_.socket_path);
  if (options_.network.starts_with("container:")) {
    throw std::runtime_error("docker launcher: --docker-network container:... would put workers "
                             "in another container's namespace; name a network");
  }
  if (options_.network == "host" && options_.metrics_port > 0) {
    // Every worker would bind the same host port; all but the first fail.
    spdlog::warn("docker launcher: host network: workers serve no /metrics (set "
                 "--docker-worker-metrics-port 0 to silence this)");
    options_.metrics_port = 0;
  }
  struct stat st {};
  if (stat(options_.socket_path.c_str(), &st) != 0) {
    throw std::runtime_error(fmt::format(
        "docker launcher: no Docker socket at {}: is the Docker engine running on this host, "
        "and (in a container) is the socket mounted (-v /var/run/docker.sock:{})?",
        options_.socket_path, options_.socket_path));
  }
  http::HttpResponse ping = http_.Get("http://docker/_ping", options_.api_timeout, http_options_);
  if (!ping.ok()) {
    throw std::runtime_error(fmt::format(
        "docker launcher: the Docker engine does not answer on {}: {} (permission: the "
        "autoscaler's user must be able to open the socket, e.g. be in its group)",
        options_.socket_path, DockerErrorMessage(ping)));
  }
  http::HttpResponse version =
      http_.Get("http://docker/version", options_.api_timeout, http_options_);
  json v = json::parse(version.body, nullptr, false);
  std::string api = v.is_object() && v.value("ApiVersion", json()).is_string()
                        ? v["ApiVersion"].get<std::string>()
                        : "";
  if (!version.ok() || ApiNumber(api) < ApiNumber(std::string(kDockerApiVersion).substr(1))) {
    throw std::runtime_error(fmt::format(
        "docker launcher: the engine on {} speaks API {}, this launcher needs {} or newer "
        "(Docker Engine 20.10+)",
        options_.socket_path, api.empty() ? "(unknown)" : api, kDockerApiVersion + 1));
  }
  http::HttpResponse image = Call(http::Method::kGet, "/images/" + options_.image + "/json");
  if (image.status == 404) {
    throw std::runtime_error(fmt::format(
        "docker launcher: image {} does not exist at the engine: build it "
        "(docker/build-images.sh) or pull it, or name another with --docker-image",
        options_.image));
  }
  if (!image.ok()) {
    throw std::runtime_error(fmt::format("docker launcher: cannot inspect image {}: {}",
                                         options_.image, DockerErrorMessage(image)));
  }
  if (!SpecialNetwork(options_.network)) {
    http::HttpResponse net =
        Call(http::Method::kGet, "/networks/" + http::UrlEncode(options_.network));
    if (net.status == 404) {
      throw std::runtime_error(fmt::format(
          "docker launcher: network {} does not exist (with docker-compose it is created by "
          "`docker-compose up`; check --docker-network)",
          options_.network));
    }
    if (!net.ok()) {
      throw std::runtime_error(fmt::format("docker launcher: cannot inspect network {}: {}",
                                           options_.network, DockerErrorMessage(net)));
    }
  }
  std::string mounts;
  for (const DockerMount& m : options_.mounts) {
    mounts += fmt::format("{}{}:{}", mounts.empty() ? "" : ", ", m.host_path, m.container_path);
  }
  spdlog::info("docker launcher: engine API {} on {}, image {}, network {}, pool label {}={}, "
               "read-only mounts {}; engine calls run off the loop",
               api, options_.socket_path, options_.image,
               options_.network.empty() ? "(default bridge)" : options_.network, kPoolLabel,
               options_.pool, mounts.empty() ? "none" : mounts);
  // From here on only the engine thread uses http_.
  engine_ = std::thread([this] { EngineLoop(); });
}

DockerLauncher::~DockerLauncher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // A hung engine must not hold the exit for a call timeout per queued
    // call: what is not done by then is left (see EngineLoop).
    stop_deadline_ = std::chrono::steady_clock::now() + 2 * options_.api_timeout;
  }
  work_cv_.notify_all();
  if (engine_.joinable()) engine_.join();
}

void DockerLauncher::EngineLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !calls_.empty(); });
    if (calls_.empty()) return;
    if (stop_) {
      // Stopping finishes the creates and removals queued (a create the
      // engine was asked for is made, and adopted by the next run, rather
      // than half done), within a deadline; signals and lists no longer
      // matter to anyone.
      std::erase_if(calls_, [](const EngineCall& c) {
        return c.op == Op::kSignal || c.op == Op::kList;
      });
      if (!calls_.empty() && std::chrono::steady_clock::now() >= stop_deadline_) {
        spdlog::warn("docker launcher: the engine is not answering; leaving {} calls undone "
                     "(containers of this pool left behind are adopted or removed by the "
                     "next run)",
                     calls_.size());
        calls_.clear();
      }
      if (calls_.empty()) return;
    }
    EngineCall call = std::move(calls_.front());
    calls_.pop_front();
    busy_ = true;
    lock.unlock();
    EngineResult result = Execute(call);
    lock.lock();
    busy_ = false;
    if (result.op == Op::kStart || result.op == Op::kList || result.op == Op::kReap) {
      results_.push_back(std::move(result));
    }
    idle_cv_.notify_all();
  }
}

DockerLauncher::EngineResult DockerLauncher::Execute(const EngineCall& call) {
  EngineResult r{call.op, call.id, call.container, {}, -1, std::nullopt};
  switch (call.op) {
    case Op::kStart:
      return DoStart(call);
    case Op::kList:
      r.listed = List(&r.error);
      break;
    case Op::kReap:
      r.exit_code = ExitCode(call.container);
      Remove(call.container, ContainerName(call.id));
      break;
    case Op::kSignal:
      Signal(call.id, call.container, call.arg.c_str());
      break;
    case Op::kRemove:
      Remove(call.container, call.arg);
      break;
  }
  return r;
}

void DockerLauncher::Queue(EngineCall call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(std::move(call));
  }
  work_cv_.notify_one();
}

bool DockerLauncher::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return calls_.empty() && !busy_; });
}

http::HttpResponse DockerLauncher::Call(http::Method method, const std::string& path,
                                        const std::string& body) {
  return http_.Perform(method, std::string("http://docker/") + kDockerApiVersion + path, body,
                       options_.api_timeout, http_options_);
}

std::string DockerLauncher::ContainerName(const std::string& id) const {
  return options_.pool + "-" + id;
}

std::string DockerLauncher::CreateBody(const std::string& id) const {
  json env = json::array();
  for (const auto& e : options_.env) env.push_back(e);
  json labels = {{kPoolLabel, options_.pool}, {"fleet.role", "worker"}, {kIdLabel, id}};
  if (options_.metrics_port > 0) {
    env.push_back(fmt::format("FLEET_METRICS=0.0.0.0:{}", options_.metrics_port));
    labels["fleet.metrics-port"] = std::to_string(options_.metrics_port);
  }
  std::string command = "exec " + ShellQuote(options_.worker_command) + " --id " + ShellQuote(id);
  if (!options_.worker_args.empty()) command += " " + options_.worker_args;
  json host = {
      {"Init", true},
      {"Privileged", false},
      {"ReadonlyRootfs", true},
      {"CapDrop", json::array({"ALL"})},
      {"SecurityOpt", json::array({"no-new-privileges"})},
      {"Tmpfs", {{"/tmp", "rw,noexec,nosuid,size=64m"}}},
      {"RestartPolicy", {{"Name", "no"}}},
  };
  if (!options_.network.empty()) host["NetworkMode"] = options_.network;
  if (!options_.mounts.empty()) {
    // Mounts, not Binds: a missing source is an error at create (Binds would
    // make an empty root-owned directory on the host), and NonRecursive
    // keeps a mount below the source, which ReadOnly would not cover on
    // this API version, out of the container.
    json mounts = json::array();
    for (const DockerMount& m : options_.mounts) {
      mounts.push_back({{"Type", "bind"},
                        {"Source", m.host_path},
                        {"Target", m.container_path},
                        {"ReadOnly", true},
                        {"BindOptions", {{"NonRecursive", true}}}});
    }
    host["Mounts"] = std::move(mounts);
  }
  if (options_.memory_bytes > 0) {
    host["Memory"] = options_.memory_bytes;
    host["MemorySwap"] = options_.memory_bytes;  // no swap on top
  }
  if (options_.pids_limit > 0) host["PidsLimit"] = options_.pids_limit;
  if (options_.cpus > 0) host["NanoCpus"] = static_cast<std::int64_t>(std::llround(options_.cpus * 1e9));
  json body = {
      {"Image", options_.image},
      {"Cmd", json::array({"/bin/sh", "-c", command})},
      {"Entrypoint", json::array()},
      {"Env", env},
      {"Labels", labels},
      {"Healthcheck", {{"Test", json::array({"NONE"})}}},
      {"StopSignal", "SIGTERM"},
      {"HostConfig", host},
  };
  return body.dump();
}

bool DockerLauncher::Start(const std::string& id, TimePoint, std::string* error) {
  if (workers_.count(id) != 0) {
    *error = "a worker " + id + " is already started";
    return false;
  }
  workers_[id];  // booked; its container comes with the start's result
  Queue({Op::kStart, id, {}, CreateBody(id)});
  return true;
}

DockerLauncher::EngineResult DockerLauncher::DoStart(const EngineCall& call) {
  EngineResult r{Op::kStart, call.id, {}, {}, -1, std::nullopt};
  const std::string name = ContainerName(call.id);
  http::HttpResponse created =
      Call(http::Method::kPost, "/containers/create?name=" + http::UrlEncode(name), call.arg);
  if (!created.ok()) {
    r.error = fmt::format("create container {} from image {}: {}", name, options_.image,
                          DockerErrorMessage(created));
    return r;
  }
  json j = json::parse(created.body, nullptr, false);
  if (!j.is_object() || !j.value("Id", json()).is_string()) {
    r.error = "create container " + name + ": the engine's reply has no Id";
    return r;
  }
  std::string container = j["Id"].get<std::string>();
  http::HttpResponse started = Call(http::Method::kPost, "/containers/" + container + "/start");
  if (!started.ok() && started.status != 304) {
    r.error = fmt::format("start container {}: {}", name, DockerErrorMessage(started));
    Remove(container, name);
    return r;
  }
  spdlog::debug("started container {} ({})", name, container.substr(0, 12));
  r.container = std::move(container);
  return r;
}

void DockerLauncher::Stop(const std::string& id, Duration grace, TimePoint now) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.term_at || it->second.termed) return;
  it->second.grace = grace;
  it->second.term_at = now + grace;
}

void DockerLauncher::CancelStop(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.termed) return;  // too late: it was signalled
  it->second.term_at.reset();
}

std::optional<std::vector<DockerLauncher::Listed>> DockerLauncher::List(std::string* error) {
  json filters = {{"label", json::array({std::string(kPoolLabel) + "=" + options_.pool})}};
  http::HttpResponse r = Call(http::Method::kGet,
                              "/containers/json?all=1&filters=" + http::UrlEncode(filters.dump()));
  json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
  if (!j.is_array()) {
    *error = r.ok() ? "unexpected reply" : DockerErrorMessage(r);
    return std::nullopt;
  }
  std::vector<Listed> out;
  for (const json& c : j) {
    if (!c.is_object() || !c.value("Id", json()).is_string()) continue;
    Listed l;
    l.container = c["Id"].get<std::string>();
    l.state = c.value("State", json()).is_string() ? c["State"].get<std::string>() : "";
    const json& labels = c.value("Labels", json::object());
    // The engine filtered on the label already; check again, so a container
    // without it is never touched whatever the engine does.
    if (!labels.is_object() || labels.value(kPoolLabel, json()) != json(options_.pool)) continue;
    if (labels.value(kIdLabel, json()).is_string()) l.worker_id = labels[kIdLabel].get<std::string>();
    out.push_back(std::move(l));
  }
  return out;
}

int DockerLauncher::ExitCode(const std::string& container) {
  http::HttpResponse r = Call(http::Method::kGet, "/containers/" + container + "/json");
  json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
  if (!j.is_object() || !j.value("State", json()).is_object()) return -1;
  const json& state = j["State"];
  if (state.value("OOMKilled", false)) {
    spdlog::warn("container {} was killed for memory (limit {} bytes)", container.substr(0, 12),
                 options_.memory_bytes);
  }
  return state.value("ExitCode", -1);
}

void DockerLauncher::Signal(const std::string& id, const std::string& container,
                            const char* signal) {
  http::HttpResponse r =
      Call(http::Method::kPost, "/containers/" + container + "/kill?signal=" + signal);
  // 409: not running any more; 404: gone. Poll reports either.
  if (!r.ok() && r.status != 409 && r.status != 404) {
    spdlog::warn("could not send {} to worker {}'s container: {}", signal, id,
                 DockerErrorMessage(r));
  }
}

void DockerLauncher::Remove(const std::string& container, const std::string& what) {
  http::HttpResponse r =
      Call(http::Method::kDelete, "/containers/" + container + "?force=true&v=true");
  if (!r.ok() && r.status != 404) {
    spdlog::warn("could not remove container {}: {}", what, DockerErrorMessage(r));
  }
}

void DockerLauncher::Apply(EngineResult result, std::vector<Exited>* exited) {
  switch (result.op) {
    case Op::kStart: {
      auto it = workers_.find(result.id);
      if (it == workers_.end()) {
        // StopAll gave up on it while its start was still with the engine:
        // a container made after that is not wanted.
        if (!result.container.empty()) {
          spdlog::info("worker {}: its container came up after the launcher stopped "
                       "waiting for it; removing it",
                       result.id);
          Queue({Op::kRemove, {}, result.container, ContainerName(result.id)});
        }
        return;
      }
      if (!result.error.empty()) {
        exited->push_back({result.id, -1, std::move(result.error)});
        workers_.erase(it);
      } else {
        it->second.container = std::move(result.container);
      }
      return;
    }
    case Op::kReap:
      exited->push_back({result.id, result.exit_code, {}});
      workers_.erase(result.id);
      return;
    case Op::kList:
      list_queued_ = false;
      if (!result.listed) {
        if (!list_failing_) {
          spdlog::error("docker launcher: cannot list the pool's containers: {}", result.error);
        }
        list_failing_ = true;
        return;  // try again next poll; nothing is decided blind
      }
      if (list_failing_) spdlog::info("docker launcher: the engine answers again");
      list_failing_ = false;
      ApplyList(*result.listed, exited);
      return;
    case Op::kSignal:
    case Op::kRemove:
      return;
  }
}

void DockerLauncher::ApplyList(const std::vector<Listed>& listed, std::vector<Exited>* exited) {
  // Calls run first in, first out and their results are applied in that
  // order, so every container known here was created before this list was
  // taken: one it lacks is gone. A worker whose start is still running has
  // no container yet and is left alone.
  std::map<std::string, const Listed*> by_container;
  for (const Listed& l : listed) by_container[l.container] = &l;
  std::set<std::string> tracked_containers;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const std::string& id = it->first;
    Worker& w = it->second;
    if (w.container.empty()) {
      ++it;
      continue;
    }
    tracked_containers.insert(w.container);
    if (w.reaping) {
      ++it;
      continue;
    }
    auto found = by_container.find(w.container);
    if (found == by_container.end()) {
      spdlog::warn("worker {}'s container disappeared (removed outside the autoscaler)", id);
      exited->push_back({id, -1, {}});
      it = workers_.erase(it);
      continue;
    }
    const std::string& state = found->second->state;
    if (state == "exited" || state == "dead") {
      w.reaping = true;  // reported once its exit code is read and it is removed
      Queue({Op::kReap, id, w.container, {}});
    }
    ++it;
  }

  for (const Listed& l : listed) {
    if (tracked_containers.count(l.container) != 0) continue;
    const bool live = l.state == "running" || l.state == "restarting" || l.state == "paused";
    if (live && !l.worker_id.empty() && workers_.count(l.worker_id) == 0) {
      workers_[l.worker_id].container = l.container;
      adopted_.push_back(l.worker_id);
      spdlog::info("adopted running container {} (worker {}) of pool {}",
                   ContainerName(l.worker_id), l.worker_id, options_.pool);
    } else if (!live) {
      spdlog::info("removing {} container {} of pool {} left by an earlier run", l.state,
                   l.worker_id.empty() ? l.container.substr(0, 12) : ContainerName(l.worker_id),
                   options_.pool);
      Queue({Op::kRemove, {}, l.container, l.container.substr(0, 12)});
    }
    // A running container of the pool with no worker id (made by hand) is
    // left alone.
  }
}

std::vector<Exited> DockerLauncher::Poll(TimePoint now) {
  std::vector<Exited> exited;
  std::deque<EngineResult> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(results_);
  }
  for (EngineResult& r : done) Apply(std::move(r), &exited);

  for (auto& [id, w] : workers_) {
    if (w.container.empty() || w.reaping) continue;  // signalled once it exists
    if (w.term_at && now >= *w.term_at) {
      spdlog::info("worker {} still running {:.1f} s after its stop: SIGTERM", id,
                   std::chrono::duration<double>(w.grace).count());
      Queue({Op::kSignal, id, w.container, "SIGTERM"});
      w.termed = true;
      w.term_at.reset();
      w.kill_at = now + w.grace;
    } else if (w.kill_at && now >= *w.kill_at) {
      spdlog::warn("worker {} ignored SIGTERM for {:.1f} s: SIGKILL", id,
                   std::chrono::duration<double>(w.grace).count());
      Queue({Op::kSignal, id, w.container, "SIGKILL"});
      w.kill_at.reset();
    }
  }

  if (!list_queued_) {
    list_queued_ = true;
    Queue({Op::kList, {}, {}, {}});
  }
  return exited;
}

std::vector<std::string> DockerLauncher::TakeAdopted() {
  std::vector<std::string> out;
  out.swap(adopted_);
  return out;
}

std::vector<std::string> DockerLauncher::Alive() const {
  std::vector<std::string> ids;
  ids.reserve(workers_.size());
  for (const auto& [id, w] : workers_) ids.push_back(id);
  return ids;
}

void DockerLauncher::StopAll(Duration grace) {
  const auto start = std::chrono::steady_clock::now();
  // Shutdown may wait: first for the starts in progress, so that their
  // containers exist and get the signal too.
  const auto bound = std::chrono::duration_cast<std::chrono::milliseconds>(grace) + Seconds(5);
  if (!WaitIdle(bound)) spdlog::warn("docker launcher: the engine is slow; stopping anyway");
  for (const Exited& e : Poll(std::chrono::steady_clock::now())) {
    spdlog::info("worker {} exited (status {})", e.id, e.status);
  }
  if (workers_.empty()) return;
  // SIGTERM makes a worker drain: it finishes what it holds and exits 0.
  for (auto& [id, w] : workers_) {
    if (w.container.empty() || w.termed) continue;
    Queue({Op::kSignal, id, w.container, "SIGTERM"});
    w.termed = true;
    w.term_at.reset();
  }
  bool killed = false;
  while (!workers_.empty()) {
    const auto now = std::chrono::steady_clock::now();
    for (const Exited& e : Poll(now)) {
      spdlog::info("worker {} exited (status {})", e.id, e.status);
    }
    if (workers_.empty()) break;
    if (!killed && now - start >= grace) {
      for (auto& [id, w] : workers_) {
        if (w.container.empty()) continue;
        spdlog::warn("worker {} did not drain within {:.1f} s: SIGKILL", id,
                     std::chrono::duration<double>(grace).count());
        Queue({Op::kSignal, id, w.container, "SIGKILL"});
        w.kill_at.reset();
      }
      killed = true;
    }
    if (now - start >= 2 * grace + Seconds(5)) {
      for (auto& [id, w] : workers_) {
        if (!w.container.empty()) Queue({Op::kRemove, {}, w.container, ContainerName(id)});
      }
      spdlog::error("gave up waiting for {} containers; removing them by force", workers_.size());
      workers_.clear();
      WaitIdle(std::chrono::duration_cast<std::chrono::milliseconds>(options_.api_timeout) * 2);
      break;
    }
    // Shutdown only: the engine has no event we could wait on cheaply here.
    // The calls Poll queued are done before the next look.
    WaitIdle(std::chrono::milliseconds(2000));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  adopted_.clear();
}

}  // namespace fleet::autoscaler

#include "autoscaler/container_engine.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "autoscaler/process_launcher.h"

namespace fleet::autoscaler {

namespace {

using nlohmann::json;


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

// --- what both engines share ----------------------------------------------

DockerApiEngine::DockerApiEngine(DockerOptions options) : ContainerEngine(std::move(options)) {
  std::string& a = options_.socket_path;
  if (a.starts_with("unix://")) a = a.substr(7);
  if (a.starts_with("tcp://")) {
    const std::string host = a.substr(6);
    if (host.empty() || host.find('/') != std::string::npos ||
        host.find(':') == std::string::npos) {
      throw std::invalid_argument("Docker engine " + a + ": expected tcp://HOST:PORT");
    }
    if (options_.tls_dir.empty()) {
      throw std::invalid_argument(
          "Docker engine " + a + ": a tcp:// engine needs TLS with a client certificate "
          "(--docker-tls-dir with ca.pem, cert.pem, key.pem): the Engine API without it is root "
          "on that host for anyone who can reach the port");
    }
    base_url_ = "https://" + host;
    http_options_.ca_file = options_.tls_dir + "/ca.pem";
    http_options_.cert_file = options_.tls_dir + "/cert.pem";
    http_options_.key_file = options_.tls_dir + "/key.pem";
  } else if (a.starts_with("/")) {
    base_url_ = "http://docker";
    http_options_.unix_socket_path = a;
  } else {
    throw std::invalid_argument("Docker engine " + a +
                                ": expected a unix socket path or tcp://HOST:PORT");
  }
  CheckDockerMounts(options_.mounts, a);
  address_ = a;
}

http::HttpResponse DockerApiEngine::Call(http::Method method, const std::string& path,
                                         const std::string& body) {
  http::HttpResponse r = http_.Perform(method, base_url_ + "/" + kDockerApiVersion + path, body,
                                       options_.api_timeout, http_options_);
  unreachable_ = r.status == 0;
  return r;
}

http::HttpResponse DockerApiEngine::Get(const std::string& path) {
  http::HttpResponse r = http_.Get(base_url_ + path, options_.api_timeout, http_options_);
  unreachable_ = r.status == 0;
  return r;
}

std::string DockerApiEngine::CheckEngine(bool need_image, std::string* network_json) {
  struct stat st {};
  if (!http_options_.unix_socket_path.empty() && stat(options_.socket_path.c_str(), &st) != 0) {
    unreachable_ = true;
    throw std::runtime_error(fmt::format(
        "{} launcher: no Docker socket at {}: is the Docker engine running on this host, "
        "and (in a container) is the socket mounted (-v /var/run/docker.sock:{})?",
        kind(), options_.socket_path, options_.socket_path));
  }
  http::HttpResponse ping = Get("/_ping");
  if (!ping.ok()) {
    throw std::runtime_error(fmt::format(
        "{} launcher: the Docker engine does not answer on {}: {} (permission: the "
        "autoscaler's user must be able to open the socket, e.g. be in its group)",
        kind(), options_.socket_path, DockerErrorMessage(ping)));
  }
  http::HttpResponse version = Get("/version");
  json v = json::parse(version.body, nullptr, false);
  std::string api = v.is_object() && v.value("ApiVersion", json()).is_string()
                        ? v["ApiVersion"].get<std::string>()
                        : "";
  if (!version.ok() || ApiNumber(api) < ApiNumber(std::string(kDockerApiVersion).substr(1))) {
    throw std::runtime_error(fmt::format(
        "{} launcher: the engine on {} speaks API {}, this launcher needs {} or newer "
        "(Docker Engine 20.10+)",
        kind(), options_.socket_path, api.empty() ? "(unknown)" : api, kDockerApiVersion + 1));
  }
  http::HttpResponse image = Call(http::Method::kGet, "/images/" + options_.image + "/json");
  if (image.status == 404) {
    std::string msg = fmt::format(
        "{} launcher: image {} does not exist at the engine on {}: build it "
        "(docker/build-images.sh) or pull it, or name another with --docker-image",
        kind(), options_.image, options_.socket_path);
    if (need_image) throw std::runtime_error(msg);
    spdlog::warn("{} (each node needs it, or pulls it from a registry)", msg);
  } else if (!image.ok()) {
    throw std::runtime_error(fmt::format("{} launcher: cannot inspect image {}: {}", kind(),
                                         options_.image, DockerErrorMessage(image)));
  }
  if (!SpecialNetwork(options_.network)) {
    http::HttpResponse net =
        Call(http::Method::kGet, "/networks/" + http::UrlEncode(options_.network));
    if (net.status == 404) {
      throw std::runtime_error(fmt::format(
          "{} launcher: network {} does not exist (with docker-compose it is created by "
          "`docker-compose up`, with a stack by `docker stack deploy`; check "
          "--docker-network)",
          kind(), options_.network));
    }
    if (!net.ok()) {
      throw std::runtime_error(fmt::format("{} launcher: cannot inspect network {}: {}", kind(),
                                           options_.network, DockerErrorMessage(net)));
    }
    if (network_json != nullptr) *network_json = net.body;
  }
  return api;
}

std::vector<std::string> ContainerEngine::Env() const {
  std::vector<std::string> env = options_.env;
  if (options_.metrics_port > 0) {
    env.push_back(fmt::format("FLEET_METRICS=0.0.0.0:{}", options_.metrics_port));
  }
  return env;
}

std::string ContainerEngine::Command(const std::string& id) const {
  std::string command = "exec " + ShellQuote(options_.worker_command) + " --id " + ShellQuote(id);
  if (!options_.worker_args.empty()) command += " " + options_.worker_args;
  return command;
}

namespace {

json Labels(const DockerOptions& o, const std::string& id) {
  json labels = {{kPoolLabel, o.pool}, {"fleet.role", "worker"}, {kIdLabel, id}};
  if (o.metrics_port > 0) labels["fleet.metrics-port"] = std::to_string(o.metrics_port);
  return labels;
}

// Mounts, not Binds: a missing source is an error at create (Binds would
// make an empty root-owned directory on the host), and NonRecursive keeps a
// mount below the source, which ReadOnly would not cover on this API
// version, out of the container.
json BindMounts(const DockerOptions& o) {
  json mounts = json::array();
  for (const DockerMount& m : o.mounts) {
    mounts.push_back({{"Type", "bind"},
                      {"Source", m.host_path},
                      {"Target", m.container_path},
                      {"ReadOnly", true},
                      {"BindOptions", {{"NonRecursive", true}}}});
  }
  return mounts;
}

std::string LabelFilter(const DockerOptions& o) {
  json filters = {{"label", json::array({std::string(kPoolLabel) + "=" + o.pool})}};
  return http::UrlEncode(filters.dump());
}

// The worker id label of a listed unit whose labels carry the pool's label;
// nullopt when they do not (never touched, whatever the engine's filter did).
std::optional<std::string> PoolWorkerId(const json& labels, const std::string& pool) {
  if (!labels.is_object() || labels.value(kPoolLabel, json()) != json(pool)) return std::nullopt;
  return labels.value(kIdLabel, json()).is_string() ? labels[kIdLabel].get<std::string>() : "";
}

}  // namespace

// --- Docker: one container per worker ---------------------------------------

DockerEngine::DockerEngine(DockerOptions options) : DockerApiEngine(std::move(options)) {
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
}

void DockerEngine::Check() {
  std::string api = CheckEngine(/*need_image=*/true, nullptr);
  std::string mounts;
  for (const DockerMount& m : options_.mounts) {
    mounts += fmt::format("{}{}:{}", mounts.empty() ? "" : ", ", m.host_path, m.container_path);
  }
  spdlog::info("docker launcher: engine API {} on {}, image {}, network {}, pool label {}={}, "
               "read-only mounts {}; engine calls run off the loop",
               api, options_.socket_path, options_.image,
               options_.network.empty() ? "(default bridge)" : options_.network, kPoolLabel,
               options_.pool, mounts.empty() ? "none" : mounts);
}

std::string DockerEngine::CreateBody(const std::string& id) const {
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
  if (!options_.mounts.empty()) host["Mounts"] = BindMounts(options_);
  if (options_.memory_bytes > 0) {
    host["Memory"] = options_.memory_bytes;
    host["MemorySwap"] = options_.memory_bytes;  // no swap on top
  }
  if (options_.pids_limit > 0) host["PidsLimit"] = options_.pids_limit;
  if (options_.cpus > 0) host["NanoCpus"] = static_cast<std::int64_t>(std::llround(options_.cpus * 1e9));
  json body = {
      {"Image", options_.image},
      {"Cmd", json::array({"/bin/sh", "-c", Command(id)})},
      {"Entrypoint", json::array()},
      {"Env", Env()},
      {"Labels", Labels(options_, id)},
      {"Healthcheck", {{"Test", json::array({"NONE"})}}},
      {"StopSignal", "SIGTERM"},
      {"HostConfig", host},
  };
  return body.dump();
}

std::string DockerEngine::Create(const std::string& id, const std::string& body,
                                 std::string* error) {
  const std::string name = UnitName(id);
  http::HttpResponse created =
      Call(http::Method::kPost, "/containers/create?name=" + http::UrlEncode(name), body);
  if (!created.ok()) {
    *error = fmt::format("create container {} from image {}: {}", name, options_.image,
                         DockerErrorMessage(created));
    return {};
  }
  json j = json::parse(created.body, nullptr, false);
  if (!j.is_object() || !j.value("Id", json()).is_string()) {
    *error = "create container " + name + ": the engine's reply has no Id";
    return {};
  }
  std::string container = j["Id"].get<std::string>();
  http::HttpResponse started = Call(http::Method::kPost, "/containers/" + container + "/start");
  if (!started.ok() && started.status != 304) {
    *error = fmt::format("start container {}: {}", name, DockerErrorMessage(started));
    Remove(container, name);
    return {};
  }
  spdlog::debug("started container {} ({})", name, container.substr(0, 12));
  return container;
}

std::optional<std::vector<ContainerEngine::Unit>> DockerEngine::List(std::string* error) {
  http::HttpResponse r =
      Call(http::Method::kGet, "/containers/json?all=1&filters=" + LabelFilter(options_));
  json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
  if (!j.is_array()) {
    *error = r.ok() ? "unexpected reply" : DockerErrorMessage(r);
    return std::nullopt;
  }
  std::vector<Unit> out;
  for (const json& c : j) {
    if (!c.is_object() || !c.value("Id", json()).is_string()) continue;
    auto worker = PoolWorkerId(c.value("Labels", json::object()), options_.pool);
    if (!worker) continue;
    Unit u;
    u.handle = c["Id"].get<std::string>();
    u.state = c.value("State", json()).is_string() ? c["State"].get<std::string>() : "";
    u.worker_id = std::move(*worker);
    out.push_back(std::move(u));
  }
  return out;
}

int DockerEngine::ExitCode(const std::string& container, std::string*) {
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

void DockerEngine::Signal(const std::string& id, const std::string& container,
                          const char* signal, Duration) {
  http::HttpResponse r =
      Call(http::Method::kPost, "/containers/" + container + "/kill?signal=" + signal);
  // 409: not running any more; 404: gone. Poll reports either.
  if (!r.ok() && r.status != 409 && r.status != 404) {
    spdlog::warn("could not send {} to worker {}'s container: {}", signal, id,
                 DockerErrorMessage(r));
  }
}

void DockerEngine::Remove(const std::string& container, const std::string& what) {
  http::HttpResponse r =
      Call(http::Method::kDelete, "/containers/" + container + "?force=true&v=true");
  if (!r.ok() && r.status != 404) {
    spdlog::warn("could not remove container {}: {}", what, DockerErrorMessage(r));
  }
}

// --- Swarm: one service of one replica per worker --------------------------

SwarmEngine::SwarmEngine(DockerOptions options) : DockerApiEngine(std::move(options)) {
  if (options_.network == "host" || options_.network.starts_with("container:") ||
      options_.network == "bridge" || options_.network == "none") {
    throw std::runtime_error(fmt::format(
        "swarm launcher: --docker-network {}: name an overlay network of the swarm (a "
        "stack's internal network is STACK_internal), or none",
        options_.network));
  }
}

void SwarmEngine::Check() {
  // Whether it is a manager first, when the engine answers at all: a node
  // outside a swarm has no overlay network, and "network not found" would
  // hide the real cause. (No answer: CheckEngine below says why.)
  http::HttpResponse info = Get("/info");
  std::string network_json;
  std::string api;
  if (!info.ok()) {
    api = CheckEngine(/*need_image=*/false, &network_json);
    info = Get("/info");
  }
  json i = json::parse(info.body, nullptr, false);
  const json swarm = i.is_object() ? i.value("Swarm", json::object()) : json::object();
  if (!info.ok() || !swarm.is_object() || swarm.value("LocalNodeState", "") != "active" ||
      !swarm.value("ControlAvailable", false)) {
    throw std::runtime_error(fmt::format(
        "swarm launcher: the engine on {} is not a swarm manager (node state {}): run "
        "`docker swarm init` there, or point --docker-socket at a manager's engine",
        options_.socket_path,
        swarm.is_object() && swarm.value("LocalNodeState", json()).is_string()
            ? swarm["LocalNodeState"].get<std::string>()
            : "unknown"));
  }
  if (api.empty()) api = CheckEngine(/*need_image=*/false, &network_json);
  if (!network_json.empty()) {
    json n = json::parse(network_json, nullptr, false);
    if (!n.is_object() || n.value("Scope", "") != "swarm") {
      throw std::runtime_error(fmt::format(
          "swarm launcher: network {} is not a swarm network (scope {}): services reach the "
          "broker over an overlay network (docker network create -d overlay, or the stack's)",
          options_.network, n.is_object() ? n.value("Scope", "?") : "?"));
    }
  }
  std::string placement;
  for (const auto& c : options_.constraints) placement += (placement.empty() ? "" : ", ") + c;
  for (const auto& s : options_.spread) placement += (placement.empty() ? "spread " : ", spread ") + s;
  spdlog::info("swarm launcher: manager API {} on {}, image {}, network {}, pool label {}={}, "
               "placement {}; one service per worker, engine calls run off the loop",
               api, options_.socket_path, options_.image,
               options_.network.empty() ? "(none)" : options_.network, kPoolLabel, options_.pool,
               placement.empty() ? "any node" : placement);
}

std::string SwarmEngine::CreateBody(const std::string& id) const {
  json mounts = BindMounts(options_);
  mounts.push_back({{"Type", "tmpfs"},
                    {"Target", "/tmp"},
                    {"TmpfsOptions", {{"SizeBytes", 64ll << 20}, {"Mode", 01777}}}});
  json container = {
      {"Image", options_.image},
      {"Command", json::array({"/bin/sh", "-c", Command(id)})},
      {"Env", Env()},
      {"Labels", Labels(options_, id)},
      {"Init", true},
      {"ReadOnly", true},
      {"CapabilityDrop", json::array({"ALL"})},
      {"Mounts", std::move(mounts)},
      {"StopSignal", "SIGTERM"},
      {"StopGracePeriod", std::chrono::duration_cast<std::chrono::nanoseconds>(options_.stop_grace).count()},
      {"HealthCheck", {{"Test", json::array({"NONE"})}}},
  };
  json limits = json::object(), reservations = json::object();
  if (options_.memory_bytes > 0) {
    limits["MemoryBytes"] = options_.memory_bytes;
    reservations["MemoryBytes"] = options_.memory_bytes;
  }
  if (options_.cpus > 0) {
    const auto nano = static_cast<std::int64_t>(std::llround(options_.cpus * 1e9));
    limits["NanoCPUs"] = nano;
    reservations["NanoCPUs"] = nano;
  }
  if (options_.pids_limit > 0) limits["Pids"] = options_.pids_limit;
  json placement = json::object();
  if (!options_.constraints.empty()) placement["Constraints"] = options_.constraints;
  if (!options_.spread.empty()) {
    json prefs = json::array();
    for (const auto& s : options_.spread) prefs.push_back({{"Spread", {{"SpreadDescriptor", s}}}});
    placement["Preferences"] = std::move(prefs);
  }
  json task = {
      {"ContainerSpec", std::move(container)},
      {"Resources", {{"Limits", limits}, {"Reservations", reservations}}},
      // The autoscaler replaces workers; the swarm must never restart one
      // (a retired worker exits 0 after its drain and stays gone).
      {"RestartPolicy", {{"Condition", "none"}}},
      {"Placement", std::move(placement)},
  };
  if (!options_.network.empty()) task["Networks"] = json::array({{{"Target", options_.network}}});
  json body = {
      {"Name", UnitName(id)},
      {"Labels", Labels(options_, id)},
      {"TaskTemplate", std::move(task)},
      {"Mode", {{"Replicated", {{"Replicas", 1}}}}},
      // Nobody connects to a worker but Prometheus, at its task's address:
      // no virtual IP (it needs IPVS on the nodes and one per service).
      {"EndpointSpec", {{"Mode", "dnsrr"}}},
  };
  return body.dump();
}

std::string SwarmEngine::Create(const std::string& id, const std::string& body,
                                std::string* error) {
  const std::string name = UnitName(id);
  http::HttpResponse created = Call(http::Method::kPost, "/services/create", body);
  json j = created.ok() ? json::parse(created.body, nullptr, false) : json();
  if (!created.ok()) {
    *error = fmt::format("create service {} from image {}: {}", name, options_.image,
                         DockerErrorMessage(created));
    return {};
  }
  if (!j.is_object() || !j.value("ID", json()).is_string()) {
    *error = "create service " + name + ": the manager's reply has no ID";
    return {};
  }
  if (j.value("Warning", json()).is_string()) {
    spdlog::warn("service {}: {}", name, j["Warning"].get<std::string>());
  }
  std::string service = j["ID"].get<std::string>();
  spdlog::debug("created service {} ({})", name, service.substr(0, 12));
  return service;
}

namespace {

// A task's state as the launcher reads a container's.
std::string UnitState(const std::string& task_state) {
  if (task_state == "running") return "running";
  if (task_state == "complete" || task_state == "failed" || task_state == "shutdown" ||
      task_state == "rejected" || task_state == "orphaned" || task_state == "remove") {
    return "exited";
  }
  return "created";  // new, allocated, pending, assigned, accepted, preparing, ready, starting
}

std::string TaskState(const json& task) {
  const json status = task.value("Status", json::object());
  return status.is_object() && status.value("State", json()).is_string()
             ? status["State"].get<std::string>()
             : "";
}

// Of a service's tasks (there is one with restart condition none, but a
// task the swarm replaced on a node failure adds another), the newest.
const json* Newest(const std::vector<const json*>& tasks) {
  const json* best = nullptr;
  std::uint64_t best_index = 0;
  for (const json* t : tasks) {
    const json version = t->value("Version", json::object());
    const std::uint64_t index =
        version.is_object() ? version.value("Index", std::uint64_t{0}) : 0;
    if (best == nullptr || index > best_index) {
      best = t;
      best_index = index;
    }
  }
  return best;
}

}  // namespace

std::optional<std::vector<ContainerEngine::Unit>> SwarmEngine::List(std::string* error) {
  http::HttpResponse r = Call(http::Method::kGet, "/services?filters=" + LabelFilter(options_));
  json services = r.ok() ? json::parse(r.body, nullptr, false) : json();
  if (!services.is_array()) {
    *error = r.ok() ? "unexpected reply to the service list" : DockerErrorMessage(r);
    return std::nullopt;
  }
  std::vector<Unit> out;
  json names = json::array();
  for (const json& s : services) {
    if (!s.is_object() || !s.value("ID", json()).is_string()) continue;
    const json spec = s.value("Spec", json::object());
    auto worker = PoolWorkerId(spec.is_object() ? spec.value("Labels", json::object()) : json(),
                               options_.pool);
    if (!worker) continue;
    // Scaled to 0 (stopped, see Signal): once its task is gone, it exited.
    const json mode = spec.value("Mode", json::object());
    const json replicated = mode.is_object() ? mode.value("Replicated", json::object()) : json();
    const bool scaled_to_zero =
        replicated.is_object() && replicated.value("Replicas", json()) == json(0);
    out.push_back({s["ID"].get<std::string>(), std::move(*worker),
                   scaled_to_zero ? "exited" : "created", {}});
    names.push_back(out.back().handle);
  }
  if (out.empty()) return out;
  // The tasks of those services, in one call (the service filter takes
  // several ids).
  json filters = {{"service", names}};
  http::HttpResponse t =
      Call(http::Method::kGet, "/tasks?filters=" + http::UrlEncode(filters.dump()));
  json tasks = t.ok() ? json::parse(t.body, nullptr, false) : json();
  if (!tasks.is_array()) {
    *error = t.ok() ? "unexpected reply to the task list" : DockerErrorMessage(t);
    return std::nullopt;
  }
  std::map<std::string, std::vector<const json*>> by_service;
  for (const json& task : tasks) {
    if (task.is_object() && task.value("ServiceID", json()).is_string()) {
      by_service[task["ServiceID"].get<std::string>()].push_back(&task);
    }
  }
  for (Unit& u : out) {
    auto it = by_service.find(u.handle);
    if (it == by_service.end()) continue;  // no task (yet, or any more: see above)
    const json* newest = Newest(it->second);
    if (newest == nullptr) continue;
    u.state = UnitState(TaskState(*newest));
    if (u.state == "created") {
      // Why the swarm has not started it yet ("no suitable node ...").
      const json status = newest->value("Status", json::object());
      if (status.is_object() && status.value("Err", json()).is_string()) {
        u.note = TaskState(*newest) + ": " + status["Err"].get<std::string>();
      }
    }
  }
  return out;
}

std::optional<std::string> SwarmEngine::NewestTask(const std::string& service,
                                                   std::string* error) {
  json filters = {{"service", json::array({service})}};
  http::HttpResponse t =
      Call(http::Method::kGet, "/tasks?filters=" + http::UrlEncode(filters.dump()));
  json tasks = t.ok() ? json::parse(t.body, nullptr, false) : json();
  if (!tasks.is_array()) {
    *error = t.ok() ? "unexpected reply" : DockerErrorMessage(t);
    return std::nullopt;
  }
  std::vector<const json*> all;
  for (const json& task : tasks) {
    if (task.is_object() && task.value("ServiceID", json()) == json(service)) all.push_back(&task);
  }
  const json* newest = Newest(all);
  return newest == nullptr ? std::optional<std::string>() : newest->dump();
}

int SwarmEngine::ExitCode(const std::string& service, std::string* start_error) {
  std::string error;
  std::optional<std::string> text = NewestTask(service, &error);
  if (!text) return -1;
  json task = json::parse(*text, nullptr, false);
  const json status = task.value("Status", json::object());
  if (!status.is_object()) return -1;
  const std::string state = TaskState(task);
  const json cs = status.value("ContainerStatus", json::object());
  const bool has_code = cs.is_object() && cs.value("ExitCode", json()).is_number_integer();
  if ((state == "rejected" || state == "failed") && !cs.value("ContainerID", json()).is_string()) {
    // It never ran: the swarm's reason ("No such image: ...", "no suitable
    // node ...") is the start's error.
    std::string err = status.value("Err", json()).is_string() ? status["Err"].get<std::string>()
                                                               : "";
    *start_error = fmt::format("the swarm {} the task of service {}: {}", state,
                               service.substr(0, 12), err.empty() ? state : err);
    return -1;
  }
  return has_code ? cs["ExitCode"].get<int>() : -1;
}

void SwarmEngine::Signal(const std::string& id, const std::string& service, const char* signal,
                         Duration grace) {
  if (std::string(signal) == "SIGKILL") {
    // The swarm offers no signal: removing the service is the last word.
    // Its task is stopped with the stop grace period the SIGTERM set (a
    // task still draining gets the rest of it), and the service is gone
    // from the list at once, so the worker is counted gone then.
    Remove(service, UnitName(id));
    return;
  }
  // SIGTERM: scale to 0 with the grace as the stop grace period. The swarm
  // sends the task SIGTERM (the worker drains) and SIGKILL after the grace.
  http::HttpResponse r = Call(http::Method::kGet, "/services/" + service);
  json s = r.ok() ? json::parse(r.body, nullptr, false) : json();
  if (!s.is_object() || !s.value("Spec", json()).is_object() ||
      !s.value("Version", json()).is_object()) {
    if (r.status != 404) {
      spdlog::warn("could not stop worker {}'s service: {}", id,
                   r.ok() ? "unexpected reply" : DockerErrorMessage(r));
    }
    return;
  }
  json spec = s["Spec"];
  spec["Mode"] = {{"Replicated", {{"Replicas", 0}}}};
  spec["TaskTemplate"]["ContainerSpec"]["StopGracePeriod"] =
      std::chrono::duration_cast<std::chrono::nanoseconds>(grace).count();
  const auto version = s["Version"].value("Index", std::uint64_t{0});
  http::HttpResponse u = Call(http::Method::kPost,
                              fmt::format("/services/{}/update?version={}", service, version),
                              spec.dump());
  if (!u.ok() && u.status != 404) {
    spdlog::warn("could not scale worker {}'s service to 0: {}", id, DockerErrorMessage(u));
  }
}

void SwarmEngine::Remove(const std::string& service, const std::string& what) {
  http::HttpResponse r = Call(http::Method::kDelete, "/services/" + service);
  if (!r.ok() && r.status != 404) {
    spdlog::warn("could not remove service {}: {}", what, DockerErrorMessage(r));
  }
}

}  // namespace fleet::autoscaler

#include "autoscaler/kubernetes_engine.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "autoscaler/yaml_json.h"

namespace fleet::autoscaler {

namespace {

using nlohmann::json;

constexpr const char* kServiceAccount = "/var/run/secrets/kubernetes.io/serviceaccount";

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// Standard base64 (kubeconfig *-data fields); throws on a bad character.
std::string Base64Decode(const std::string& in, const std::string& what) {
  std::string out;
  unsigned buf = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=' || std::isspace(static_cast<unsigned char>(c))) continue;
    else throw std::invalid_argument("kubernetes launcher: " + what + " is not base64");
    buf = (buf << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buf >> bits) & 0xff);
    }
  }
  return out;
}

std::string Str(const json& j, const char* key) {
  return j.is_object() && j.value(key, json()).is_string() ? j[key].get<std::string>() : "";
}

// The entry named `name` of a kubeconfig list (clusters, users, contexts).
json Named(const json& config, const char* list, const std::string& name) {
  if (config.value(list, json()).is_array()) {
    for (const json& e : config[list]) {
      if (Str(e, "name") == name) return e;
    }
  }
  throw std::invalid_argument(fmt::format("kubernetes launcher: the kubeconfig has no {} "
                                          "entry named \"{}\"",
                                          std::string(list).substr(0, std::strlen(list) - 1),
                                          name));
}

std::string Message(const http::HttpResponse& r) {
  if (!r.error.empty()) return r.error;
  json j = json::parse(r.body, nullptr, false);
  if (j.is_object() && j.value("message", json()).is_string()) {
    return fmt::format("{} (HTTP {})", j["message"].get<std::string>(), r.status);
  }
  return fmt::format("HTTP {}: {}", r.status, r.body.substr(0, 200));
}

json* WorkerContainer(json& pod) {
  json& containers = pod["spec"]["containers"];
  for (json& c : containers) {
    if (Str(c, "name") == "worker") return &c;
  }
  return &containers[0];
}

}  // namespace

KubernetesEngine::KubernetesEngine(DockerOptions options) : ContainerEngine(std::move(options)) {
  std::string ca_file, cert_file, key_file;
  auto secret_file = [&](const std::string& data, const char* name, const std::string& what) {
    if (secrets_dir_.path.empty()) {
      char tmpl[] = "/tmp/fleet-kube-XXXXXX";  // mkdtemp: mode 0700
      if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("kubernetes launcher: mkdtemp failed");
      secrets_dir_.path = tmpl;
    }
    std::string path = secrets_dir_.path + "/" + name;
    std::ofstream f(path);
    f << Base64Decode(data, what);
    if (!f) throw std::runtime_error("kubernetes launcher: cannot write " + path);
    chmod(path.c_str(), 0600);
    return path;
  };
  if (!options_.kube_config.empty()) {
    json config = YamlFileToJson(options_.kube_config);
    if (!config.is_object()) {
      throw std::invalid_argument("kubernetes launcher: " + options_.kube_config +
                                  " is not a kubeconfig");
    }
    const std::string current = Str(config, "current-context");
    if (current.empty()) {
      throw std::invalid_argument("kubernetes launcher: " + options_.kube_config +
                                  " has no current-context");
    }
    const json context = Named(config, "contexts", current).value("context", json::object());
    const json cluster =
        Named(config, "clusters", Str(context, "cluster")).value("cluster", json::object());
    const json user = Named(config, "users", Str(context, "user")).value("user", json::object());
    // Relative paths in a kubeconfig are relative to the file.
    const std::string base = std::filesystem::path(options_.kube_config).parent_path().string();
    auto path = [&](const std::string& p) {
      return p.empty() || p[0] == '/' || base.empty() ? p : base + "/" + p;
    };
    server_ = Str(cluster, "server");
    ca_file = path(Str(cluster, "certificate-authority"));
    if (!Str(cluster, "certificate-authority-data").empty()) {
      ca_file = secret_file(Str(cluster, "certificate-authority-data"), "ca.crt",
                            "certificate-authority-data");
    }
    token_ = Str(user, "token");
    token_file_ = path(Str(user, "tokenFile"));
    cert_file = path(Str(user, "client-certificate"));
    key_file = path(Str(user, "client-key"));
    if (!Str(user, "client-certificate-data").empty()) {
      cert_file = secret_file(Str(user, "client-certificate-data"), "client.crt",
                              "client-certificate-data");
    }
    if (!Str(user, "client-key-data").empty()) {
      key_file = secret_file(Str(user, "client-key-data"), "client.key", "client-key-data");
    }
    if (user.contains("exec") || user.contains("auth-provider")) {
      throw std::invalid_argument(
          "kubernetes launcher: the kubeconfig's user logs in through a plugin (exec or "
          "auth-provider), which this launcher does not run: give it a token, a token file or a "
          "client certificate (e.g. a service account's token)");
    }
    namespace_ = Str(context, "namespace");
  } else {
    // In the cluster: the pod's service account (--kube-api may still name
    // another address of the API server; the credentials stay these).
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    struct stat st {};
    const bool has_account = stat((std::string(kServiceAccount) + "/token").c_str(), &st) == 0;
    if ((host == nullptr || port == nullptr) && !(has_account && !options_.kube_api.empty())) {
      throw std::invalid_argument(
          "kubernetes launcher: not in a cluster (no KUBERNETES_SERVICE_HOST and no service "
          "account token): give --kubeconfig FILE");
    }
    if (host != nullptr && port != nullptr) {
      const std::string h = host;
      server_ = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + port;
    }
    token_file_ = std::string(kServiceAccount) + "/token";
    ca_file = std::string(kServiceAccount) + "/ca.crt";
    std::ifstream ns(std::string(kServiceAccount) + "/namespace");
    if (ns) std::getline(ns, namespace_);
  }
  if (!options_.kube_api.empty()) server_ = options_.kube_api;
  if (!options_.kube_namespace.empty()) namespace_ = options_.kube_namespace;
  if (namespace_.empty()) namespace_ = "default";
  while (!server_.empty() && server_.back() == '/') server_.pop_back();
  if (!server_.starts_with("https://") && !server_.starts_with("http://")) {
    throw std::invalid_argument("kubernetes launcher: the API server \"" + server_ +
                                "\" is not an https:// URL");
  }
  if (server_.starts_with("http://")) {
    spdlog::warn("kubernetes launcher: {} is plain HTTP: the API server is not authenticated "
                 "and the token travels in the clear",
                 server_);
  }
  http_options_.ca_file = ca_file;
  http_options_.cert_file = cert_file;
  http_options_.key_file = key_file;
  RefreshToken();
  address_ = server_ + " namespace " + namespace_;

  // The pod template: read and checked now, so a mistake stops the start.
  if (!options_.kube_pod_template.empty()) {
    template_ = YamlFileToJson(options_.kube_pod_template);
  } else {
    template_ = {{"apiVersion", "v1"},
                 {"kind", "Pod"},
                 {"metadata", json::object()},
                 {"spec", {{"containers", json::array({{{"name", "worker"}}})}}}};
  }
  const std::string what = options_.kube_pod_template.empty() ? "the built-in pod template"
                                                              : options_.kube_pod_template;
  if (!template_.is_object() || Str(template_, "kind") != "Pod" ||
      !template_.value("spec", json()).is_object() ||
      !template_["spec"].value("containers", json()).is_array() ||
      template_["spec"]["containers"].empty()) {
    throw std::invalid_argument("kubernetes launcher: " + what +
                                " is not a Pod manifest with at least one container (kind: Pod, "
                                "spec.containers)");
  }
  const json& spec = template_["spec"];
  for (const char* host_ns : {"hostNetwork", "hostPID", "hostIPC"}) {
    if (spec.value(host_ns, false)) {
      throw std::invalid_argument(fmt::format("kubernetes launcher: {} asks for {}: worker pods "
                                              "never share the node's namespaces",
                                              what, host_ns));
    }
  }
  for (const char* list : {"containers", "initContainers"}) {
    for (const json& c : spec.value(list, json::array())) {
      const json sc = c.value("securityContext", json::object());
      if (sc.is_object() && (sc.value("privileged", false) ||
                             sc.value("allowPrivilegeEscalation", false))) {
        throw std::invalid_argument(fmt::format(
            "kubernetes launcher: {}: container {} asks for privileges (privileged or "
            "allowPrivilegeEscalation): worker pods never have them",
            what, Str(c, "name")));
      }
    }
  }
  if (options_.pool.empty() || options_.pool.size() > 40 ||
      options_.pool.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") !=
          std::string::npos) {
    throw std::invalid_argument("kubernetes launcher: --docker-pool " + options_.pool +
                                ": pod names need lower-case letters, digits and '-' (at most "
                                "40 characters)");
  }
}

KubernetesEngine::~KubernetesEngine() = default;

KubernetesEngine::SecretsDir::~SecretsDir() {
  if (!path.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
}

void KubernetesEngine::RefreshToken() {
  if (token_file_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (!token_.empty() && now - token_read_ < std::chrono::seconds(60)) return;
  std::ifstream f(token_file_);
  if (!f) {
    if (token_.empty()) {
      throw std::invalid_argument("kubernetes launcher: cannot read the token file " +
                                  token_file_);
    }
    return;  // keep the last one; the kubelet is rewriting it
  }
  std::ostringstream s;
  s << f.rdbuf();
  token_ = Trim(s.str());
  token_read_ = now;
}

http::HttpResponse KubernetesEngine::Call(http::Method method, const std::string& path,
                                          const std::string& body) {
  try {
    RefreshToken();
  } catch (const std::exception&) {
  }
  http_options_.headers.clear();
  if (!token_.empty()) http_options_.headers.push_back("Authorization: Bearer " + token_);
  http_options_.headers.push_back("Accept: application/json");
  http::HttpResponse r = http_.Perform(method, server_ + path, body, options_.api_timeout,
                                       http_options_);
  unreachable_ = r.status == 0;
  return r;
}

std::string KubernetesEngine::PodsPath() const {
  return "/api/v1/namespaces/" + http::UrlEncode(namespace_) + "/pods";
}

void KubernetesEngine::Check() {
  http::HttpResponse v = Call(http::Method::kGet, "/version");
  if (!v.ok()) {
    throw std::runtime_error(fmt::format(
        "kubernetes launcher: the API server {} does not answer as expected: {}{}", server_,
        Message(v),
        v.status == 401 ? " (the token or client certificate is not accepted)" : ""));
  }
  const std::string version = Str(json::parse(v.body, nullptr, false), "gitVersion");
  // What it may do, asked of the API server itself: a refusal names the
  // verb rather than showing up later as a failed start.
  for (const char* verb : {"list", "create", "delete"}) {
    json review = {{"apiVersion", "authorization.k8s.io/v1"},
                   {"kind", "SelfSubjectAccessReview"},
                   {"spec",
                    {{"resourceAttributes",
                      {{"namespace", namespace_}, {"verb", verb}, {"resource", "pods"}}}}}};
    http::HttpResponse r = Call(http::Method::kPost,
                                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                review.dump());
    json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
    if (!r.ok() || !j.is_object()) {
      throw std::runtime_error(fmt::format(
          "kubernetes launcher: cannot ask the API server {} what this account may do: {}",
          server_, Message(r)));
    }
    const json status = j.value("status", json::object());
    if (!status.is_object() || !status.value("allowed", false)) {
      throw std::runtime_error(fmt::format(
          "kubernetes launcher: this account may not {} pods in namespace {}{}: grant it "
          "(deploy/kubernetes/rbac.yaml: a Role on pods in the namespace and a RoleBinding "
          "to the autoscaler's service account), or name the right --kube-namespace",
          verb, namespace_,
          Str(status, "reason").empty() ? "" : " (" + Str(status, "reason") + ")"));
    }
  }
  if (!options_.kube_owner_pod.empty()) {
    http::HttpResponse r =
        Call(http::Method::kGet, PodsPath() + "/" + http::UrlEncode(options_.kube_owner_pod));
    json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
    owner_uid_ = j.is_object() ? Str(j.value("metadata", json::object()), "uid") : "";
    if (owner_uid_.empty()) {
      throw std::runtime_error(fmt::format(
          "kubernetes launcher: the owner pod {} (--kube-owner-pod, the autoscaler's own pod) "
          "cannot be read in namespace {}: {} (allow get on pods)",
          options_.kube_owner_pod, namespace_, Message(r)));
    }
  }
  spdlog::info("kubernetes launcher: API server {} ({}), namespace {}, image {}, pool label "
               "{}={}, template {}, owner {}; one pod per worker, API calls run off the loop",
               server_, version.empty() ? "version unknown" : version, namespace_,
               options_.image, kPoolLabel, options_.pool,
               options_.kube_pod_template.empty() ? "built in" : options_.kube_pod_template,
               options_.kube_owner_pod.empty() ? "none" : "pod " + options_.kube_owner_pod);
}

std::string KubernetesEngine::CreateBody(const std::string& id) const {
  json pod = template_;
  pod["apiVersion"] = "v1";
  pod["kind"] = "Pod";
  json& meta = pod["metadata"];
  if (!meta.is_object()) meta = json::object();
  meta.erase("generateName");
  meta["name"] = UnitName(id);
  meta["namespace"] = namespace_;
  if (!meta.value("labels", json()).is_object()) meta["labels"] = json::object();
  meta["labels"][kPoolLabel] = options_.pool;
  meta["labels"]["fleet.role"] = "worker";
  meta["labels"][kIdLabel] = id;
  if (options_.metrics_port > 0) {
    meta["labels"]["fleet.metrics-port"] = std::to_string(options_.metrics_port);
  }
  if (!owner_uid_.empty()) {
    meta["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                            {"kind", "Pod"},
                                            {"name", options_.kube_owner_pod},
                                            {"uid", owner_uid_},
                                            {"controller", false},
                                            {"blockOwnerDeletion", false}}});
  }
  json& spec = pod["spec"];
  spec["restartPolicy"] = "Never";
  if (!spec.contains("terminationGracePeriodSeconds")) {
    spec["terminationGracePeriodSeconds"] =
        std::chrono::duration_cast<std::chrono::seconds>(options_.stop_grace).count();
  }
  json& c = *WorkerContainer(pod);
  if (Str(c, "name").empty()) c["name"] = "worker";
  if (Str(c, "image").empty()) c["image"] = options_.image;
  c["command"] = json::array({"/bin/sh", "-c", Command(id)});
  c.erase("args");
  if (!c.value("env", json()).is_array()) c["env"] = json::array();
  for (const std::string& kv : Env()) {
    const auto eq = kv.find('=');
    c["env"].push_back({{"name", kv.substr(0, eq)},
                        {"value", eq == std::string::npos ? "" : kv.substr(eq + 1)}});
  }
  if (!c.contains("resources")) {
    json amounts = json::object();
    if (options_.memory_bytes > 0) amounts["memory"] = std::to_string(options_.memory_bytes);
    if (options_.cpus > 0) amounts["cpu"] = fmt::format("{}m", std::llround(options_.cpus * 1000));
    if (!amounts.empty()) c["resources"] = {{"requests", amounts}, {"limits", amounts}};
  }
  // The safe defaults, each where the template does not say otherwise (a
  // template that sets only runAsUser still gets the rest).
  json& sc = c["securityContext"];
  if (!sc.is_object()) sc = json::object();
  if (!sc.contains("allowPrivilegeEscalation")) sc["allowPrivilegeEscalation"] = false;
  if (!sc.contains("readOnlyRootFilesystem")) sc["readOnlyRootFilesystem"] = true;
  if (!sc.contains("capabilities")) sc["capabilities"] = {{"drop", json::array({"ALL"})}};
  if (options_.metrics_port > 0 && !c.contains("ports")) {
    c["ports"] = json::array(
        {{{"name", "metrics"}, {"containerPort", options_.metrics_port}, {"protocol", "TCP"}}});
  }
  // The read-only root needs a writable /tmp, as the containers' tmpfs.
  bool has_tmp = false;
  for (const json& m : c.value("volumeMounts", json::array())) {
    has_tmp = has_tmp || Str(m, "mountPath") == "/tmp";
  }
  if (!has_tmp) {
    if (!c.value("volumeMounts", json()).is_array()) c["volumeMounts"] = json::array();
    c["volumeMounts"].push_back({{"name", "fleet-tmp"}, {"mountPath", "/tmp"}});
    if (!spec.value("volumes", json()).is_array()) spec["volumes"] = json::array();
    spec["volumes"].push_back({{"name", "fleet-tmp"}, {"emptyDir", {{"sizeLimit", "64Mi"}}}});
  }
  return pod.dump();
}

std::string KubernetesEngine::Create(const std::string& id, const std::string& body,
                                     std::string* error) {
  const std::string name = UnitName(id);
  http::HttpResponse r = Call(http::Method::kPost, PodsPath(), body);
  json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
  if (!r.ok()) {
    *error = fmt::format("create pod {} in namespace {}: {}", name, namespace_, Message(r));
    return {};
  }
  if (Str(j.value("metadata", json::object()), "name") != name) {
    *error = "create pod " + name + ": the API server's reply names no such pod";
    return {};
  }
  spdlog::debug("created pod {}", name);
  return name;
}

namespace {

// Why a pending pod is not running yet, when its status says.
std::string PendingNote(const json& status) {
  for (const json& c : status.value("containerStatuses", json::array())) {
    const json waiting = c.value("state", json::object()).value("waiting", json::object());
    const std::string reason = Str(waiting, "reason");
    if (!reason.empty() && reason != "ContainerCreating" && reason != "PodInitializing") {
      return reason + ": " + Str(waiting, "message");
    }
  }
  for (const json& cond : status.value("conditions", json::array())) {
    if (Str(cond, "type") == "PodScheduled" && Str(cond, "status") == "False") {
      return Str(cond, "reason") + ": " + Str(cond, "message");
    }
  }
  return {};
}

}  // namespace

std::optional<std::vector<ContainerEngine::Unit>> KubernetesEngine::List(std::string* error) {
  http::HttpResponse r =
      Call(http::Method::kGet,
           PodsPath() + "?labelSelector=" + http::UrlEncode(std::string(kPoolLabel) + "=" +
                                                            options_.pool));
  json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
  if (!j.is_object() || !j.value("items", json()).is_array()) {
    *error = r.ok() ? "unexpected reply to the pod list" : Message(r);
    return std::nullopt;
  }
  std::vector<Unit> out;
  for (const json& pod : j["items"]) {
    const json meta = pod.value("metadata", json::object());
    const json labels = meta.is_object() ? meta.value("labels", json::object()) : json();
    // The API server selected on the label already; check again, so a pod
    // without it is never touched whatever it did.
    if (!labels.is_object() || labels.value(kPoolLabel, json()) != json(options_.pool)) continue;
    Unit u;
    u.handle = Str(meta, "name");
    if (u.handle.empty()) continue;
    u.worker_id = Str(labels, kIdLabel);
    const json status = pod.value("status", json::object());
    const std::string phase = Str(status, "phase");
    if (phase == "Running" || phase == "Unknown") {
      u.state = "running";
    } else if (phase == "Succeeded" || phase == "Failed") {
      u.state = "exited";
    } else {
      u.state = "created";
      u.note = PendingNote(status);
    }
    out.push_back(std::move(u));
  }
  return out;
}

int KubernetesEngine::ExitCode(const std::string& pod, std::string* start_error) {
  http::HttpResponse r = Call(http::Method::kGet, PodsPath() + "/" + http::UrlEncode(pod));
  json j = r.ok() ? json::parse(r.body, nullptr, false) : json();
  const json status = j.is_object() ? j.value("status", json::object()) : json::object();
  for (const json& c : status.value("containerStatuses", json::array())) {
    const json state = c.value("state", json::object());
    const json terminated = state.value("terminated", json::object());
    if (terminated.is_object() && terminated.value("exitCode", json()).is_number_integer()) {
      if (Str(c, "name") == "worker" || status["containerStatuses"].size() == 1) {
        return terminated["exitCode"].get<int>();
      }
    }
  }
  if (Str(status, "phase") == "Failed") {
    std::string why = Str(status, "reason");
    if (!Str(status, "message").empty()) why += (why.empty() ? "" : ": ") + Str(status, "message");
    *start_error = fmt::format("pod {} failed before its worker ran: {}", pod,
                               why.empty() ? "no reason given" : why);
  }
  return -1;
}

void KubernetesEngine::Delete(const std::string& pod, long grace_seconds,
                              const std::string& what) {
  http::HttpResponse r = Call(http::Method::kDelete, fmt::format("{}/{}?gracePeriodSeconds={}",
                                                                 PodsPath(), http::UrlEncode(pod),
                                                                 grace_seconds));
  if (!r.ok() && r.status != 404) {
    spdlog::warn("could not delete pod {}: {}", what, Message(r));
  }
}

void KubernetesEngine::Signal(const std::string& id, const std::string& pod, const char* signal,
                              Duration grace) {
  // Deleting the pod is the API's signal: the kubelet sends SIGTERM, then
  // SIGKILL after the grace period (0: at once).
  const long seconds =
      std::string(signal) == "SIGKILL"
          ? 0
          : std::max<long>(1, std::chrono::duration_cast<std::chrono::seconds>(grace).count());
  Delete(pod, seconds, UnitName(id));
}

void KubernetesEngine::Remove(const std::string& pod, const std::string& what) {
  Delete(pod, 0, what);
}

}  // namespace fleet::autoscaler

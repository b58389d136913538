// ContainerEngine: the calls the engine launcher (docker_launcher.h) makes to
// whatever runs its workers, one "unit" per worker:
//   DockerEngine  a Docker Engine; a unit is a container (--launcher docker)
//   SwarmEngine   a Docker Swarm manager; a unit is a service of one replica
//                 (--launcher swarm)
// Both speak the Docker Engine API (kDockerApiVersion) on a unix socket and
// build every unit from one fixed template (see docker_launcher.h), labelled
//   fleet.pool=POOL fleet.role=worker fleet.worker-id=ID
//   fleet.metrics-port=PORT (when the worker serves /metrics)
// and never touch a unit without their pool label.
//
// A swarm worker is a service with one replica and restart condition "none",
// so that retiring exactly the drained worker is removing exactly its
// service, and the swarm never starts it again of its own accord (a worker
// that exits after its drain leaves a "complete" task, or "failed" with its
// exit code). Signals map onto what the swarm API offers: SIGTERM scales the
// service to 0 replicas (the swarm sends the task SIGTERM, then SIGKILL
// after the stop grace period, which the same update sets to the launcher's
// grace; on Docker 20.10 the task is stopped 3-4 s after the update, and
// once stopped it is deleted, so its exit code is usually not known);
// SIGKILL removes the service (the task still gets what is left of its stop
// grace period; the service leaves the list at once). A unit's state is its newest task's: new ...
// starting -> "created", running -> "running", complete, failed, shutdown,
// rejected, orphaned -> "exited" (a task the swarm rejected, e.g. for a
// missing image, is an exit with the swarm's reason as the start error); a
// service with no task is "created", or "exited" once scaled to 0.
//
// Constructors check the options only (std::invalid_argument or
// std::runtime_error; no engine call). Check() asks the engine (socket, API
// version, image, network; the swarm also: a manager, an overlay network)
// and throws std::runtime_error saying what is wrong and what to do. An
// engine is used by one thread at a time (the launcher's engine thread once
// it runs); every call is bounded by the options' api_timeout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autoscaler/docker_mount.h"
#include "common/clock.h"
#include "common/http_client.h"

namespace fleet::autoscaler {

inline constexpr const char* kDockerApiVersion = "v1.41";  // Docker Engine 20.10
// The labels every launcher puts on its units and selects them by.
inline constexpr const char* kPoolLabel = "fleet.pool";
inline constexpr const char* kIdLabel = "fleet.worker-id";

struct DockerOptions {
  // The engine: its unix socket ("/var/run/docker.sock" or
  // "unix:///var/run/docker.sock"), or "tcp://HOST:PORT" (TLS with the
  // client certificate in tls_dir; never plain TCP).
  std::string socket_path = "/var/run/docker.sock";
  // For tcp:// engines: a directory with ca.pem (the engine's CA),
  // cert.pem and key.pem (this client's), as DOCKER_CERT_PATH holds them.
  std::string tls_dir;
  std::string image = "fleet:latest";
  // NetworkMode of the workers: a network name ("fleet_internal"), "host",
  // or "" for the engine's default bridge. Swarm: an overlay network of the
  // swarm (a stack's "internal" network is STACK_internal), or "" for none.
  std::string network;
  // Value of the fleet.pool label; also the container or service name prefix.
  std::string pool = "fleet";
  // Program inside the image, and shell words after --id (like the process
  // launcher's --worker-args).
  std::string worker_command = "fleet-worker";
  std::string worker_args;
  // KEY=VALUE pairs for the container's environment.
  std::vector<std::string> env;
  // Read-only bind mounts into every worker (host paths as the engine on
  // the host sees them), e.g. the worker's CURVE key and the broker's
  // public key. Checked by the constructor (CheckDockerMounts). Swarm: the
  // path must exist on every node a worker may run on.
  std::vector<DockerMount> mounts;
  // The worker serves /metrics on 0.0.0.0:PORT (FLEET_METRICS) and the
  // container is labelled with the port; 0 turns it off.
  int metrics_port = 9752;
  std::int64_t memory_bytes = 512ll << 20;  // 0 = no limit
  std::int64_t pids_limit = 256;            // 0 = no limit
  double cpus = 0;                          // 0 = no limit
  // Swarm only: placement constraints ("node.role==worker",
  // "node.labels.zone!=b") and spread preferences (a node label such as
  // "node.labels.zone": tasks spread evenly over its values). Memory and
  // CPUs above are also reserved on the node, which is what the swarm
  // schedules by.
  std::vector<std::string> constraints;
  std::vector<std::string> spread;
  // Swarm only: the service's stop grace period (a `docker service rm` or
  // `docker stack rm` by hand gives the worker this long to drain); the
  // autoscaler's own stops set it to their grace.
  Duration stop_grace = Seconds(30);
  // Kubernetes only (--launcher kubernetes, kubernetes_engine.h).
  std::string kube_api;           // API server URL; empty: from kubeconfig or in-cluster
  std::string kube_config;        // kubeconfig file (YAML or JSON); empty: in-cluster
  std::string kube_namespace;     // empty: the kubeconfig context's, the pod's, or default
  std::string kube_pod_template;  // a Pod manifest file (YAML or JSON); empty: built in
  std::string kube_owner_pod;     // the autoscaler's own pod (owner of the workers' pods)
  // Each Engine API call waits at most this.
  std::chrono::milliseconds api_timeout{10000};
};

class ContainerEngine {
 public:
  // One unit of the pool as the engine lists it.
  struct Unit {
    std::string handle;     // container or service id
    std::string worker_id;  // its fleet.worker-id label; empty if none
    std::string state;      // created, running, restarting, paused, exited, dead
    // Why a unit is not running yet, when the engine says (a pod that
    // cannot be scheduled, an image that cannot be pulled); for logs.
    std::string note;
  };

  virtual ~ContainerEngine() = default;
  // Asks the engine whether it can run the pool's workers (see above).
  virtual void Check() = 0;
  // Whether the last call got no answer at all (refused, timed out): the
  // engine is down or unreachable, as opposed to refusing the request.
  bool unreachable() const { return unreachable_; }
  // The engine as configured, for logs.
  const std::string& address() const { return address_; }
  // "docker" or "swarm" (the launcher's name in logs).
  virtual const char* kind() const = 0;
  // What a unit is called in logs: "container" or "service".
  virtual const char* unit_word() const = 0;
  // The unit's name for worker `id` ("POOL-ID").
  std::string UnitName(const std::string& id) const { return options_.pool + "-" + id; }
  // The JSON body of the create call for worker `id`.
  virtual std::string CreateBody(const std::string& id) const = 0;
  // Creates and starts the unit; its handle, or "" with `error` set.
  virtual std::string Create(const std::string& id, const std::string& body,
                             std::string* error) = 0;
  // The pool's units; nullopt with `error` set when the engine did not
  // answer as expected.
  virtual std::optional<std::vector<Unit>> List(std::string* error) = 0;
  // The exit code of an exited unit (-1 when unknown); `start_error` is set
  // when the unit never ran (the engine's reason).
  virtual int ExitCode(const std::string& handle, std::string* start_error) = 0;
  // SIGTERM or SIGKILL to worker `id`'s unit; `grace` is what the worker
  // has between the two (the swarm's stop grace period).
  virtual void Signal(const std::string& id, const std::string& handle, const char* signal,
                      Duration grace) = 0;
  virtual void Remove(const std::string& handle, const std::string& what) = 0;

  const DockerOptions& options() const { return options_; }

 protected:
  explicit ContainerEngine(DockerOptions options) : options_(std::move(options)) {}
  // The worker's environment and the /bin/sh command of the template.
  std::vector<std::string> Env() const;
  std::string Command(const std::string& id) const;

  DockerOptions options_;
  std::string address_;  // for logs: the socket, tcp:// address or API URL
  bool unreachable_ = false;
};

// What the Docker and Swarm engines share: the Docker Engine API on a unix
// socket or over TCP with TLS.
class DockerApiEngine : public ContainerEngine {
 protected:
  // Checks the mounts and the address (std::invalid_argument).
  explicit DockerApiEngine(DockerOptions options);
  // One Engine API call (path after the version, e.g. "/containers/json").
  http::HttpResponse Call(http::Method method, const std::string& path,
                          const std::string& body = {});
  // Socket, ping, API version, image (`need_image`: missing is an error;
  // else a warning), and a named network (returned, as the engine's JSON
  // text, for the caller to check further; "" when none was looked up).
  // Returns the engine's API version.
  std::string CheckEngine(bool need_image, std::string* network_json);
  http::HttpResponse Get(const std::string& path);  // unversioned: /_ping, /version, /info

  std::string base_url_;  // http://docker (unix socket) or https://HOST:PORT
  http::HttpClient http_;
  http::HttpOptions http_options_;
};

class DockerEngine : public DockerApiEngine {
 public:
  explicit DockerEngine(DockerOptions options);
  void Check() override;
  const char* kind() const override { return "docker"; }
  const char* unit_word() const override { return "container"; }
  std::string CreateBody(const std::string& id) const override;
  std::string Create(const std::string& id, const std::string& body, std::string* error) override;
  std::optional<std::vector<Unit>> List(std::string* error) override;
  int ExitCode(const std::string& handle, std::string* start_error) override;
  void Signal(const std::string& id, const std::string& handle, const char* signal,
              Duration grace) override;
  void Remove(const std::string& handle, const std::string& what) override;
};

class SwarmEngine : public DockerApiEngine {
 public:
  explicit SwarmEngine(DockerOptions options);
  void Check() override;
  const char* kind() const override { return "swarm"; }
  const char* unit_word() const override { return "service"; }
  std::string CreateBody(const std::string& id) const override;
  std::string Create(const std::string& id, const std::string& body, std::string* error) override;
  std::optional<std::vector<Unit>> List(std::string* error) override;
  int ExitCode(const std::string& handle, std::string* start_error) override;
  void Signal(const std::string& id, const std::string& handle, const char* signal,
              Duration grace) override;
  void Remove(const std::string& handle, const std::string& what) override;

 private:
  // The service's newest task (JSON), or null when it has none (yet).
  std::optional<std::string> NewestTask(const std::string& service, std::string* error);
};

// The message of a Docker Engine API error body ({"message": "..."}), or
// the body itself when it is not that JSON.
std::string DockerErrorMessage(const http::HttpResponse& response);

// "512m" -> bytes (b, k, m, g with optional b/ib; no unit: bytes).
std::optional<std::int64_t> ParseByteSize(const std::string& text);

}  // namespace fleet::autoscaler

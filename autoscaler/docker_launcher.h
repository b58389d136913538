// DockerLauncher: runs each worker as a container through the Docker Engine
// API on its unix socket (API version pinned, see kDockerApiVersion).
//
// Containers come from one fixed template: the configured image running
//   /bin/sh -c 'exec fleet-worker --id ID WORKER_ARGS'
// under docker-init, never privileged, all capabilities dropped,
// no-new-privileges, read-only root (a small tmpfs on /tmp), memory and pids
// limits, restart policy "no" (the autoscaler replaces workers, the engine
// must not resurrect retired ones), no binds but the checked, read-only,
// non-recursive --docker-mount ones (see docker_mount.h), and the labels
//   fleet.pool=POOL fleet.role=worker fleet.worker-id=ID
//   fleet.metrics-port=PORT (when the worker serves /metrics)
// which Prometheus' docker_sd_configs and this launcher select on. The
// launcher never touches a container without its pool label.
//
// Each Poll lists the pool's containers once: an exited container is
// reported (with its exit code) and removed; a running one it did not start
// (left by an earlier autoscaler run) is adopted (TakeAdopted), an exited or
// never-started one it does not know is removed. Stop gives the worker its
// grace to drain and leave by itself, then SIGTERM, then SIGKILL after the
// grace again, as the process launcher does.
//
// Start blocks for the create and start calls (tens to hundreds of ms);
// StopAll up to 2 x grace. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autoscaler/docker_mount.h"
#include "autoscaler/launcher.h"
#include "common/http_client.h"

namespace fleet::autoscaler {

inline constexpr const char* kDockerApiVersion = "v1.41";  // Docker Engine 20.10

struct DockerOptions {
  std::string socket_path = "/var/run/docker.sock";
  std::string image = "fleet:latest";
  // NetworkMode of the workers: a network name ("fleet_internal"), "host",
  // or "" for the engine's default bridge.
  std::string network;
  // Value of the fleet.pool label; also the container name prefix.
  std::string pool = "fleet";
  // Program inside the image, and shell words after --id (like the process
  // launcher's --worker-args).
  std::string worker_command = "fleet-worker";
  std::string worker_args;
  // KEY=VALUE pairs for the container's environment.
  std::vector<std::string> env;
  // Read-only bind mounts into every worker (host paths as the engine on
  // the host sees them), e.g. the worker's CURVE key and the broker's
  // public key. Checked by the constructor (CheckDockerMounts).
  std::vector<DockerMount> mounts;
  // The worker serves /metrics on 0.0.0.0:PORT (FLEET_METRICS) and the
  // container is labelled with the port; 0 turns it off.
  int metrics_port = 9752;
  std::int64_t memory_bytes = 512ll << 20;  // 0 = no limit
  std::int64_t pids_limit = 256;            // 0 = no limit
  double cpus = 0;                          // 0 = no limit
  // Each Engine API call waits at most this.
  std::chrono::milliseconds api_timeout{10000};
};

class DockerLauncher : public Launcher {
 public:
  // Checks the mounts (std::invalid_argument, before any engine call), then
  // that the engine answers on the socket, speaks API >= 1.41, has the
  // image and (when named) the network. Throws std::runtime_error with a
  // message saying what is wrong and what to do.
  explicit DockerLauncher(DockerOptions options);
  // Leaves the containers running: a restarted autoscaler adopts them.
  ~DockerLauncher() override = default;

  const char* name() const override { return "docker"; }
  bool Start(const std::string& id, TimePoint now, std::string* error) override;
  void Stop(const std::string& id, Duration grace, TimePoint now) override;
  void CancelStop(const std::string& id) override;
  std::vector<Exited> Poll(TimePoint now) override;
  std::vector<std::string> TakeAdopted() override;
  std::vector<std::string> Alive() const override;
  void StopAll(Duration grace) override;

  // The container name for worker `id` ("POOL-ID").
  std::string ContainerName(const std::string& id) const;
  // The JSON body of the create call for worker `id` (for tests and logs).
  std::string CreateBody(const std::string& id) const;

 private:
  struct Worker {
    std::string container;  // engine id
    std::optional<TimePoint> term_at;
    std::optional<TimePoint> kill_at;
    Duration grace{};
    bool termed = false;
  };
  struct Listed {
    std::string container;
    std::string worker_id;
    std::string state;  // created, running, exited, dead, ...
  };

  http::HttpResponse Call(http::Method method, const std::string& path,
                          const std::string& body = {});
  // The pool's containers; nullopt (logged) when the engine did not answer.
  std::optional<std::vector<Listed>> List();
  int ExitCode(const std::string& container);
  void Signal(const std::string& id, const std::string& container, const char* signal);
  void Remove(const std::string& container, const std::string& what);

  DockerOptions options_;
  http::HttpClient http_;
  http::HttpOptions http_options_;
  std::map<std::string, Worker> workers_;  // by worker id
  std::vector<std::string> adopted_;       // since the last TakeAdopted
  bool list_failing_ = false;              // one log line per outage
};

// The message of a Docker Engine API error body ({"message": "..."}), or
// the body itself when it is not that JSON.
std::string DockerErrorMessage(const http::HttpResponse& response);

// Parses a memory size: bytes, or a number with k, m, g (powers of 1024).
// nullopt when malformed or negative.
std::optional<std::int64_t> ParseByteSize(const std::string& text);

}  // namespace fleet::autoscaler

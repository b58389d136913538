// fleet-autoscaler: sizes the worker pool from the broker's metrics. See
// DESIGN.md (Autoscaler) and the README's policy section.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

#include "autoscaler/autoscaler.h"
#include "autoscaler/command_launcher.h"
#include "autoscaler/docker_launcher.h"
#include "autoscaler/kubernetes_engine.h"
#include "autoscaler/process_launcher.h"
#include "common/curve.h"
#include "common/endpoint.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/metrics_server.h"
#include "common/signals.h"
#include "fleet/errors.h"

namespace {

fleet::Duration SecondsToDuration(double s) {
  return std::chrono::duration_cast<fleet::Duration>(std::chrono::duration<double>(s));
}

std::string RandomTag() {
  std::random_device rd;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x", static_cast<unsigned>(rd() & 0xffff));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fleet;
  using namespace fleet::autoscaler;
  AutoscalerOptions o;
  PolicyOptions& p = o.policy;
  std::string control = "tcp://127.0.0.1:5557";
  std::string source_spec = "http://127.0.0.1:9750/metrics";
  std::string launcher_kind = "process";
  std::string worker_args, worker_bin, start_command, stop_command, policy = "backlog";
  std::string metrics = "0.0.0.0:9751", log_level = "info";
  double idle_s = 60, cooldown_s = 30, stabilization_s = 60, start_timeout_s = 30;
  double grace_s = 30, drain_s = 10, staleness_s = 10, metrics_timeout_s = 2;
  int poll_ms = 1000;
  DockerOptions docker;
  std::string docker_memory = "512m";

  CLI::App app("fleet-autoscaler: starts workers when work waits and retires idle ones "
               "through the broker (retire-if-idle + blacklist), so scaling never loses or "
               "fails a batch.\nExit 0 on a stop signal, 1 on a failure, 2 on bad flags, 3 when "
               "the broker refuses the control client's handshake (authentication failed).");
  app.add_option("--control", control, "the broker's control endpoint")->capture_default_str();
  app.add_option("--metrics-source", source_spec,
                 "the broker's /metrics URL, or prometheus:http://HOST:9090 to query a "
                 "Prometheus server")->capture_default_str();
  app.add_option("--metrics-timeout", metrics_timeout_s,
                 "seconds (decimals allowed) one metrics read may take, all of its queries "
                 "together; a read that runs into it is counted "
                 "(fleet_autoscaler_metric_source_timeouts_total) and changes nothing: "
                 "scale-down frozen, scale-up from the broker's stats. Reads run off the loop, so "
                 "decisions go on meanwhile")
      ->capture_default_str()->check(CLI::Range(0.05, 60.0));
  std::string source_auth_file;
  app.add_option("--metrics-source-auth-file", source_auth_file,
                 "HTTP basic auth for --metrics-source (a broker started with "
                 "--metrics-auth-file, or a Prometheus behind auth): a file holding one line "
                 "user:password, mode 0600 or 0400");
  app.add_option("--launcher", launcher_kind, "how workers start: process (local child "
                 "processes), docker (containers through the Docker Engine API), swarm (one "
                 "Docker Swarm service per worker, through a manager's Engine API; the "
                 "--docker-* flags apply), kubernetes (one Pod per worker through the Kubernetes "
                 "API; --docker-image, -memory, -cpus, -env, -pool, -worker-metrics-port apply), "
                 "command (your own start/stop commands)")
      ->capture_default_str()
      ->check(CLI::IsMember({"process", "command", "docker", "swarm", "kubernetes"}));
  app.add_option("--worker-args", worker_args,
                 "shell words passed to each fleet-worker after --id (process and docker "
                 "launchers), "
                 "e.g. \"--broker tcp://127.0.0.1:5556 --handler sleep\"");
  app.add_option("--worker-bin", worker_bin,
                 "fleet-worker to run (default: the one beside this program; docker: "
                 "fleet-worker in the image)");
  app.add_option("--start-command", start_command,
                 "command launcher: /bin/sh command that starts worker {id}");
  app.add_option("--stop-command", stop_command,
                 "command launcher: /bin/sh command that stops worker {id}");
  app.add_option("--docker-socket", docker.socket_path,
                 "docker and swarm launchers: the Docker Engine's unix socket (swarm: a "
                 "manager's)")->capture_default_str();
  std::vector<std::string> docker_engines;
  app.add_option("--docker-engine", docker_engines,
                 "docker launcher: an engine to run workers on, instead of --docker-socket: a "
                 "unix socket path, or tcp://HOST:PORT with TLS (--docker-tls-dir). Repeat it "
                 "(or comma-separate in FLEET_DOCKER_ENGINE) to spread the workers over several "
                 "engines: each start goes to the answering engine with the fewest workers; one "
                 "that fails is skipped until it answers again")->delimiter(',');
  app.add_option("--docker-tls-dir", docker.tls_dir,
                 "docker launcher: directory with ca.pem, cert.pem and key.pem (the engines' CA "
                 "and this client's certificate) for tcp:// engines");
  app.add_option("--docker-image", docker.image, "docker launcher: image the workers run")
      ->capture_default_str();
  app.add_option("--docker-network", docker.network,
                 "docker launcher: network the workers join (name, \"host\", or empty for the "
                 "default bridge)");
  app.add_option("--docker-pool", docker.pool,
                 "docker launcher: value of the fleet.pool label on its containers; it adopts "
                 "and touches only containers carrying it")->capture_default_str();
  app.add_option("--docker-env", docker.env,
                 "docker launcher: KEY=VALUE for the workers' environment (repeatable; "
                 "comma-separated in FLEET_DOCKER_ENV)")->delimiter(',');
  std::vector<std::string> docker_mounts;
  app.add_option("--docker-mount", docker_mounts,
                 "docker launcher: HOST_PATH:CONTAINER_PATH bind-mounted read-only into every "
                 "worker, e.g. a CURVE key (repeatable; comma-separated in FLEET_DOCKER_MOUNT). "
                 "HOST_PATH is resolved by the Docker engine on the host, not in this "
                 "container; both absolute; the Docker socket, /, /proc, /sys, /dev are "
                 "refused")->delimiter(',');
  app.add_option("--docker-memory", docker_memory,
                 "docker launcher: memory limit per worker (bytes, or k/m/g; 0 = none)")
      ->capture_default_str();
  app.add_option("--docker-pids-limit", docker.pids_limit,
                 "docker launcher: most processes per worker container (0 = none)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 22));
  app.add_option("--docker-cpus", docker.cpus, "docker launcher: CPUs per worker (0 = no limit)")
      ->capture_default_str()->check(CLI::Range(0.0, 1024.0));
  app.add_option("--swarm-constraint", docker.constraints,
                 "swarm launcher: placement constraint of every worker's service, e.g. "
                 "node.role==worker or node.labels.pool==fleet (repeatable; comma-separated in "
                 "FLEET_SWARM_CONSTRAINT)")->delimiter(',');
  app.add_option("--swarm-spread", docker.spread,
                 "swarm launcher: spread the workers evenly over the values of this node "
                 "label, e.g. node.labels.zone (repeatable; comma-separated in "
                 "FLEET_SWARM_SPREAD)")->delimiter(',');
  app.add_option("--kubeconfig", docker.kube_config,
                 "kubernetes launcher: kubeconfig file (YAML or JSON; its current context's "
                 "server, credentials and namespace); without it, the pod's service account "
                 "in the cluster");
  app.add_option("--kube-api", docker.kube_api,
                 "kubernetes launcher: the API server's URL, over the kubeconfig's or the "
                 "cluster's");
  app.add_option("--kube-namespace", docker.kube_namespace,
                 "kubernetes launcher: namespace of the worker pods (default: the kubeconfig "
                 "context's, the service account's, or default)");
  app.add_option("--kube-pod-template", docker.kube_pod_template,
                 "kubernetes launcher: a Pod manifest (YAML or JSON) the worker pods are made "
                 "from: node selector, tolerations, resources, image, service account... (its "
                 "container named worker, or the first, runs fleet-worker)");
  app.add_option("--kube-owner-pod", docker.kube_owner_pod,
                 "kubernetes launcher: this autoscaler's own pod (downward API metadata.name): "
                 "the owner of every worker pod, so that none outlives it");
  app.add_option("--docker-worker-metrics-port", docker.metrics_port,
                 "docker launcher: port of each worker's /metrics (labelled for Prometheus' "
                 "docker_sd_configs); 0 = off")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--policy", policy, "backlog (queued+inflight per worker) or throughput "
                 "(arrival rate x processing time, Little's law)")->capture_default_str()
      ->check(CLI::IsMember({"backlog", "throughput"}));
  app.add_option("--min", p.min_workers, "fewest workers")->capture_default_str()
      ->check(CLI::Range(0, 10000));
  app.add_option("--max", p.max_workers, "most workers")->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("--initial", p.initial_workers, "workers to start with")->capture_default_str();
  app.add_option("--target-per-worker", p.target_per_worker,
                 "backlog policy: batches (queued + in flight) per worker")->capture_default_str();
  app.add_option("--max-step", p.max_step, "most workers added per poll")->capture_default_str();
  app.add_option("--max-step-down", p.max_step_down, "most workers retired per poll")
      ->capture_default_str();
  app.add_option("--min-survivors", p.min_survivors,
                 "never retire below max(--min, this)")->capture_default_str();
  app.add_option("--idle-seconds", idle_s, "retire only workers idle at least this long")
      ->capture_default_str();
  app.add_option("--cooldown-seconds", cooldown_s, "between two scale-downs")
      ->capture_default_str();
  app.add_option("--stabilization-seconds", stabilization_s,
                 "scale down only to the highest desired of this trailing window")
      ->capture_default_str();
  app.add_option("--target-drain-seconds", drain_s,
                 "throughput policy: drain a backlog within this")->capture_default_str();
  app.add_option("--start-timeout-seconds", start_timeout_s,
                 "a started worker not registered by then is killed (and launches back off)")
      ->capture_default_str()->check(CLI::Range(1.0, 600.0));
  app.add_option("--grace-seconds", grace_s,
                 "a retired worker gets this long to drain before SIGTERM, then as long "
                 "again before SIGKILL; make it longer than your longest batch")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  app.add_option("--max-staleness-seconds", staleness_s,
                 "metrics older than this freeze scale-down (prometheus: source)")
      ->capture_default_str()->check(CLI::Range(1.0, 3600.0));
  app.add_option("--poll-ms", poll_ms, "time between decisions")->capture_default_str()
      ->check(CLI::Range(50, 600000));
  app.add_option("--id-prefix", o.pool.id_prefix,
                 "prefix of worker ids this autoscaler starts and adopts")->capture_default_str();
  app.add_option("--metrics", metrics,
                 "ADDRESS:PORT to bind its own /metrics on (0.0.0.0: every interface, "
                 "127.0.0.1: this host only; port 0 picks one; \"\" turns it off); only "
                 "/metrics is served")
      ->capture_default_str();
  std::string metrics_auth_file;
  AddMetricsAuthFlag(app, &metrics_auth_file);
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  std::string curve_server_key, curve_key;
  AddCurveClientFlags(app, &curve_server_key, &curve_key);
  if (int rc = ParseFlags(app, argc, argv); rc >= 0) return rc;
  std::optional<BasicAuth> metrics_auth, source_auth;
  try {
    metrics_auth = LoadMetricsFlags(metrics, metrics_auth_file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet-autoscaler: %s\n", e.what());
    return 2;
  }
  try {
    if (!source_auth_file.empty()) source_auth = ReadBasicAuthFile(source_auth_file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet-autoscaler: --metrics-source-auth-file: %s\n", e.what());
    return 2;
  }
  try {
    CheckEndpoint("--control", control, EndpointUse::kConnect);
    (void)LoadCurveClient(curve_server_key, curve_key);  // used below; checked first
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet-autoscaler: %s\n", e.what());
    return 2;
  }

  try {
    SetupLogging("fleet-autoscaler", log_level);
    p.kind = *ParsePolicyKind(policy);
    p.idle = SecondsToDuration(idle_s);
    p.cooldown = SecondsToDuration(cooldown_s);
    p.stabilization = SecondsToDuration(stabilization_s);
    p.target_drain = SecondsToDuration(drain_s);
    p.poll = Millis(poll_ms);
    // The arrival rate needs two reads at least: a long poll widens the window.
    p.rate_window = std::max<Duration>(p.rate_window, 2 * p.poll);
    if (p.initial_workers < p.min_workers) p.initial_workers = p.min_workers;
    if (p.max_step > p.max_workers) p.max_step = p.max_workers;
    p.Validate();
    o.pool.start_timeout = SecondsToDuration(start_timeout_s);
    o.grace = SecondsToDuration(grace_s);

    std::unique_ptr<Launcher> launcher;
    if (launcher_kind != "command" && (!start_command.empty() || !stop_command.empty())) {
      spdlog::warn("--start-command/--stop-command are ignored with --launcher {}", launcher_kind);
    }
    if (launcher_kind != "swarm" && (!docker.constraints.empty() || !docker.spread.empty())) {
      spdlog::warn("--swarm-constraint/--swarm-spread are ignored with --launcher {}",
                   launcher_kind);
    }
    if (launcher_kind != "docker" && launcher_kind != "swarm" && !docker_mounts.empty()) {
      spdlog::warn("--docker-mount is ignored with --launcher {}", launcher_kind);
    }
    if (launcher_kind == "command" && (!worker_args.empty() || !worker_bin.empty())) {
      spdlog::warn("--worker-args/--worker-bin are ignored with --launcher command");
    }
    if (launcher_kind == "process") {
      launcher = std::make_unique<ProcessLauncher>(
          worker_bin.empty() ? DefaultWorkerBin() : worker_bin, worker_args);
    } else if (launcher_kind == "command") {
      if (start_command.empty()) {
        throw std::invalid_argument("--launcher command needs --start-command (with {id})");
      }
      launcher = std::make_unique<CommandLauncher>(start_command, stop_command);
    } else {
      auto bytes = ParseByteSize(docker_memory);
      if (!bytes) throw std::invalid_argument("--docker-memory: not a size: " + docker_memory);
      docker.memory_bytes = *bytes;
      if (!worker_bin.empty()) docker.worker_command = worker_bin;
      for (const std::string& spec : docker_mounts) docker.mounts.push_back(ParseDockerMount(spec));
      docker.worker_args = worker_args;
      docker.stop_grace = o.grace;
      if (launcher_kind == "kubernetes") {
        if (!docker_engines.empty() || !docker.constraints.empty() || !docker.spread.empty()) {
          throw std::invalid_argument("--docker-engine, --swarm-constraint and --swarm-spread "
                                      "do not apply to --launcher kubernetes (placement: the "
                                      "pod template's nodeSelector and affinity)");
        }
        launcher = std::make_unique<DockerLauncher>(std::make_unique<KubernetesEngine>(docker));
      } else if (launcher_kind == "swarm") {
        if (!docker_engines.empty()) {
          throw std::invalid_argument("--docker-engine is for the docker launcher; the swarm "
                                      "launcher talks to one manager (--docker-socket)");
        }
        launcher = std::make_unique<DockerLauncher>(std::make_unique<SwarmEngine>(docker));
      } else if (docker_engines.empty()) {
        launcher = std::make_unique<DockerLauncher>(docker);
      } else {
        std::vector<std::unique_ptr<ContainerEngine>> engines;
        for (const std::string& address : docker_engines) {
          DockerOptions one = docker;
          one.socket_path = address;
          engines.push_back(std::make_unique<DockerEngine>(one));
        }
        launcher = std::make_unique<DockerLauncher>(std::move(engines));
      }
    }
    const auto metrics_timeout =
        std::chrono::milliseconds(static_cast<long>(std::lround(metrics_timeout_s * 1000)));
    o.metrics_timeout = metrics_timeout;
    auto source = MakeMetricsSource(
        source_spec, metrics_timeout,
        std::chrono::milliseconds(static_cast<long>(staleness_s * 1000)), source_auth);
    InstallStopSignals();
    zmq::context_t context(1);
    client::ControlClient::Options co;
    co.endpoint = control;
    co.socket.curve = LoadCurveClient(curve_server_key, curve_key);
    client::ControlClient ctl(context, co);
    client::DemandWatch::Options wo;
    wo.endpoint = control;
    wo.socket.curve = co.socket.curve;
    client::DemandWatch watch(context, wo);
    AutoscalerMetrics m(metrics, metrics_auth);
    std::string tag = RandomTag();
    Autoscaler scaler(o, tag, *launcher, *source, ctl, m);
    scaler.SetDemandWatch(&watch);
    spdlog::info("policy {}: min {} max {} target/worker {} idle {} s cooldown {} s "
                 "stabilization {} s poll {} ms; launcher {}; metrics source {} (timeout {} ms); "
                 "control {}; own metrics {}; worker ids {}{}-N",
                 policy, p.min_workers, p.max_workers, p.target_per_worker, idle_s, cooldown_s,
                 stabilization_s, poll_ms, launcher->name(),
                 source->Describe() + (source_auth ? " (basic auth)" : ""),
                 metrics_timeout.count(), control,
                 m.url().empty() ? "off" : m.url(), o.pool.id_prefix, tag);
    SteadyClock clock;
    return scaler.Run(clock, [] { return StopRequested(); });
  } catch (const AuthenticationError& e) {  // the broker refused the control client
    spdlog::error("fleet-autoscaler: {}", e.what());
    return kAuthFailed;
  } catch (const std::invalid_argument& e) {  // contradictory or missing settings
    spdlog::error("fleet-autoscaler: {}", e.what());
    return kUsageError;
  } catch (const std::exception& e) {
    spdlog::error("fleet-autoscaler: {}", e.what());
    return 1;
  }
}

// KubernetesEngine: one Pod per worker through the Kubernetes API
// (--launcher kubernetes), driven by the same launcher loop as the Docker
// and Swarm engines (docker_launcher.h).
//
// Where the API is and who the autoscaler is:
//  - --kubeconfig FILE (YAML or JSON): its current context's cluster
//    (server, certificate-authority[-data]), user (token, tokenFile,
//    client-certificate[-data] and client-key[-data]) and namespace;
//  - otherwise in the cluster: https://$KUBERNETES_SERVICE_HOST:PORT with
//    the pod's service account (token, ca.crt and namespace under
//    /var/run/secrets/kubernetes.io/serviceaccount; the token file is read
//    again every minute, as the kubelet rotates it);
//  - --kube-api URL overrides the server (the credentials stay the
//    kubeconfig's or the service account's), --kube-namespace the namespace.
//
// The pod of worker ID is named POOL-ID, built from --kube-pod-template (a
// Pod manifest; a built-in one without it) and made safe the way the Docker
// launcher's containers are: restartPolicy Never (the autoscaler replaces
// workers; nothing may bring a retired one back), the worker container
// (named "worker", or the first) runs /bin/sh -c 'exec fleet-worker --id ID
// WORKER_ARGS' with the image of --docker-image unless the template names
// one, labels fleet.pool=POOL fleet.role=worker fleet.worker-id=ID (the
// selector it lists and adopts by; it never touches a pod without its pool
// label), resource requests and limits from --docker-memory and
// --docker-cpus unless the template sets them (requests are what a cluster
// autoscaler adds nodes for), and unless the template says otherwise: no
// privilege escalation, all capabilities dropped, a read-only root with an
// emptyDir on /tmp, terminationGracePeriodSeconds = the autoscaler's grace
// (each securityContext default where the template does not set that field).
// A template asking for privileged containers or the host's network, PID or
// IPC namespace is refused. With --kube-owner-pod NAME (the autoscaler's
// own pod, from the downward API) every worker pod has an owner reference
// to it, so deleting the autoscaler's pod deletes its workers (each with its
// grace to drain) and nothing is orphaned; a restart of the autoscaler's
// container within its pod adopts them by their labels.
//
// States: Pending -> "created" (with the reason it is not running yet, when
// the pod says: unschedulable, an image it cannot pull), Running (and
// Unknown) -> "running", Succeeded and Failed -> "exited" (the worker
// container's exit code; a pod that failed before its container ran is a
// failed start with its reason). SIGTERM deletes the pod with the grace as
// its grace period (the kubelet sends SIGTERM, then SIGKILL after it);
// SIGKILL deletes it with grace period 0. A pod that never becomes ready is
// killed by the autoscaler's --start-timeout-seconds like any worker that
// does not register, and counts as a failed start for the backoff.
//
// The constructor reads the files (std::invalid_argument); Check() asks the
// API server (version; may it list, create and delete pods in the namespace
// (a SelfSubjectAccessReview each); the owner pod's uid) and throws
// std::runtime_error saying what is wrong and what to do.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "autoscaler/container_engine.h"

namespace fleet::autoscaler {

class KubernetesEngine : public ContainerEngine {
 public:
  explicit KubernetesEngine(DockerOptions options);
  ~KubernetesEngine() override;
  void Check() override;
  const char* kind() const override { return "kubernetes"; }
  const char* unit_word() const override { return "pod"; }
  std::string CreateBody(const std::string& id) const override;
  std::string Create(const std::string& id, const std::string& body, std::string* error) override;
  std::optional<std::vector<Unit>> List(std::string* error) override;
  int ExitCode(const std::string& handle, std::string* start_error) override;
  void Signal(const std::string& id, const std::string& handle, const char* signal,
              Duration grace) override;
  void Remove(const std::string& handle, const std::string& what) override;

  const std::string& namespace_name() const { return namespace_; }

 private:
  http::HttpResponse Call(http::Method method, const std::string& path,
                          const std::string& body = {});
  void RefreshToken();
  std::string PodsPath() const;  // /api/v1/namespaces/NS/pods
  void Delete(const std::string& pod, long grace_seconds, const std::string& what);

  std::string server_;       // https://HOST:PORT
  std::string namespace_;
  std::string token_;        // bearer token (or empty: client certificate)
  std::string token_file_;   // read again every minute when set
  std::chrono::steady_clock::time_point token_read_{};
  // Private copies of a kubeconfig's *-data certificates and key, removed
  // with the engine, or when its constructor throws after making them.
  struct SecretsDir {
    std::string path;
    ~SecretsDir();
  };
  SecretsDir secrets_dir_;
  nlohmann::json template_;  // the Pod manifest
  std::string owner_uid_;    // set by Check when --kube-owner-pod is
  http::HttpClient http_;
  http::HttpOptions http_options_;
};

}  // namespace fleet::autoscaler

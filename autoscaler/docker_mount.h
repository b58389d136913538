// DockerMount: a read-only bind mount the Docker launcher adds to every
// worker container (--docker-mount HOST_PATH:CONTAINER_PATH), e.g. a CURVE
// key file. It is the one way files from outside reach a worker, so it is
// checked before any container is made:
//   - both paths absolute and clean: no "." or ".." parts, no empty parts
//     ("//"), no trailing "/", no control characters; exactly one ':'
//     (no ":rw" or other options: the mount is always read-only);
//   - the host path is not "/", not the Docker or containerd socket nor a
//     directory holding one (/run, /var/run, /run/containerd, ... and the
//     launcher's --docker-socket), no "*.sock" file, nothing under /proc,
//     /sys, /dev or /var/lib/docker (the engine's own state);
//   - the container path is not "/", not /tmp (the template's tmpfs), not
//     under /proc, /sys or /dev, and not used by two mounts.
// The checks are lexical: HOST_PATH is resolved by the Docker engine on the
// host (the autoscaler usually runs in a container and cannot see it), so a
// symlink on the host that points at the socket is not caught here; keep
// the directory you mount from in the operator's hands.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace fleet::autoscaler {

struct DockerMount {
  std::string host_path;       // on the Docker host, absolute
  std::string container_path;  // inside the worker, absolute
};

// Parses "HOST_PATH:CONTAINER_PATH" and checks it with CheckDockerMount.
// Throws std::invalid_argument saying what is wrong with `spec`.
DockerMount ParseDockerMount(const std::string& spec);

// Throws std::invalid_argument when `mount` breaks a rule above;
// `docker_socket` (the launcher's socket path) is refused as well.
void CheckDockerMount(const DockerMount& mount, const std::string& docker_socket);

// CheckDockerMount on each, and no container path twice. Throws
// std::invalid_argument naming the mount.
void CheckDockerMounts(const std::vector<DockerMount>& mounts, const std::string& docker_socket);

}  // namespace fleet::autoscaler

#include "autoscaler/docker_mount.h"

#include <algorithm>
#include <optional>
#include <set>
#include <stdexcept>

namespace fleet::autoscaler {

namespace {

using Parts = std::vector<std::string>;

// The components of a clean absolute path; nullopt when it is not one. We
// refuse rather than normalise ("/a/../b", "/a//b", "/a/"): a path that
// needs cleaning is more likely a mistake or a trick than an intent, and the
// engine would resolve it on another machine than the one we check on.
std::optional<Parts> CleanParts(const std::string& path) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  if (path == "/") return Parts{};
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return std::nullopt;
  }
  Parts parts;
  std::size_t start = 1;
  while (true) {
    const std::size_t slash = path.find('/', start);
    std::string part = path.substr(start, slash == std::string::npos ? slash : slash - start);
    if (part.empty() || part == "." || part == "..") return std::nullopt;
    parts.push_back(std::move(part));
    if (slash == std::string::npos) return parts;
    start = slash + 1;
  }
}

Parts Split(const char* clean_path) { return *CleanParts(clean_path); }

// `path` is `prefix` or lies below it.
bool Within(const Parts& path, const Parts& prefix) {
  return path.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

[[noreturn]] void Refuse(const DockerMount& m, const std::string& why) {
  throw std::invalid_argument("--docker-mount " + m.host_path + ":" + m.container_path + ": " +
                              why);
}

}  // namespace

DockerMount ParseDockerMount(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) {
    throw std::invalid_argument("--docker-mount " + spec +
                                ": expected HOST_PATH:CONTAINER_PATH (both absolute)");
  }
  if (spec.find(':', colon + 1) != std::string::npos) {
    throw std::invalid_argument(
        "--docker-mount " + spec +
        ": more than one ':' (no options such as :rw; the mount is always read-only, and "
        "paths with ':' are not supported)");
  }
  DockerMount m{spec.substr(0, colon), spec.substr(colon + 1)};
  CheckDockerMount(m, "");
  return m;
}

void CheckDockerMount(const DockerMount& m, const std::string& docker_socket) {
  const std::optional<Parts> host = CleanParts(m.host_path);
  if (!host) {
    Refuse(m, "the host path must be a clean absolute path (no relative path, \".\", \"..\", "
              "\"//\" or trailing \"/\"); it is resolved by the Docker engine on the host");
  }
  const std::optional<Parts> target = CleanParts(m.container_path);
  if (!target) Refuse(m, "the container path must be a clean absolute path");
  if (m.host_path.find(':') != std::string::npos ||
      m.container_path.find(':') != std::string::npos) {
    Refuse(m, "paths with ':' are not supported");
  }

  if (host->empty()) Refuse(m, "refusing to mount the host's root directory");
  for (const char* system : {"/proc", "/sys", "/dev", "/var/lib/docker", "/var/lib/containerd"}) {
    if (Within(*host, Split(system))) {
      Refuse(m, std::string("refusing to mount host ") + system + " or anything below it");
    }
  }
  // Whoever reaches the engine's socket is root on the host: neither the
  // socket nor a directory that holds it goes into a worker.
  std::vector<Parts> sockets;
  for (const char* s : {"/var/run/docker.sock", "/run/docker.sock",
                        "/run/containerd/containerd.sock", "/var/run/containerd/containerd.sock"}) {
    sockets.push_back(Split(s));
  }
  if (auto own = CleanParts(docker_socket); own && !own->empty()) sockets.push_back(*own);
  for (const Parts& socket : sockets) {
    if (Within(socket, *host)) {
      Refuse(m, "refusing to mount the Docker/containerd socket or a directory holding it "
                "(access to it is root on the host)");
    }
  }
  const std::string& name = host->back();
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".sock") == 0) {
    Refuse(m, "refusing to mount a socket (*.sock) into a worker");
  }

  if (target->empty()) Refuse(m, "refusing to mount over the container's root");
  if (*target == Split("/tmp")) Refuse(m, "/tmp in a worker is its own tmpfs; pick another path");
  for (const char* system : {"/proc", "/sys", "/dev"}) {
    if (Within(*target, Split(system))) {
      Refuse(m, std::string("refusing to mount onto ") + system + " or below it in the container");
    }
  }
}

void CheckDockerMounts(const std::vector<DockerMount>& mounts, const std::string& docker_socket) {
  std::set<std::string> targets;
  for (const DockerMount& m : mounts) {
    CheckDockerMount(m, docker_socket);
    if (!targets.insert(m.container_path).second) {
      Refuse(m, "a second mount onto " + m.container_path);
    }
  }
}

}  // namespace fleet::autoscaler

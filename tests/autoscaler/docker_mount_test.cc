// --docker-mount specs: what gets through and why the rest is refused.
#include "autoscaler/docker_mount.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace fleet::autoscaler {
namespace {

using ::testing::HasSubstr;

std::string RefusalOf(const std::string& spec) {
  try {
    ParseDockerMount(spec);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(DockerMountTest, ParsesHostAndContainerPath) {
  DockerMount m = ParseDockerMount("/srv/fleet/keys/worker.key:/run/secrets/worker.key");
  EXPECT_EQ(m.host_path, "/srv/fleet/keys/worker.key");
  EXPECT_EQ(m.container_path, "/run/secrets/worker.key");
  // A directory, and names that only look like system paths, are fine.
  EXPECT_NO_THROW(ParseDockerMount("/srv/fleet/keys:/keys"));
  EXPECT_NO_THROW(ParseDockerMount("/run/fleet-keys/broker.pub:/run/secrets/broker.pub"));
  EXPECT_NO_THROW(ParseDockerMount("/devices/x:/procedures/x"));
  EXPECT_NO_THROW(ParseDockerMount("/home/op/sockets.txt:/etc/fleet/sockets.txt"));
}

TEST(DockerMountTest, RefusesMalformedSpecsAndOptions) {
  const std::pair<const char*, const char*> cases[] = {
      {"/srv/keys", "expected HOST_PATH:CONTAINER_PATH"},
      {"", "expected HOST_PATH:CONTAINER_PATH"},
      {"/srv/keys:/keys:rw", "more than one ':'"},
      {"/srv/keys:/keys:ro", "always read-only"},
      {"/srv/a:b:/keys", "more than one ':'"},
      {"keys:/keys", "clean absolute path"},
      {"./keys:/keys", "clean absolute path"},
      {":/keys", "clean absolute path"},
      {"/srv/../var/run/docker.sock:/s", "clean absolute path"},
      {"/srv/./keys:/keys", "clean absolute path"},
      {"/srv//keys:/keys", "clean absolute path"},
      {"/srv/keys/:/keys", "clean absolute path"},
      {"/srv/ke\nys:/keys", "clean absolute path"},
      {"/srv/keys:keys", "container path must be a clean absolute path"},
      {"/srv/keys:/run/../etc", "container path must be a clean absolute path"},
      {"/srv/keys:", "container path must be a clean absolute path"},
  };
  for (const auto& [spec, why] : cases) {
    EXPECT_THAT(RefusalOf(spec), HasSubstr(why)) << spec;
  }
}

TEST(DockerMountTest, RefusesTheDockerSocketAndWhatHoldsIt) {
  for (const char* spec : {"/var/run/docker.sock:/var/run/docker.sock",
                           "/run/docker.sock:/x/d.sock", "/var/run:/host-run", "/run:/r",
                           "/var:/v", "/run/containerd:/c",
                           "/run/containerd/containerd.sock:/c.sock"}) {
    EXPECT_THAT(RefusalOf(spec), HasSubstr("socket")) << spec;
  }
  // Any *.sock file (a rootless engine's, podman's), wherever it is.
  EXPECT_THAT(RefusalOf("/run/user/1000/docker.sock:/d"), HasSubstr("*.sock"));
  // The launcher's own --docker-socket, when it lives somewhere unusual.
  EXPECT_THAT(
      [] {
        try {
          CheckDockerMount({"/srv/engine", "/e"}, "/srv/engine/api");
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        }
        return std::string("(accepted)");
      }(),
      HasSubstr("socket"));
  EXPECT_NO_THROW(CheckDockerMount({"/srv/keys", "/keys"}, "/srv/engine/api"));
}

TEST(DockerMountTest, RefusesSystemPathsOnEitherSide) {
  const std::pair<const char*, const char*> cases[] = {
      {"/:/host", "root directory"},
      {"/proc:/p", "host /proc"},
      {"/proc/1/root:/p", "host /proc"},
      {"/sys/fs/cgroup:/c", "host /sys"},
      {"/dev/sda:/d", "host /dev"},
      {"/var/lib/docker/containers:/c", "host /var/lib/docker"},
      {"/srv/keys:/", "container's root"},
      {"/srv/keys:/tmp", "tmpfs"},
      {"/srv/keys:/proc/keys", "onto /proc"},
      {"/srv/keys:/dev", "onto /dev"},
      {"/srv/keys:/sys/x", "onto /sys"},
  };
  for (const auto& [spec, why] : cases) {
    EXPECT_THAT(RefusalOf(spec), HasSubstr(why)) << spec;
  }
}

TEST(DockerMountTest, RefusesTwoMountsOntoOnePath) {
  std::vector<DockerMount> mounts = {{"/srv/a.key", "/run/secrets/worker.key"},
                                     {"/srv/b.key", "/run/secrets/worker.key"}};
  try {
    CheckDockerMounts(mounts, "/var/run/docker.sock");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("a second mount onto /run/secrets/worker.key"));
  }
  mounts[1].container_path = "/run/secrets/broker.pub";
  EXPECT_NO_THROW(CheckDockerMounts(mounts, "/var/run/docker.sock"));
}

}  // namespace
}  // namespace fleet::autoscaler

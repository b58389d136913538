// DockerLauncher against the real Docker engine: worker containers from the
// fleet image (docker/build-images.sh, the docker_images fixture) on the
// host network, serving a real broker on 127.0.0.1.
#include "autoscaler/docker_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tests/support/cluster.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using autoscaler::DockerLauncher;
using autoscaler::DockerOptions;
using autoscaler::Exited;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string Image() {
  const char* e = std::getenv("FLEET_IMAGE");
  return e != nullptr && *e != '\0' ? e : "fleet:latest";
}

// The docker CLI from PATH (Run execs without a PATH search).
std::string DockerCli() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string candidate = dir + "/docker";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "/usr/bin/docker";
}

RunResult Docker(std::vector<std::string> args, const TempDir& dir) {
  static int calls = 0;  // one log per call: Run appends to its log
  args.insert(args.begin(), DockerCli());
  return Run(std::move(args), seconds(60), dir.File("docker-" + std::to_string(++calls) + ".log"));
}

// `docker inspect` of a container by name, or null when there is none.
json Inspect(const std::string& name, const TempDir& dir) {
  RunResult r = Docker({"container", "inspect", name}, dir);
  if (r.exit_code != 0) return nullptr;
  std::size_t start = r.output.find('[');
  if (start == std::string::npos) return nullptr;
  json j = json::parse(r.output.substr(start), nullptr, false);
  return j.is_array() && !j.empty() ? j[0] : json();
}

bool AtBroker(Cluster& c, const std::string& id) {
  for (const json& w : c.Workers()) {
    if (w.value("id", "") == id) return true;
  }
  return false;
}

class DockerLauncherEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/var/run/docker.sock", F_OK) != 0) {
      if (std::getenv("FLEET_SKIP_DOCKER_TESTS") != nullptr) GTEST_SKIP() << "no Docker engine";
      FAIL() << "no Docker engine (/var/run/docker.sock); set FLEET_SKIP_DOCKER_TESTS=1 to skip";
    }
    std::random_device rd;
    pool_ = "fleet-test-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 100000);
    cluster_.StartBroker();
  }

  void TearDown() override {
    // Whatever a failed test left: every container of this test's pool.
    RunResult ids = Docker({"ps", "-aq", "--filter", "label=fleet.pool=" + pool_}, dir_);
    std::istringstream in(ids.output);
    for (std::string id; in >> id;) Docker({"rm", "-f", id}, dir_);
  }

  DockerOptions Options(const std::string& worker_args) {
    DockerOptions o;
    o.image = Image();
    o.network = "host";
    o.pool = pool_;
    o.worker_args = worker_args;
    o.metrics_port = 0;
    o.memory_bytes = 128ll << 20;
    return o;
  }
  std::string GoodArgs() { return "--broker " + cluster_.backend() + " --handler echo"; }

  // Polls `l` until worker `id` is reported exited; its status, or -999.
  int WaitExited(DockerLauncher& l, const std::string& id, seconds timeout) {
    int status = -999;
    WaitFor(
        [&] {
          for (const Exited& e : l.Poll(SteadyClock().Now())) {
            if (e.id == id) status = e.status;
          }
          return status != -999;
        },
        timeout);
    return status;
  }

  TempDir dir_;
  Cluster cluster_;
  std::string pool_;
};

TEST_F(DockerLauncherEngineTest, WorkerContainerServesBatchesThenDrainsAndIsRemoved) {
  DockerLauncher l(Options(GoodArgs()));
  const std::string id = "fleet-as-t-1";
  std::string err;
  ASSERT_TRUE(l.Start(id, SteadyClock().Now(), &err)) << err;
  ASSERT_TRUE(WaitFor([&] { return AtBroker(cluster_, id); }, seconds(60)))
      << "the worker container never registered\n" << cluster_.BrokerLog();

  // The container is what the template says.
  json c = Inspect(l.ContainerName(id), dir_);
  ASSERT_TRUE(c.is_object());
  EXPECT_EQ(c["Config"]["Labels"]["fleet.pool"], pool_);
  EXPECT_EQ(c["Config"]["Labels"]["fleet.worker-id"], id);
  EXPECT_EQ(c["HostConfig"]["ReadonlyRootfs"], true);
  EXPECT_EQ(c["HostConfig"]["Privileged"], false);
  EXPECT_EQ(c["HostConfig"]["CapDrop"][0], "ALL");
  EXPECT_EQ(c["HostConfig"]["Memory"], 128ll << 20);
  EXPECT_EQ(c["Config"]["User"], "fleet:fleet");  // the image's own non-root user
  EXPECT_EQ(c["State"]["Running"], true);

  Cluster::Submitted s = cluster_.Submit({"--count", "50", "--payload", "hello"});
  EXPECT_EQ(s.summary["ok"], "50") << s.run.output;
  EXPECT_EQ(s.summary["lost"], "0");

  // Retire it through the broker as the autoscaler does; it drains and
  // exits by itself within the grace, and the launcher removes it.
  RunResult retire = cluster_.Ctl({"retire", id});
  ASSERT_EQ(retire.exit_code, 0) << retire.output;
  l.Stop(id, seconds(30), SteadyClock().Now());
  EXPECT_EQ(WaitExited(l, id, seconds(60)), 0);
  EXPECT_TRUE(l.Alive().empty());
  EXPECT_TRUE(Inspect(l.ContainerName(id), dir_).is_null()) << "container not removed";
}

TEST_F(DockerLauncherEngineTest, KilledContainerIsReportedWithItsStatusAndRemoved) {
  DockerLauncher l(Options(GoodArgs()));
  const std::string id = "fleet-as-t-2";
  std::string err;
  ASSERT_TRUE(l.Start(id, SteadyClock().Now(), &err)) << err;
  ASSERT_TRUE(WaitFor([&] { return AtBroker(cluster_, id); }, seconds(60)));
  RunResult kill = Docker({"kill", l.ContainerName(id)}, dir_);
  ASSERT_EQ(kill.exit_code, 0) << kill.output;
  EXPECT_EQ(WaitExited(l, id, seconds(30)), 137);
  EXPECT_TRUE(Inspect(l.ContainerName(id), dir_).is_null());
}

TEST_F(DockerLauncherEngineTest, SigtermEscalationStopsAWorkerThatWillNotLeave) {
  DockerLauncher l(Options(GoodArgs()));
  const std::string id = "fleet-as-t-3";
  std::string err;
  ASSERT_TRUE(l.Start(id, SteadyClock().Now(), &err)) << err;
  ASSERT_TRUE(WaitFor([&] { return AtBroker(cluster_, id); }, seconds(60)));
  // Not retired at the broker, so it would run forever: after the (zero)
  // grace it gets SIGTERM and drains out.
  l.Stop(id, Duration(0), SteadyClock().Now());
  EXPECT_EQ(WaitExited(l, id, seconds(60)), 0);
  EXPECT_TRUE(Inspect(l.ContainerName(id), dir_).is_null());
}

TEST_F(DockerLauncherEngineTest, NewLauncherAdoptsRunningAndRemovesExitedOfItsPoolOnly) {
  const std::string other_pool = pool_ + "-other";
  DockerOptions other_options = Options("--no-such-flag");
  other_options.pool = other_pool;
  DockerLauncher other(other_options);
  std::string err;
  ASSERT_TRUE(other.Start("o-1", SteadyClock().Now(), &err)) << err;
  {
    DockerLauncher first(Options(GoodArgs()));
    ASSERT_TRUE(first.Start("a-1", SteadyClock().Now(), &err)) << err;
    DockerLauncher failing(Options("--no-such-flag"));
    ASSERT_TRUE(failing.Start("a-2", SteadyClock().Now(), &err)) << err;
    ASSERT_TRUE(WaitFor([&] { return AtBroker(cluster_, "a-1"); }, seconds(60)));
    // The launchers go away (an autoscaler killed); the containers stay.
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        json a2 = Inspect(pool_ + "-a-2", dir_);
        json o1 = Inspect(other_pool + "-o-1", dir_);
        return a2.is_object() && a2["State"]["Status"] == "exited" && o1.is_object() &&
               o1["State"]["Status"] == "exited";
      },
      seconds(60)));

  DockerLauncher second(Options(GoodArgs()));
  EXPECT_TRUE(second.Poll(SteadyClock().Now()).empty());
  EXPECT_THAT(second.TakeAdopted(), ::testing::ElementsAre("a-1"));
  EXPECT_THAT(second.Alive(), ::testing::ElementsAre("a-1"));
  EXPECT_TRUE(Inspect(pool_ + "-a-2", dir_).is_null()) << "exited container of the pool kept";
  EXPECT_TRUE(Inspect(other_pool + "-o-1", dir_).is_object()) << "another pool's container touched";
  EXPECT_TRUE(AtBroker(cluster_, "a-1")) << "the adopted worker was disturbed";

  second.StopAll(seconds(20));
  EXPECT_TRUE(Inspect(pool_ + "-a-1", dir_).is_null());
  EXPECT_TRUE(second.Alive().empty());

  // The other pool's launcher cleans its own.
  EXPECT_NE(WaitExited(other, "o-1", seconds(30)), 0);
  EXPECT_TRUE(Inspect(other_pool + "-o-1", dir_).is_null());
}

TEST_F(DockerLauncherEngineTest, MissingImageIsAClearStartupError) {
  DockerOptions o = Options(GoodArgs());
  o.image = "fleet-no-such-image:never";
  try {
    DockerLauncher l(o);
    FAIL() << "a launcher for a missing image was made";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("image fleet-no-such-image:never does not exist"));
  }
}

}  // namespace
}  // namespace fleet::testing

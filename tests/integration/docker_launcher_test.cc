// DockerLauncher against the real Docker engine: worker containers from the
// fleet image (docker/build-images.sh, the docker_images fixture) on the
// host network, serving a real broker on 127.0.0.1; and a fault scenario on
// a user-defined bridge network: a worker container cut off the network and
// connected again, checked by the ledger (tests/support/ledger.h).
#include "autoscaler/docker_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tests/support/cluster.h"
#include "tests/support/ledger.h"
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

// Held batches of worker `id` at the broker, or -1 when it is not listed.
double HeldBy(Cluster& c, const std::string& id) {
  for (const json& w : c.Workers()) {
    if (w.value("id", "") == id) return w.at("held").get<double>();
  }
  return -1;
}

// The engine check, a pool name of its own and the removal of every
// container of that pool, whatever a failed test left. Derived fixtures
// return from SetUp when this one skipped or failed.
class DockerEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/var/run/docker.sock", F_OK) != 0) {
      if (std::getenv("FLEET_SKIP_DOCKER_TESTS") != nullptr) GTEST_SKIP() << "no Docker engine";
      FAIL() << "no Docker engine (/var/run/docker.sock); set FLEET_SKIP_DOCKER_TESTS=1 to skip";
    }
    std::random_device rd;
    pool_ = "fleet-test-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 100000);
  }
  bool SetUpDone() const { return !IsSkipped() && !HasFailure(); }

  void TearDown() override {
    if (pool_.empty()) return;
    RunResult ids = Docker({"ps", "-aq", "--filter", "label=fleet.pool=" + pool_}, dir_);
    std::istringstream in(ids.output);
    for (std::string id; in >> id;) Docker({"rm", "-f", id}, dir_);
  }

  DockerOptions Options(const std::string& worker_args, const std::string& network = "host") {
    DockerOptions o;
    o.image = Image();
    o.network = network;
    o.pool = pool_;
    o.worker_args = worker_args;
    o.metrics_port = 0;
    o.memory_bytes = 128ll << 20;
    return o;
  }

  TempDir dir_;
  Cluster cluster_;
  std::string pool_;
};

class DockerLauncherEngineTest : public DockerEngineTest {
 protected:
  void SetUp() override {
    DockerEngineTest::SetUp();
    if (SetUpDone()) cluster_.StartBroker();
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
  // Engine calls run off the caller's thread: the first Poll asks for the
  // list, the second applies it (adopting, queueing the removal).
  EXPECT_TRUE(second.Poll(SteadyClock().Now()).empty());
  ASSERT_TRUE(second.WaitIdle(std::chrono::milliseconds(30000)));
  EXPECT_TRUE(second.Poll(SteadyClock().Now()).empty());
  ASSERT_TRUE(second.WaitIdle(std::chrono::milliseconds(30000)));
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

// Worker containers on a user-defined bridge network of the test's own,
// serving a host broker whose backend is bound to that network's gateway
// address (the engine runs on this host, as for the host-network tests
// above), so `docker network disconnect` cuts a worker off the broker and
// nothing else. Heartbeats of 250 ms and a liveness of 4: a worker silent
// for 1 s is dead.
class DockerNetworkCutTest : public DockerEngineTest {
 protected:
  void SetUp() override {
    DockerEngineTest::SetUp();
    if (!SetUpDone()) return;
    network_ = pool_ + "-net";
    RunResult create = Docker(
        {"network", "create", "--driver", "bridge", "--label", "fleet.pool=" + pool_, network_},
        dir_);
    ASSERT_EQ(create.exit_code, 0) << create.output;
    network_created_ = true;
    RunResult inspect = Docker({"network", "inspect", network_}, dir_);
    ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
    const std::size_t start = inspect.output.find('[');
    json net = start == std::string::npos
                   ? json()
                   : json::parse(inspect.output.substr(start), nullptr, false);
    std::string gateway;
    if (net.is_array() && !net.empty()) {
      const json& config = net[0]["IPAM"]["Config"];
      if (config.is_array() && !config.empty()) gateway = config[0].value("Gateway", "");
    }
    ASSERT_FALSE(gateway.empty()) << "no gateway address for " << network_ << ":\n"
                                  << inspect.output;
    cluster_.StartBroker(
        {"--backend", "tcp://" + gateway + ":*", "--heartbeat-ms", "250", "--liveness", "4"});
  }

  void TearDown() override {
    DockerEngineTest::TearDown();  // the containers first: a network in use stays
    if (network_created_) {
      RunResult rm = Docker({"network", "rm", network_}, dir_);
      EXPECT_EQ(rm.exit_code, 0) << "network " << network_ << " left behind: " << rm.output;
    }
  }

  // The last lines of a container's own log (the worker's), for failures.
  std::string ContainerLog(const std::string& container) {
    RunResult r = Docker({"logs", "--tail", "20", container}, dir_);
    return container + ":\n" + r.output;
  }

  std::string network_;
  bool network_created_ = false;
};

// Issue 5's container fault: a busy worker container loses its network. The
// broker declares it dead and requeues its two batches, which run again on
// the other workers; the cut-off worker finishes them anyway and, once
// connected again, registers anew and reports them late. The broker keeps
// one result per batch and counts the other as a duplicate; fleet-submit's
// ledger shows each batch delivered once, with its echoed value.
//
// The handler is an echo that takes 3 s (exec: `sleep 3; cat`), so the ledger
// checks every value and the cut worker's batches are still running when it
// notices the silence (1 s) and drops its connection: their results are the
// late ones, not lost in the dead one. There is no execution log: the
// launcher mounts only read-only binds into a worker, by design, and the
// re-runs are what the broker's counters and the ledger show here.
TEST_F(DockerNetworkCutTest, CutOffWorkerIsDeclaredDeadAndItsLateResultsAreNotDeliveredTwice) {
  DockerLauncher l(Options("--broker " + cluster_.backend() +
                               " --handler exec --exec 'sleep 3; cat' --concurrency 2"
                               " --heartbeat-ms 250",
                           network_));
  const std::vector<std::string> ids = {"cut-1", "cut-2", "cut-3"};
  const std::string& victim = ids[0];
  const std::string container = l.ContainerName(victim);
  std::string err;
  for (const auto& id : ids) ASSERT_TRUE(l.Start(id, SteadyClock().Now(), &err)) << err;
  ASSERT_TRUE(WaitFor(
      [&] {
        return std::all_of(ids.begin(), ids.end(),
                           [&](const std::string& id) { return AtBroker(cluster_, id); });
      },
      seconds(60)))
      << "the worker containers never registered\n"
      << cluster_.BrokerLog() << ContainerLog(container);

  // 18 batches at once: 6 run (2 per worker), 12 wait.
  const std::string ledger = dir_.File("ledger.txt");
  Process submit({Bin("fleet-submit"), "--broker", cluster_.frontend(), "--count", "18", "--size",
                  "64", "--inflight", "18", "--ledger", ledger},
                 dir_.File("submit.log"));
  ASSERT_TRUE(WaitFor([&] { return HeldBy(cluster_, victim) == 2; }))
      << cluster_.Workers().dump() << "\n"
      << submit.ReadLog();
  RunResult cut = Docker({"network", "disconnect", network_, container}, dir_);
  ASSERT_EQ(cut.exit_code, 0) << cut.output;

  // Declared dead: it leaves `fleet-ctl workers` and its batches go back.
  ASSERT_TRUE(WaitFor([&] { return !AtBroker(cluster_, victim); }))
      << cluster_.Workers().dump() << "\n"
      << cluster_.BrokerLog();
  EXPECT_GE(cluster_.StatValue("workers_dead"), 1);
  EXPECT_GE(cluster_.StatValue("requeued"), 2);
  // The requeued batches are at the front of the queue: the first slots the
  // two other workers free (by their 4th result) take them, so they run
  // again there before the cut-off worker can report its own copies, and
  // each of them will reach the broker twice, in either order.
  ASSERT_TRUE(WaitFor([&] { return cluster_.StatValue("completed_ok") >= 4; }))
      << cluster_.BrokerLog();
  EXPECT_FALSE(AtBroker(cluster_, victim)) << "a worker without a network is still listed";

  RunResult reconnect = Docker({"network", "connect", network_, container}, dir_);
  ASSERT_EQ(reconnect.exit_code, 0) << reconnect.output;
  EXPECT_TRUE(WaitFor([&] { return AtBroker(cluster_, victim); }))
      << "the worker did not register again\n"
      << cluster_.BrokerLog() << ContainerLog(container);

  auto code = submit.Wait(seconds(60));
  ASSERT_TRUE(code.has_value()) << "fleet-submit still running: " << submit.ReadLog();
  EXPECT_EQ(*code, 0) << submit.ReadLog();
  // Both copies of each requeued batch reached the broker: one result kept,
  // the other dropped and counted (it may arrive after fleet-submit ended).
  EXPECT_TRUE(WaitFor([&] { return cluster_.StatValue("duplicates") >= 2; }))
      << "the cut-off worker's late results never reached the broker\n"
      << cluster_.Stats().dump() << "\n"
      << cluster_.BrokerLog() << ContainerLog(container);

  LedgerReport r = CheckLedger({ledger}, {});
  EXPECT_TRUE(r.passed) << r.Describe() << "\n" << cluster_.BrokerLog();
  EXPECT_EQ(r.submitted, 18u);
  EXPECT_EQ(r.ok, 18u);
  EXPECT_EQ(r.lost, 0u);
  EXPECT_EQ(r.duplicated, 0u);
  EXPECT_EQ(r.unexpected, 0u);
  std::printf("%s\nbroker: %s\n", r.Describe().c_str(), cluster_.Stats().dump().c_str());
}

}  // namespace
}  // namespace fleet::testing

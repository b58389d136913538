// The swarm launcher (DockerLauncher over a SwarmEngine) against a fake
// swarm manager on a unix socket: the checks, the service template and how
// tasks' states become starts, exits, stops and adoptions. The real thing
// (a one-node swarm, docker stack deploy, 0 -> 3 -> 0) is
// tests/docker/swarm_test.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "autoscaler/docker_launcher.h"
#include "tests/autoscaler/fake_docker_engine.h"
#include "tests/autoscaler/launcher_test_util.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace fleet::autoscaler {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::Settle;
using testing::ThrownBy;

json Service(const std::string& id, const std::string& pool, const std::string& worker,
             int replicas = 1) {
  json labels = {{"fleet.pool", pool}};
  if (!worker.empty()) labels["fleet.worker-id"] = worker;
  return {{"ID", id},
          {"Version", {{"Index", 7}}},
          {"Spec",
           {{"Name", pool + "-" + worker},
            {"Labels", labels},
            {"Mode", {{"Replicated", {{"Replicas", replicas}}}}},
            {"TaskTemplate", {{"ContainerSpec", {{"Image", "fleet:test"}}}}}}}};
}

json Task(const std::string& service, int index, const std::string& state,
          std::optional<int> exit_code = std::nullopt, const std::string& err = "") {
  json status = {{"State", state}};
  if (exit_code) status["ContainerStatus"] = {{"ContainerID", "c-" + service}, {"ExitCode", *exit_code}};
  if (!err.empty()) status["Err"] = err;
  return {{"ID", "t" + std::to_string(index)}, {"ServiceID", service},
          {"Version", {{"Index", index}}}, {"Status", status}};
}

class SwarmLauncherTest : public ::testing::Test {
 protected:
  SwarmLauncherTest() {
    engine_.Set("GET /info", 200,
                R"({"Swarm":{"LocalNodeState":"active","ControlAvailable":true}})");
    engine_.Set("GET /v1.41/networks/", 200, R"({"Name":"fleet_internal","Scope":"swarm"})");
    engine_.Set("POST /v1.41/services/create", 201, R"({"ID":"s1"})");
    engine_.Set("POST /v1.41/services/", 200, R"({"Warnings":null})");  // update
    SetServices({});
    SetTasks({});
  }

  DockerOptions Options() {
    DockerOptions o;
    o.socket_path = socket_;
    o.image = "fleet:test";
    o.network = "fleet_internal";
    o.pool = "p1";
    o.worker_args = "--broker tcp://broker:5556 --handler sleep";
    o.constraints = {"node.role==worker", "node.labels.fleet==yes"};
    o.spread = {"node.labels.zone"};
    o.cpus = 0.5;
    o.stop_grace = Seconds(20);
    o.api_timeout = std::chrono::milliseconds(5000);
    return o;
  }

  std::unique_ptr<DockerLauncher> Launcher(DockerOptions o) {
    return std::make_unique<DockerLauncher>(std::make_unique<SwarmEngine>(std::move(o)));
  }

  // The manager's services (a DELETE drops one, as the swarm does).
  void SetServices(const std::vector<json>& services) {
    std::vector<std::string> entries;
    for (const json& s : services) entries.push_back(s.dump());
    engine_.SetServices(std::move(entries));
  }
  void SetTasks(const std::vector<json>& tasks) {
    engine_.Set("GET /v1.41/tasks", 200, json(tasks).dump());
  }

  fleet::testing::TempDir dir_;
  std::string socket_ = dir_.path() + "/docker.sock";
  testing::FakeDockerEngine engine_{socket_};
};

TEST_F(SwarmLauncherTest, AnEngineThatIsNotAManagerIsRefusedWithTheFix) {
  engine_.Set("GET /info", 200, R"({"Swarm":{"LocalNodeState":"inactive"}})");
  std::string msg = ThrownBy([&] { Launcher(Options()); });
  EXPECT_THAT(msg, HasSubstr("not a swarm manager (node state inactive)"));
  EXPECT_THAT(msg, HasSubstr("docker swarm init"));
  engine_.Set("GET /info", 200,
              R"({"Swarm":{"LocalNodeState":"active","ControlAvailable":false}})");
  EXPECT_THAT(ThrownBy([&] { Launcher(Options()); }), HasSubstr("not a swarm manager"));
  // Outside a swarm the stack's overlay network does not exist either: the
  // cause named is the swarm, not the network.
  engine_.Set("GET /info", 200, R"({"Swarm":{"LocalNodeState":"inactive"}})");
  engine_.Set("GET /v1.41/networks/", 404, R"({"message":"network fleet_internal not found"})");
  EXPECT_THAT(ThrownBy([&] { Launcher(Options()); }), HasSubstr("not a swarm manager"));
}

TEST_F(SwarmLauncherTest, ANetworkThatIsNotTheSwarmsIsRefused) {
  engine_.Set("GET /v1.41/networks/", 200, R"({"Name":"fleet_internal","Scope":"local"})");
  EXPECT_THAT(ThrownBy([&] { Launcher(Options()); }),
              HasSubstr("network fleet_internal is not a swarm network (scope local)"));
  DockerOptions o = Options();
  o.network = "host";
  EXPECT_THAT(ThrownBy([&] { Launcher(o); }), HasSubstr("name an overlay network"));
}

TEST_F(SwarmLauncherTest, AMissingImageIsOnlyAWarningNodesMayPullIt) {
  engine_.Set("GET /v1.41/images/", 404, R"({"message":"no such image"})");
  EXPECT_NO_THROW(Launcher(Options()));
}

TEST_F(SwarmLauncherTest, OneServiceOfOneReplicaThatTheSwarmNeverRestarts) {
  auto l = Launcher(Options());
  EXPECT_STREQ(l->name(), "swarm");
  json body = json::parse(l->CreateBody("w1"));
  EXPECT_EQ(body["Name"], "p1-w1");
  EXPECT_EQ(body["Mode"]["Replicated"]["Replicas"], 1);
  EXPECT_EQ(body["EndpointSpec"]["Mode"], "dnsrr");
  for (const json& labels : {body["Labels"], body["TaskTemplate"]["ContainerSpec"]["Labels"]}) {
    EXPECT_EQ(labels["fleet.pool"], "p1");
    EXPECT_EQ(labels["fleet.worker-id"], "w1");
    EXPECT_EQ(labels["fleet.role"], "worker");
    EXPECT_EQ(labels["fleet.metrics-port"], "9752");
  }
  const json& task = body["TaskTemplate"];
  EXPECT_EQ(task["RestartPolicy"]["Condition"], "none");
  EXPECT_EQ(task["Networks"], json::parse(R"([{"Target":"fleet_internal"}])"));
  EXPECT_EQ(task["Placement"]["Constraints"],
            json::parse(R"(["node.role==worker","node.labels.fleet==yes"])"));
  EXPECT_EQ(task["Placement"]["Preferences"],
            json::parse(R"([{"Spread":{"SpreadDescriptor":"node.labels.zone"}}])"));
  // What the swarm schedules by, and what it enforces.
  EXPECT_EQ(task["Resources"]["Reservations"]["NanoCPUs"], 500000000);
  EXPECT_EQ(task["Resources"]["Reservations"]["MemoryBytes"], 512ll << 20);
  EXPECT_EQ(task["Resources"]["Limits"]["MemoryBytes"], 512ll << 20);
  EXPECT_EQ(task["Resources"]["Limits"]["Pids"], 256);
  const json& c = task["ContainerSpec"];
  EXPECT_EQ(c["Image"], "fleet:test");
  EXPECT_EQ(c["Command"][2],
            "exec 'fleet-worker' --id 'w1' --broker tcp://broker:5556 --handler sleep");
  EXPECT_EQ(c["ReadOnly"], true);
  EXPECT_EQ(c["Init"], true);
  EXPECT_EQ(c["CapabilityDrop"], json::parse(R"(["ALL"])"));
  EXPECT_EQ(c["StopGracePeriod"], 20000000000ll);
  EXPECT_EQ(c["HealthCheck"]["Test"], json::parse(R"(["NONE"])"));
  EXPECT_THAT(c["Env"].dump(), HasSubstr("FLEET_METRICS=0.0.0.0:9752"));
  ASSERT_EQ(c["Mounts"].size(), 1u);  // the tmpfs; no bind but --docker-mount ones
  EXPECT_EQ(c["Mounts"][0]["Type"], "tmpfs");
  EXPECT_FALSE(body.contains("Ports") || body["EndpointSpec"].contains("Ports"));
}

TEST_F(SwarmLauncherTest, StopScalesTheServiceToZeroWithTheGraceThenItIsReapedAndRemoved) {
  auto l = Launcher(Options());
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  json created = json::parse(engine_.LastBody("POST /v1.41/services/create"));
  EXPECT_EQ(created["Name"], "p1-w1");
  SetServices({Service("s1", "p1", "w1")});
  SetTasks({Task("s1", 3, "running")});
  EXPECT_TRUE(Settle(*l, TimePoint{}).empty());
  EXPECT_THAT(l->Alive(), ElementsAre("w1"));

  const TimePoint t0 = TimePoint{} + Seconds(10);
  l->Stop("w1", Seconds(2), t0);
  EXPECT_TRUE(Settle(*l, t0 + Seconds(1)).empty());  // its grace to leave by itself
  EXPECT_TRUE(engine_.Matching("POST /v1.41/services/s1/update").empty());
  EXPECT_TRUE(Settle(*l, t0 + Seconds(2)).empty());  // then the swarm's SIGTERM
  ASSERT_THAT(engine_.Matching("POST /v1.41/services/s1/update"),
              ElementsAre("POST /v1.41/services/s1/update?version=7"));
  json update = json::parse(engine_.LastBody("POST /v1.41/services/s1/update"));
  EXPECT_EQ(update["Mode"]["Replicated"]["Replicas"], 0);
  EXPECT_EQ(update["TaskTemplate"]["ContainerSpec"]["StopGracePeriod"], 2000000000ll);
  EXPECT_EQ(update["TaskTemplate"]["ContainerSpec"]["Image"], "fleet:test");  // the rest kept
  EXPECT_TRUE(engine_.Matching("DELETE /v1.41/services/s1").empty());

  // The swarm stopped the task and deleted it: scaled to 0 with no task.
  SetServices({Service("s1", "p1", "w1", 0)});
  SetTasks({});
  std::vector<Exited> exited = Settle(*l, t0 + Seconds(3));
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].id, "w1");
  EXPECT_EQ(exited[0].status, -1);  // the swarm keeps no exit code of a removed task
  EXPECT_TRUE(exited[0].error.empty());
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/services/s1").size(), 1u);
  EXPECT_TRUE(l->Alive().empty());
}

TEST_F(SwarmLauncherTest, AWorkerThatExitsByItselfIsReapedWithItsExitCode) {
  auto l = Launcher(Options());
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  SetServices({Service("s1", "p1", "w1")});
  // A retired worker drains and exits 0: its (only) task is complete. An
  // older task of the service (replaced on a node failure) is not the one.
  SetTasks({Task("s1", 9, "complete", 0), Task("s1", 4, "failed", 137), Task("s9", 12, "failed", 1)});
  std::vector<Exited> exited = Settle(*l, TimePoint{});
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].status, 0);
  EXPECT_TRUE(exited[0].error.empty());
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/services/s1").size(), 1u);
  EXPECT_TRUE(engine_.Matching("POST /v1.41/services/s1/update").empty());
}

TEST_F(SwarmLauncherTest, ATaskTheSwarmRejectedIsAFailedStartWithItsReason) {
  auto l = Launcher(Options());
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  SetServices({Service("s1", "p1", "w1")});
  SetTasks({Task("s1", 5, "rejected", std::nullopt, "No such image: fleet:test")});
  std::vector<Exited> exited = Settle(*l, TimePoint{});
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_THAT(exited[0].error, HasSubstr("No such image: fleet:test"));
  EXPECT_THAT(exited[0].error, HasSubstr("rejected"));
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/services/s1").size(), 1u);
}

TEST_F(SwarmLauncherTest, APendingTaskSaysWhyAndCountsAsStartingUntilItRuns) {
  auto l = Launcher(Options());
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  SetServices({Service("s1", "p1", "w1")});
  SetTasks({Task("s1", 4, "pending", std::nullopt,
                 "no suitable node (insufficient resources on 1 node)")});
  EXPECT_TRUE(Settle(*l, TimePoint{}).empty());  // still starting, not an exit
  EXPECT_THAT(l->Alive(), ElementsAre("w1"));
  EXPECT_TRUE(engine_.Matching("DELETE /v1.41/services/s1").empty());
}

TEST_F(SwarmLauncherTest, ACreateTheManagerRefusesComesBackAsAFailedStart) {
  engine_.Set("POST /v1.41/services/create", 409,
              R"({"message":"rpc error: name conflicts with an existing object"})");
  auto l = Launcher(Options());
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;
  std::vector<Exited> exited = Settle(*l, TimePoint{}, 1);
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_THAT(exited[0].error, HasSubstr("create service p1-w1"));
  EXPECT_THAT(exited[0].error, HasSubstr("name conflicts"));
}

TEST_F(SwarmLauncherTest, SigkillRemovesTheService) {
  auto l = Launcher(Options());
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  SetServices({Service("s1", "p1", "w1")});
  SetTasks({Task("s1", 3, "running")});
  EXPECT_TRUE(Settle(*l, TimePoint{}).empty());
  l->Stop("w1", Seconds(1), TimePoint{});
  EXPECT_TRUE(Settle(*l, TimePoint{} + Seconds(1)).empty());  // SIGTERM: scaled to 0
  EXPECT_EQ(engine_.Matching("POST /v1.41/services/s1/update").size(), 1u);
  // Still running after the grace: SIGKILL removes the service, and the
  // next list finds it gone.
  std::vector<Exited> exited = Settle(*l, TimePoint{} + Seconds(2));
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/services/s1").size(), 1u);
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].id, "w1");
  EXPECT_TRUE(l->Alive().empty());
}

TEST_F(SwarmLauncherTest, ARestartAdoptsItsRunningServicesAndRemovesItsStoppedOnes) {
  SetServices({Service("s2", "p1", "w2"), Service("s3", "p1", "w3", 0),
               Service("s4", "other", "w4"), Service("s5", "p1", "")});
  SetTasks({Task("s2", 3, "running"), Task("s4", 4, "running"), Task("s5", 5, "running")});
  auto l = Launcher(Options());
  EXPECT_TRUE(Settle(*l, TimePoint{}).empty());
  EXPECT_THAT(l->TakeAdopted(), ElementsAre("w2"));
  EXPECT_THAT(l->Alive(), ElementsAre("w2"));
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/services/s3").size(), 1u);  // scaled to 0, left
  // Another pool's, whatever the manager's filter did, and one with no
  // worker id (made by hand): never touched.
  EXPECT_TRUE(engine_.Matching("DELETE /v1.41/services/s4").empty());
  EXPECT_TRUE(engine_.Matching("DELETE /v1.41/services/s5").empty());
  EXPECT_TRUE(engine_.Matching("POST /v1.41/services/s4").empty());
}

}  // namespace
}  // namespace fleet::autoscaler

// DockerLauncher against a fake Docker Engine on a unix socket: the error
// paths, the container template and the Poll bookkeeping. The happy path
// against the real engine is in tests/integration/docker_launcher_test.cc.
#include "autoscaler/docker_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/autoscaler/fake_docker_engine.h"
#include "tests/autoscaler/launcher_test_util.h"
#include "tests/support/http_server.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace fleet::autoscaler {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

using FakeEngine = testing::FakeDockerEngine;

using testing::Settle;
using testing::ThrownBy;

class DockerLauncherFakeTest : public ::testing::Test {
 protected:
  DockerOptions Options() {
    DockerOptions o;
    o.socket_path = socket_;
    o.image = "fleet:test";
    o.network = "fleet_internal";
    o.pool = "p1";
    o.worker_args = "--broker tcp://broker:5556 --handler 'sleep'";
    o.env = {"FLEET_LOG_LEVEL=debug"};
    o.api_timeout = std::chrono::milliseconds(5000);
    return o;
  }

  fleet::testing::TempDir dir_;
  std::string socket_ = dir_.path() + "/docker.sock";
  FakeEngine engine_{socket_};
};

TEST_F(DockerLauncherFakeTest, MissingSocketSaysSo) {
  DockerOptions o = Options();
  o.socket_path = dir_.path() + "/absent.sock";
  std::string msg = ThrownBy([&] { DockerLauncher l(o); });
  EXPECT_THAT(msg, HasSubstr("no Docker socket at " + o.socket_path));
  EXPECT_THAT(msg, HasSubstr("mounted"));
}

TEST_F(DockerLauncherFakeTest, EngineThatDoesNotAnswerSaysSo) {
  engine_.Set("GET /_ping", 500, R"({"message":"daemon is sick"})");
  std::string msg = ThrownBy([&] { DockerLauncher l(Options()); });
  EXPECT_THAT(msg, HasSubstr("does not answer"));
  EXPECT_THAT(msg, HasSubstr("daemon is sick"));
}

TEST_F(DockerLauncherFakeTest, OldEngineIsRefused) {
  engine_.Set("GET /version", 200, R"({"ApiVersion":"1.30"})");
  EXPECT_THAT(ThrownBy([&] { DockerLauncher l(Options()); }), HasSubstr("speaks API 1.30"));
}

TEST_F(DockerLauncherFakeTest, MissingImageNamesTheImageAndTheFix) {
  engine_.Set("GET /v1.41/images/", 404, R"({"message":"No such image: fleet:test"})");
  std::string msg = ThrownBy([&] { DockerLauncher l(Options()); });
  EXPECT_THAT(msg, HasSubstr("image fleet:test does not exist"));
  EXPECT_THAT(msg, HasSubstr("build-images.sh"));
  EXPECT_EQ(engine_.Matching("GET /v1.41/images/fleet:test/json").size(), 1u);
}

TEST_F(DockerLauncherFakeTest, MissingNetworkSaysSo) {
  engine_.Set("GET /v1.41/networks/", 404, R"({"message":"network fleet_internal not found"})");
  EXPECT_THAT(ThrownBy([&] { DockerLauncher l(Options()); }),
              HasSubstr("network fleet_internal does not exist"));
}

TEST_F(DockerLauncherFakeTest, HostNetworkIsNotLookedUpAndItsWorkersServeNoMetrics) {
  DockerOptions o = Options();
  o.network = "host";
  engine_.Set("GET /v1.41/networks/", 500, "{}");
  DockerLauncher l(o);
  EXPECT_TRUE(engine_.Matching("GET /v1.41/networks/").empty());
  // On the host network every worker would bind the same metrics port.
  json body = json::parse(l.CreateBody("w1"));
  EXPECT_THAT(body["Env"].get<std::vector<std::string>>(),
              ::testing::ElementsAre("FLEET_LOG_LEVEL=debug"));
  EXPECT_FALSE(body["Labels"].contains("fleet.metrics-port"));
}

TEST_F(DockerLauncherFakeTest, AnotherContainersNamespaceIsRefused) {
  DockerOptions o = Options();
  o.network = "container:fleet_broker_1";
  EXPECT_THAT(ThrownBy([&] { DockerLauncher l(o); }), HasSubstr("name a network"));
}

TEST_F(DockerLauncherFakeTest, ContainerTemplateIsLockedDown) {
  DockerLauncher l(Options());
  json body = json::parse(l.CreateBody("fleet-as-ab-1"));
  EXPECT_EQ(body["Image"], "fleet:test");
  EXPECT_EQ(body["Cmd"][0], "/bin/sh");
  EXPECT_EQ(body["Cmd"][2],
            "exec 'fleet-worker' --id 'fleet-as-ab-1' --broker tcp://broker:5556 --handler 'sleep'");
  EXPECT_EQ(body["Labels"]["fleet.pool"], "p1");
  EXPECT_EQ(body["Labels"]["fleet.worker-id"], "fleet-as-ab-1");
  EXPECT_EQ(body["Labels"]["fleet.role"], "worker");
  EXPECT_EQ(body["Labels"]["fleet.metrics-port"], "9752");
  EXPECT_THAT(body["Env"].get<std::vector<std::string>>(),
              ::testing::ElementsAre("FLEET_LOG_LEVEL=debug", "FLEET_METRICS=0.0.0.0:9752"));
  EXPECT_EQ(body["Healthcheck"]["Test"][0], "NONE");
  const json& h = body["HostConfig"];
  EXPECT_EQ(h["Privileged"], false);
  EXPECT_EQ(h["ReadonlyRootfs"], true);
  EXPECT_EQ(h["CapDrop"][0], "ALL");
  EXPECT_EQ(h["SecurityOpt"][0], "no-new-privileges");
  EXPECT_EQ(h["NetworkMode"], "fleet_internal");
  EXPECT_EQ(h["Memory"], 512ll << 20);
  EXPECT_EQ(h["PidsLimit"], 256);
  EXPECT_EQ(h["RestartPolicy"]["Name"], "no");
  EXPECT_FALSE(h.contains("Binds"));
  EXPECT_FALSE(h.contains("Mounts"));
  EXPECT_EQ(l.ContainerName("fleet-as-ab-1"), "p1-fleet-as-ab-1");
}

TEST_F(DockerLauncherFakeTest, DockerMountsAreReadOnlyNonRecursiveBindsInTheTemplate) {
  DockerOptions o = Options();
  o.mounts = {{"/srv/fleet/keys/worker.key", "/run/secrets/worker.key"},
              {"/srv/fleet/keys/broker.pub", "/run/secrets/broker.pub"}};
  DockerLauncher l(o);
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l.WaitIdle(std::chrono::seconds(20)));
  // What the engine got, not only what CreateBody says.
  json body = json::parse(engine_.LastBody("POST /v1.41/containers/create"));
  const json& h = body["HostConfig"];
  EXPECT_FALSE(h.contains("Binds"));
  ASSERT_EQ(h["Mounts"].size(), 2u);
  EXPECT_EQ(h["Mounts"][0],
            json({{"Type", "bind"},
                  {"Source", "/srv/fleet/keys/worker.key"},
                  {"Target", "/run/secrets/worker.key"},
                  {"ReadOnly", true},
                  {"BindOptions", {{"NonRecursive", true}}}}));
  EXPECT_EQ(h["Mounts"][1]["Source"], "/srv/fleet/keys/broker.pub");
  EXPECT_EQ(h["Mounts"][1]["Target"], "/run/secrets/broker.pub");
  EXPECT_EQ(h["Mounts"][1]["ReadOnly"], true);
  // The rest of the template does not loosen because of them.
  EXPECT_EQ(h["Privileged"], false);
  EXPECT_EQ(h["ReadonlyRootfs"], true);
  EXPECT_EQ(h["CapDrop"][0], "ALL");
}

TEST_F(DockerLauncherFakeTest, BadDockerMountIsRefusedBeforeTheEngineIsAsked) {
  const std::pair<DockerMount, const char*> cases[] = {
      {{"/var/run/docker.sock", "/var/run/docker.sock"}, "socket"},
      {{"/var/run", "/host-run"}, "socket"},
      {{"keys/worker.key", "/run/secrets/worker.key"}, "clean absolute path"},
      {{"/srv/keys/../../", "/k"}, "clean absolute path"},
      {{"/srv/keys", "/run/secrets:rw"}, "':'"},
      {{"/", "/host"}, "root directory"},
  };
  for (const auto& [mount, why] : cases) {
    DockerOptions o = Options();
    o.mounts = {mount};
    EXPECT_THAT(ThrownBy([&] { DockerLauncher l(o); }), HasSubstr(why)) << mount.host_path;
  }
  // The launcher's own socket, wherever it is, counts as the Docker socket.
  DockerOptions o = Options();
  o.mounts = {{dir_.path(), "/d"}};
  EXPECT_THAT(ThrownBy([&] { DockerLauncher l(o); }), HasSubstr("socket"));
  o.mounts = {{"/srv/a", "/run/secrets/k"}, {"/srv/b", "/run/secrets/k"}};
  EXPECT_THAT(ThrownBy([&] { DockerLauncher l(o); }), HasSubstr("a second mount"));
  EXPECT_TRUE(engine_.requests().empty());
}

TEST_F(DockerLauncherFakeTest, StartCreatesAndStartsANamedContainer) {
  DockerLauncher l(Options());
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  EXPECT_THAT(l.Alive(), ::testing::ElementsAre("w1"));  // booked at once
  EXPECT_FALSE(l.Start("w1", TimePoint{}, &err));
  EXPECT_THAT(err, HasSubstr("already started"));
  ASSERT_TRUE(l.WaitIdle(std::chrono::seconds(20)));
  EXPECT_EQ(engine_.Matching("POST /v1.41/containers/create?name=p1-w1").size(), 1u);
  EXPECT_EQ(engine_.Matching("POST /v1.41/containers/c1/start").size(), 1u);
}

TEST_F(DockerLauncherFakeTest, RefusedCreateComesBackFromPollAsAFailedStart) {
  engine_.Set("POST /v1.41/containers/create", 400,
              R"({"message":"Minimum memory limit allowed is 6MB"})");
  DockerLauncher l(Options());
  std::string err;
  EXPECT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;  // accepted: the engine answers later
  std::vector<Exited> exited = Settle(l, TimePoint{}, 1);
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].id, "w1");
  EXPECT_THAT(exited[0].error, HasSubstr("Minimum memory limit allowed is 6MB"));
  EXPECT_THAT(exited[0].error, HasSubstr("HTTP 400"));
  EXPECT_TRUE(engine_.Matching("POST /v1.41/containers/c1/start").empty());
  EXPECT_TRUE(l.Alive().empty());
}

TEST_F(DockerLauncherFakeTest, FailedStartRemovesTheCreatedContainer) {
  engine_.Set("POST /v1.41/containers/c1/start", 500,
              R"({"message":"driver failed programming external connectivity"})");
  DockerLauncher l(Options());
  std::string err;
  EXPECT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  std::vector<Exited> exited = Settle(l, TimePoint{}, 1);
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_THAT(exited[0].error, HasSubstr("driver failed"));
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/containers/c1?force=true").size(), 1u);
  EXPECT_TRUE(l.Alive().empty());
}

TEST_F(DockerLauncherFakeTest, SlowEngineHoldsNeitherStartNorPoll) {
  // A busy engine takes seconds per create; this one does not answer at
  // all until released. Start and Poll must return all the same.
  engine_.Set("GET /v1.41/containers/json", 200,
              R"([{"Id":"c1","State":"running","Labels":{"fleet.pool":"p1","fleet.worker-id":"w1"}}])");
  DockerLauncher l(Options());
  engine_.Hold("POST /v1.41/containers/create");
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  ASSERT_TRUE(fleet::testing::WaitFor(
      [&] { return !engine_.Matching("POST /v1.41/containers/create").empty(); }));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(l.Poll(TimePoint{} + Seconds(i)).empty());
  ASSERT_TRUE(l.Start("w2", TimePoint{}, &err)) << err;  // queued behind the first
  EXPECT_THAT(l.Alive(), ::testing::ElementsAre("w1", "w2"));
  EXPECT_FALSE(l.WaitIdle(std::chrono::milliseconds(0)));
  // Start, Poll and Start again all returned while the create was held.
  EXPECT_EQ(engine_.Answered("POST /v1.41/containers/create"), 0);

  engine_.Release();
  // (This fake engine names every container c1 and lists it running.)
  EXPECT_TRUE(Settle(l, TimePoint{} + Seconds(3)).empty());
  EXPECT_EQ(engine_.Answered("POST /v1.41/containers/create"), 2);
  EXPECT_EQ(engine_.Matching("POST /v1.41/containers/c1/start").size(), 2u);
  EXPECT_THAT(l.Alive(), ::testing::Contains("w1"));
}

std::string ListEntry(const std::string& id, const std::string& state, const std::string& pool,
                      const std::string& worker) {
  json labels = {{"fleet.pool", pool}};
  if (!worker.empty()) labels["fleet.worker-id"] = worker;
  return json({{"Id", id}, {"State", state}, {"Labels", labels}}).dump();
}

TEST_F(DockerLauncherFakeTest, PollReapsAdoptsAndCleansOnlyItsPool) {
  // The engine's containers (it drops one when it is removed).
  engine_.SetContainers({ListEntry("c1", "exited", "p1", "w1"), ListEntry("c2", "running", "p1", "w2"),
                         ListEntry("c3", "exited", "p1", "w3"), ListEntry("c4", "exited", "other", "w4"),
                         ListEntry("c5", "running", "p1", "")});
  engine_.Set("GET /v1.41/containers/c1/json", 200, R"({"State":{"ExitCode":137}})");
  DockerLauncher l(Options());
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  std::vector<Exited> exited = Settle(l, TimePoint{}, 4);
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].id, "w1");
  EXPECT_EQ(exited[0].status, 137);
  EXPECT_TRUE(exited[0].error.empty());
  EXPECT_THAT(l.TakeAdopted(), ::testing::ElementsAre("w2"));
  EXPECT_TRUE(l.TakeAdopted().empty());
  EXPECT_THAT(l.Alive(), ::testing::ElementsAre("w2"));
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/containers/c1?").size(), 1u);
  EXPECT_EQ(engine_.Matching("DELETE /v1.41/containers/c3?").size(), 1u);
  // Not ours (another pool, whatever the engine's filter did) or not a
  // worker of ours: never touched.
  EXPECT_TRUE(engine_.Matching("DELETE /v1.41/containers/c4").empty());
  EXPECT_TRUE(engine_.Matching("DELETE /v1.41/containers/c5").empty());
  EXPECT_TRUE(engine_.Matching("POST /v1.41/containers/c5").empty());
  EXPECT_TRUE(engine_.Matching("DELETE /v1.41/containers/c2").empty());
  // The list asked the engine for the pool label only.
  EXPECT_THAT(engine_.Matching("GET /v1.41/containers/json").back(),
              HasSubstr("fleet.pool%3Dp1"));
}

TEST_F(DockerLauncherFakeTest, StopWaitsTheGraceThenTermsThenKills) {
  DockerLauncher l(Options());
  engine_.Set("GET /v1.41/containers/json", 200, "[" + ListEntry("c1", "running", "p1", "w1") + "]");
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  const TimePoint t0 = TimePoint{} + Seconds(100);
  l.Stop("w1", Seconds(5), t0);
  Settle(l, t0 + Seconds(4));
  EXPECT_TRUE(engine_.Matching("POST /v1.41/containers/c1/kill").empty());
  Settle(l, t0 + Seconds(5));
  EXPECT_THAT(engine_.Matching("POST /v1.41/containers/c1/kill"),
              ::testing::ElementsAre("POST /v1.41/containers/c1/kill?signal=SIGTERM"));
  l.CancelStop("w1");  // too late: it was signalled
  Settle(l, t0 + Seconds(10));
  EXPECT_THAT(engine_.Matching("POST /v1.41/containers/c1/kill"),
              ::testing::ElementsAre("POST /v1.41/containers/c1/kill?signal=SIGTERM",
                                     "POST /v1.41/containers/c1/kill?signal=SIGKILL"));
  // The engine did not carry the kill out (it is still listed running): the
  // kill goes again after max(grace, 5 s), not never.
  Settle(l, t0 + Seconds(14));
  EXPECT_EQ(engine_.Matching("POST /v1.41/containers/c1/kill?signal=SIGKILL").size(), 1u);
  Settle(l, t0 + Seconds(15));
  EXPECT_EQ(engine_.Matching("POST /v1.41/containers/c1/kill?signal=SIGKILL").size(), 2u);
}

TEST_F(DockerLauncherFakeTest, StopOfAWorkerWhoseStartIsStillRunningWaitsForItsContainer) {
  engine_.Set("GET /v1.41/containers/json", 200, "[" + ListEntry("c1", "running", "p1", "w1") + "]");
  DockerLauncher l(Options());
  engine_.Hold("POST /v1.41/containers/create");
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  l.Stop("w1", Seconds(1), TimePoint{});
  EXPECT_TRUE(l.Poll(TimePoint{} + Seconds(1)).empty());  // no container to signal yet
  EXPECT_TRUE(engine_.Matching("POST /v1.41/containers/c1/kill").empty());
  engine_.Release();
  Settle(l, TimePoint{} + Millis(1500));
  EXPECT_THAT(engine_.Matching("POST /v1.41/containers/c1/kill"),
              ::testing::ElementsAre("POST /v1.41/containers/c1/kill?signal=SIGTERM"));
}

TEST_F(DockerLauncherFakeTest, CancelledStopSendsNothing) {
  DockerLauncher l(Options());
  engine_.Set("GET /v1.41/containers/json", 200, "[" + ListEntry("c1", "running", "p1", "w1") + "]");
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  l.Stop("w1", Seconds(5), TimePoint{});
  l.CancelStop("w1");
  Settle(l, TimePoint{} + Seconds(60));
  EXPECT_TRUE(engine_.Matching("POST /v1.41/containers/c1/kill").empty());
  EXPECT_THAT(l.Alive(), ::testing::ElementsAre("w1"));
}

TEST_F(DockerLauncherFakeTest, EngineOutageInPollDecidesNothing) {
  DockerLauncher l(Options());
  engine_.Set("GET /v1.41/containers/json", 500, R"({"message":"busy"})");
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  EXPECT_TRUE(Settle(l, TimePoint{}).empty());
  EXPECT_THAT(l.Alive(), ::testing::ElementsAre("w1"));
  engine_.Set("GET /v1.41/containers/json", 200, "not json");
  EXPECT_TRUE(Settle(l, TimePoint{}).empty());
  EXPECT_THAT(l.Alive(), ::testing::ElementsAre("w1"));
}

TEST_F(DockerLauncherFakeTest, ContainerRemovedBehindItsBackCountsAsExited) {
  DockerLauncher l(Options());
  std::string err;
  ASSERT_TRUE(l.Start("w1", TimePoint{}, &err)) << err;
  std::vector<Exited> exited = Settle(l, TimePoint{});  // the list is empty
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].id, "w1");
  EXPECT_TRUE(l.Alive().empty());
}

// --- several engines (--docker-engine, repeated) ---------------------------

class DockerEnginesTest : public DockerLauncherFakeTest {
 protected:
  // Launchers over engine_ (first) and a second engine at `second`.
  std::unique_ptr<DockerLauncher> Two(const std::string& second) {
    std::vector<std::unique_ptr<ContainerEngine>> engines;
    engines.push_back(std::make_unique<DockerEngine>(Options()));
    DockerOptions o = Options();
    o.socket_path = second;
    engines.push_back(std::make_unique<DockerEngine>(o));
    return std::make_unique<DockerLauncher>(std::move(engines));
  }
  std::string socket2_ = dir_.path() + "/docker2.sock";
};

TEST_F(DockerEnginesTest, StartsGoToTheEngineWithTheFewestWorkers) {
  FakeEngine second(socket2_);
  engine_.SetContainers({ListEntry("a1", "running", "p1", "w9")});  // adopted: one already
  auto l = Two(socket2_);
  EXPECT_TRUE(Settle(*l, TimePoint{}).empty());
  EXPECT_THAT(l->TakeAdopted(), ::testing::ElementsAre("w9"));
  std::string err;
  for (const char* id : {"w1", "w2", "w3"}) ASSERT_TRUE(l->Start(id, TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  // w1 to the empty second engine, then one each (a tie goes to the first).
  EXPECT_THAT(l->WorkersPerEngine(), ::testing::ElementsAre(2u, 2u));
  EXPECT_THAT(second.Matching("POST /v1.41/containers/create"),
              ::testing::ElementsAre("POST /v1.41/containers/create?name=p1-w1",
                                     "POST /v1.41/containers/create?name=p1-w3"));
  EXPECT_THAT(engine_.Matching("POST /v1.41/containers/create"),
              ::testing::ElementsAre("POST /v1.41/containers/create?name=p1-w2"));
}

TEST_F(DockerEnginesTest, AFailingEngineIsSkippedUntilItAnswersAgain) {
  FakeEngine second(socket2_);
  second.Set("GET /v1.41/containers/json", 500, R"({"message":"engine is shutting down"})");
  auto l = Two(socket2_);
  EXPECT_TRUE(Settle(*l, TimePoint{}).empty());
  // (This fake engine names every container c1.)
  engine_.SetContainers({ListEntry("c1", "running", "p1", "w1")});
  std::string err;
  for (const char* id : {"w1", "w2", "w3"}) ASSERT_TRUE(l->Start(id, TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  EXPECT_THAT(l->WorkersPerEngine(), ::testing::ElementsAre(3u, 0u));
  EXPECT_TRUE(second.Matching("POST /v1.41/containers/create").empty());

  second.Set("GET /v1.41/containers/json", 200, "[]");
  Settle(*l, TimePoint{}, 2);  // its list answers again
  ASSERT_TRUE(l->Start("w4", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  EXPECT_THAT(second.Matching("POST /v1.41/containers/create"),
              ::testing::ElementsAre("POST /v1.41/containers/create?name=p1-w4"));
}

TEST_F(DockerEnginesTest, AnEngineThatRefusesCreatesGetsNoStartsForAWhile) {
  FakeEngine second(socket2_);
  second.Set("POST /v1.41/containers/create", 404, R"({"message":"No such image: fleet:test"})");
  auto l = Two(socket2_);
  engine_.SetContainers({ListEntry("c1", "running", "p1", "w0")});
  std::string err;
  const TimePoint t0 = TimePoint{} + Seconds(100);
  ASSERT_TRUE(l->Start("w0", t0, &err)) << err;  // the first (a tie)
  ASSERT_TRUE(l->Start("w1", t0, &err)) << err;  // the second: fewer workers
  std::vector<Exited> exited = Settle(*l, t0, 1);
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_THAT(exited[0].error, HasSubstr("No such image"));
  // It answers lists, so it is not down; but with the fewest workers it
  // would take every start and fail each. For 1 s it gets none.
  ASSERT_TRUE(l->Start("w2", t0 + Millis(500), &err)) << err;
  EXPECT_THAT(l->WorkersPerEngine(), ::testing::ElementsAre(2u, 0u));
  Settle(*l, t0 + Millis(500), 1);
  ASSERT_TRUE(l->Start("w3", t0 + Seconds(2), &err)) << err;  // backoff over: tried again
  EXPECT_THAT(l->WorkersPerEngine(), ::testing::ElementsAre(2u, 1u));
  exited = Settle(*l, t0 + Seconds(2), 1);
  ASSERT_EQ(exited.size(), 1u);
  // A second refusal in a row: 2 s this time.
  ASSERT_TRUE(l->Start("w4", t0 + Seconds(3), &err)) << err;
  EXPECT_THAT(l->WorkersPerEngine(), ::testing::ElementsAre(3u, 0u));
  EXPECT_EQ(second.Matching("POST /v1.41/containers/create").size(), 2u);
}

TEST_F(DockerEnginesTest, AnEngineDownAtStartUpIsSkippedThenUsedOnceItAnswers) {
  engine_.SetContainers({ListEntry("c1", "running", "p1", "w1")});
  auto l = Two(socket2_);  // nothing listens on the second socket yet
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;
  EXPECT_THAT(l->WorkersPerEngine(), ::testing::ElementsAre(1u, 0u));
  Settle(*l, TimePoint{}, 1);
  FakeEngine second(socket2_);
  Settle(*l, TimePoint{}, 2);  // its list checks it first, then lists it
  ASSERT_TRUE(l->Start("w2", TimePoint{}, &err)) << err;
  ASSERT_TRUE(l->WaitIdle(std::chrono::seconds(20)));
  EXPECT_THAT(second.Matching("POST /v1.41/containers/create"),
              ::testing::ElementsAre("POST /v1.41/containers/create?name=p1-w2"));
  EXPECT_EQ(second.Matching("GET /v1.41/images/fleet:test/json").size(), 1u);  // checked
}

TEST_F(DockerEnginesTest, NoEngineAnsweringIsAnErrorAndSoIsAnyOtherFinding) {
  DockerOptions missing = Options();
  missing.socket_path = dir_.path() + "/none.sock";
  std::vector<std::unique_ptr<ContainerEngine>> engines;
  engines.push_back(std::make_unique<DockerEngine>(missing));
  missing.socket_path = socket2_;
  engines.push_back(std::make_unique<DockerEngine>(missing));
  EXPECT_THAT(ThrownBy([&] { DockerLauncher l(std::move(engines)); }),
              HasSubstr("no engine answers"));
  // An engine that answers but lacks the image is a mistake, not an outage.
  FakeEngine second(socket2_);
  second.Set("GET /v1.41/images/", 404, R"({"message":"no such image"})");
  EXPECT_THAT(ThrownBy([&] { Two(socket2_); }), HasSubstr("image fleet:test does not exist"));
  // And a tcp:// engine without TLS is refused before anything is asked.
  DockerOptions tcp = Options();
  tcp.socket_path = "tcp://127.0.0.1:2375";
  EXPECT_THAT(ThrownBy([&] { DockerEngine e(tcp); }), HasSubstr("needs TLS"));
}

TEST_F(DockerEnginesTest, AKilledWorkerOfAnEngineThatStoppedAnsweringIsCountedGone) {
  FakeEngine second(socket2_);
  auto l = Two(socket2_);
  std::string err;
  ASSERT_TRUE(l->Start("w1", TimePoint{}, &err)) << err;  // to the first (tie)
  ASSERT_TRUE(l->Start("w2", TimePoint{}, &err)) << err;  // to the second
  second.Set("GET /v1.41/containers/json", 200, "[" + ListEntry("c1", "running", "p1", "w2") + "]");
  engine_.SetContainers({ListEntry("c1", "running", "p1", "w1")});
  EXPECT_TRUE(Settle(*l, TimePoint{}).empty());
  EXPECT_THAT(l->WorkersPerEngine(), ::testing::ElementsAre(1u, 1u));
  second.Set("GET /v1.41/containers/json", 500, R"({"message":"down"})");
  l->Stop("w2", Seconds(1), TimePoint{});
  EXPECT_TRUE(Settle(*l, TimePoint{} + Seconds(1)).empty());  // SIGTERM (lost)
  // SIGKILL (lost too), then it is counted gone rather than kept forever.
  std::vector<Exited> exited = Settle(*l, TimePoint{} + Seconds(2));
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].id, "w2");
  EXPECT_THAT(l->Alive(), ::testing::ElementsAre("w1"));
}

TEST(ParseByteSizeTest, UnitsAndGarbage) {
  EXPECT_EQ(ParseByteSize("0"), 0);
  EXPECT_EQ(ParseByteSize("4096"), 4096);
  EXPECT_EQ(ParseByteSize("512m"), 512ll << 20);
  EXPECT_EQ(ParseByteSize("512MiB"), 512ll << 20);
  EXPECT_EQ(ParseByteSize("2g"), 2ll << 30);
  EXPECT_EQ(ParseByteSize("64k"), 64ll << 10);
  EXPECT_EQ(ParseByteSize(""), std::nullopt);
  EXPECT_EQ(ParseByteSize("-1"), std::nullopt);
  EXPECT_EQ(ParseByteSize("12x"), std::nullopt);
  EXPECT_EQ(ParseByteSize("m"), std::nullopt);
  EXPECT_EQ(ParseByteSize("99999999999999999999"), std::nullopt);
  EXPECT_EQ(ParseByteSize("9999999999g"), std::nullopt);
}

}  // namespace
}  // namespace fleet::autoscaler

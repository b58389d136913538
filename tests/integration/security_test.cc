// CURVE on the broker's endpoints, end to end with the real programs: keys
// from fleet-ctl keygen, allowlists per endpoint, roles from the endpoint a
// key is listed for, and the broker's start-up checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "tests/support/cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

// The Z85 key of a .pub file ("public = KEY").
std::string ReadKeyLine(const std::string& path) {
  const std::string text = ReadFile(path);
  const auto at = text.find("public = ");
  return at == std::string::npos ? "" : text.substr(at + 9, 40);
}

class CurveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"broker", "producer", "worker", "control", "stranger"}) {
      RunResult r = fleet::testing::Run({Bin("fleet-ctl"), "keygen", dir_.File(name)}, seconds(20),
                        dir_.File(std::string("keygen-") + name + ".log"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    Allow("producers.keys", "producer");
    Allow("workers.keys", "worker");
    Allow("control.keys", "control");
  }
  void Allow(const std::string& list, const std::string& who) {
    std::ofstream(dir_.File(list)) << "# " << who << "\n" << ReadFile(dir_.File(who + ".pub"));
  }
  std::vector<std::string> BrokerFlags() {
    return {"--curve-secret-key", dir_.File("broker.key"),
            "--curve-producers",  dir_.File("producers.keys"),
            "--curve-workers",    dir_.File("workers.keys"),
            "--curve-control",    dir_.File("control.keys")};
  }
  std::vector<std::string> As(const std::string& who) {
    return {"--curve-server-key", dir_.File("broker.pub"), "--curve-key", dir_.File(who + ".key")};
  }
  bool Listed(Cluster& c, const std::string& id) {
    for (const auto& w : c.Workers()) {
      if (w.value("id", "") == id) return true;
    }
    return false;
  }
  TempDir dir_;
};

TEST_F(CurveTest, KeygenWritesASecretKeyOnlyItsOwnerReadsAndNeverOverwrites) {
  struct stat st {};
  ASSERT_EQ(stat(dir_.File("producer.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_THAT(ReadFile(dir_.File("producer.key")), ::testing::HasSubstr("secret = "));
  EXPECT_THAT(ReadFile(dir_.File("producer.pub")), ::testing::Not(::testing::HasSubstr("secret")));
  RunResult again = fleet::testing::Run({Bin("fleet-ctl"), "keygen", dir_.File("producer")}, seconds(20),
                        dir_.File("keygen-again.log"));
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.output, ::testing::HasSubstr("refusing to overwrite"));
}

TEST_F(CurveTest, ListedKeysWorkInTheirRoleAndNoOtherKeyGetsAnythingThrough) {
  Cluster c;
  c.StartBroker(BrokerFlags());
  EXPECT_THAT(c.BrokerLog(), ::testing::HasSubstr("an unknown key was refused on every endpoint"));
  c.set_ctl_flags(As("control"));
  std::vector<std::string> worker_flags = As("worker");
  worker_flags.insert(worker_flags.end(), {"--handler", "echo", "--concurrency", "4"});
  c.StartWorker("good", worker_flags);
  ASSERT_TRUE(WaitFor([&] { return Listed(c, "good"); })) << c.WorkerLog("good");

  std::vector<std::string> submit = As("producer");
  submit.insert(submit.end(), {"--count", "200", "--payload", "hi"});
  Cluster::Submitted ok = c.Submit(submit);
  EXPECT_EQ(ok.summary["ok"], "200") << ok.run.output;

  // A worker with the producer's key (a role it does not have) and a worker
  // with an unlisted key never register.
  std::vector<std::string> as_producer = As("producer");
  as_producer.insert(as_producer.end(), {"--handler", "echo"});
  c.StartWorker("wrong-role", as_producer);
  std::vector<std::string> as_stranger = As("stranger");
  as_stranger.insert(as_stranger.end(), {"--handler", "echo"});
  c.StartWorker("stranger", as_stranger);

  // Producers without a key, with an unknown key, or with the worker's key:
  // nothing accepted, no result, and they say so.
  for (const std::vector<std::string>& who :
       {std::vector<std::string>{}, As("stranger"), As("worker"), As("control")}) {
    std::vector<std::string> args = who;
    args.insert(args.end(), {"--count", "5", "--payload", "x", "--timeout-seconds", "2"});
    Cluster::Submitted bad = c.Submit(args, seconds(30));
    EXPECT_NE(bad.run.exit_code, 0) << bad.run.output;
    EXPECT_EQ(bad.summary["ok"], "0") << bad.run.output;
    EXPECT_TRUE(bad.results.empty());
  }
  // Control with the producer's key cannot even list workers, let alone
  // retire one.
  // (Not through c.Ctl, which would add the control key's flags too.)
  RunResult retire = fleet::testing::Run(
      {Bin("fleet-ctl"), "--control", c.control(), "--curve-server-key", dir_.File("broker.pub"),
       "--curve-key", dir_.File("producer.key"), "--timeout-ms", "1500", "retire", "good"},
      seconds(20), dir_.File("retire.log"));
  EXPECT_EQ(retire.exit_code, 2) << retire.output;
  EXPECT_THAT(retire.output, ::testing::HasSubstr("no answer")) << retire.output;

  EXPECT_TRUE(Listed(c, "good"));
  EXPECT_FALSE(Listed(c, "wrong-role"));
  EXPECT_FALSE(Listed(c, "stranger"));
  EXPECT_EQ(c.StatValue("submitted"), 200);  // only the legitimate producer's
  EXPECT_EQ(c.StatValue("workers_retired"), 0);
  EXPECT_THAT(c.BrokerLog(), ::testing::HasSubstr("refused a CURVE client on the producers"));
  EXPECT_THAT(c.BrokerLog(), ::testing::HasSubstr("refused a CURVE client on the workers"));
  EXPECT_THAT(c.BrokerLog(), ::testing::HasSubstr("refused a CURVE client on the control"));
}

// Regression: the start-up self-check logged three "refused a CURVE
// client" warnings that looked like an attack, while a producer without
// keys (or with the wrong server key) was refused with no line at all.
TEST_F(CurveTest, EveryRefusedClientIsLoggedAndCountedButTheSelfCheckIsNot) {
  Cluster c;
  c.StartBroker(BrokerFlags());
  EXPECT_THAT(c.BrokerLog(), ::testing::HasSubstr("an unknown key was refused on every endpoint"));
  EXPECT_THAT(c.BrokerLog(), ::testing::Not(::testing::HasSubstr("refused a")));
  const std::string series = "fleet_curve_refused_total{endpoint=\"producers\",reason=\"";
  auto count = [&](const std::string& reason) {
    const std::string page = HttpGet(c.metrics());
    const auto at = page.find(series + reason + "\"} ");
    return at == std::string::npos ? -1.0
                                   : std::atof(page.c_str() + at + series.size() + reason.size() + 3);
  };
  EXPECT_TRUE(WaitFor([&] { return count("key") == 0; })) << HttpGet(c.metrics());

  // Plain TCP (seen as a mechanism mismatch, or as a hang-up during the
  // handshake when the client noticed the mismatch first), a wrong server
  // key (the stranger's .pub), an unlisted key.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "producers endpoint (tcp://127.0.0.1:"},
      {{"--curve-server-key", dir_.File("stranger.pub"), "--curve-key", dir_.File("producer.key")},
       "did not decrypt"},
      {As("stranger"), "is not on the endpoint's allowlist"}};
  for (const auto& [flags, says] : cases) {
    std::vector<std::string> args = flags;
    args.insert(args.end(), {"--count", "1", "--timeout-seconds", "1"});
    Cluster::Submitted bad = c.Submit(args, seconds(30));
    EXPECT_NE(bad.run.exit_code, 0) << bad.run.output;
    EXPECT_TRUE(WaitFor([&] { return c.BrokerLog().find(says) != std::string::npos; }))
        << says << "\n" << c.BrokerLog();
  }
  const std::string log = c.BrokerLog();
  EXPECT_TRUE(log.find("does not speak CURVE") != std::string::npos ||
              log.find("typically a client that does not speak CURVE") != std::string::npos)
      << log;
  EXPECT_THAT(log, ::testing::HasSubstr("from 127.0.0.1: its key " +
                                        ReadKeyLine(dir_.File("stranger.pub"))));
  EXPECT_TRUE(WaitFor([&] {
    return count("mechanism") + count("other") >= 1 && count("cryptographic") >= 1 &&
           count("key") >= 1;
  })) << HttpGet(c.metrics());
}

TEST_F(CurveTest, BrokerRefusesHalfAConfigurationOrABadKeyFile) {
  auto start = [&](std::vector<std::string> flags, const std::string& log) {
    std::vector<std::string> argv = {Bin("fleet-broker"), "--frontend", "tcp://127.0.0.1:*",
                                     "--backend", "tcp://127.0.0.1:*", "--control",
                                     "tcp://127.0.0.1:*", "--metrics", ""};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return fleet::testing::Run(argv, seconds(20), dir_.File(log));
  };
  RunResult no_lists = start({"--curve-secret-key", dir_.File("broker.key")}, "b1.log");
  EXPECT_NE(no_lists.exit_code, 0);
  EXPECT_THAT(no_lists.output, ::testing::HasSubstr("needs an allowlist for each endpoint"));

  std::vector<std::string> pub_only = BrokerFlags();
  pub_only[1] = dir_.File("broker.pub");
  RunResult no_secret = start(pub_only, "b2.log");
  EXPECT_NE(no_secret.exit_code, 0);
  EXPECT_THAT(no_secret.output, ::testing::HasSubstr("no secret key"));

  std::ofstream(dir_.File("bad.keys")) << "not-a-key\n";
  std::vector<std::string> bad_list = BrokerFlags();
  bad_list[3] = dir_.File("bad.keys");
  RunResult bad = start(bad_list, "b3.log");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, ::testing::HasSubstr("bad.keys:1: not a public key"));
}

}  // namespace
}  // namespace fleet::testing

// CURVE on the broker's endpoints, end to end with the real programs: keys
// from fleet-ctl keygen, allowlists per endpoint, roles from the endpoint a
// key is listed for, and the broker's start-up checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csignal>
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
  EXPECT_EQ(retire.exit_code, 3) << retire.output;
  EXPECT_THAT(retire.output, ::testing::HasSubstr("authentication failed")) << retire.output;

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

// Each way a client can be refused, for each client program: the program
// says "authentication failed" and exits 3, instead of waiting in silence
// (fleet-worker), counting its batches as lost (fleet-submit) or asking
// whether the broker runs (fleet-ctl).
TEST_F(CurveTest, RefusedClientsSayAuthenticationFailedAndExit3) {
  Cluster c;
  c.StartBroker(BrokerFlags());
  c.set_ctl_flags(As("control"));
  struct Case {
    const char* name;
    std::vector<std::string> flags;  // with the role's own key substituted below
    const char* says;
  };
  auto with_key = [&](const std::string& server_pub, const std::string& key) {  // key: a name
    return std::vector<std::string>{"--curve-server-key", dir_.File(server_pub), "--curve-key",
                                    dir_.File(key + ".key")};
  };
  struct Program {
    const char* name;
    const char* own_key;  // the key listed for its endpoint
  };
  for (const Program& p : {Program{"fleet-submit", "producer"}, Program{"fleet-ctl", "control"},
                           Program{"fleet-worker", "worker"}}) {
    const std::vector<Case> cases = {
        // Either side may notice the mismatch first: the client reads it
        // (a mismatch, once) or the broker hangs up on it (hang-ups).
        {"plaintext", {}, "requires CURVE and this client speaks plain TCP|does it require CURVE"},
        {"wrong server key", with_key("stranger.pub", p.own_key), "hung up during the handshake"},
        {"unlisted key", with_key("broker.pub", "stranger"), "refused this client's key"},
    };
    for (const Case& k : cases) {
      std::vector<std::string> argv = {Bin(p.name)};
      const std::string program = p.name;
      if (program == "fleet-submit") {
        argv.insert(argv.end(), {"--broker", c.frontend(), "--count", "3", "--payload", "x"});
      } else if (program == "fleet-ctl") {
        argv.insert(argv.end(), {"--control", c.control(), "--timeout-ms", "60000"});
      } else {
        argv.insert(argv.end(), {"--broker", c.backend(), "--id", "refused"});
      }
      argv.insert(argv.end(), k.flags.begin(), k.flags.end());
      if (program == "fleet-ctl") argv.push_back("workers");
      // Bounded far above what it takes (measured: under 1 s for the
      // wrong server key, milliseconds for the others).
      RunResult r = fleet::testing::Run(argv, seconds(60),
                                        dir_.File(program + "-" + std::to_string(&k - &cases[0]) +
                                                  ".log"));
      EXPECT_EQ(r.exit_code, 3) << p.name << ", " << k.name << ": " << r.output;
      EXPECT_THAT(r.output, ::testing::HasSubstr("authentication failed"))
          << p.name << ", " << k.name;
      EXPECT_THAT(r.output, ::testing::ContainsRegex(k.says)) << p.name << ", " << k.name;
      if (program == "fleet-submit") {
        EXPECT_THAT(r.output, ::testing::HasSubstr("submitted=3 ok=0 failed=0 lost=3"))
            << k.name;
      }
    }
  }
  EXPECT_EQ(c.StatValue("submitted"), 0);
}

// The broker names the peer's address in its line about a refused
// handshake, including a plain-TCP client that never reached the key check,
// and holds back repeats from one address.
TEST_F(CurveTest, BrokerLogsRefusedHandshakesByPeerAddressRateLimited) {
  Cluster c;
  c.StartBroker(BrokerFlags());
  for (int i = 0; i < 3; ++i) {
    Cluster::Submitted plain = c.Submit({"--count", "1", "--timeout-seconds", "30"}, seconds(60));
    EXPECT_EQ(plain.run.exit_code, 3) << plain.run.output;
  }
  Cluster::Submitted wrong = c.Submit(
      {"--count", "1", "--timeout-seconds", "30", "--curve-server-key", dir_.File("stranger.pub"),
       "--curve-key", dir_.File("producer.key")},
      seconds(60));
  EXPECT_EQ(wrong.run.exit_code, 3) << wrong.run.output;
  ASSERT_TRUE(WaitFor([&] {
    return c.BrokerLog().find("did not decrypt") != std::string::npos &&
           c.BrokerLog().find("does not speak CURVE") != std::string::npos;
  })) << c.BrokerLog();
  const std::string log = c.BrokerLog();
  // "from 127.0.0.1", or "from address unknown" when the connection was
  // gone before the broker's loop looked (best effort: see curve_monitor.h).
  // The broker sees a plain client as a mechanism mismatch, or as a hang-up
  // when the client noticed first.
  EXPECT_THAT(log, ::testing::ContainsRegex("refused a client on the producers endpoint "
                                            "\\(tcp://127\\.0\\.0\\.1:[0-9]+\\) from "
                                            "(127\\.0\\.0\\.1|address unknown): (it does not "
                                            "speak CURVE|the connection ended during the "
                                            "handshake)"));
  // Four clients, at least 3 + 50 refusals (the wrong key is retried every
  // 100-200 ms until the client gives up, after 10 s): a handful of lines,
  // at most one per address, endpoint and reason per 10 s.
  std::size_t lines = 0;
  for (std::size_t at = log.find("refused a client on the producers endpoint");
       at != std::string::npos; at = log.find("refused a client on the producers endpoint", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 10u) << log;
}

// SIGHUP: a key added to an allowlist gets in without a restart, a removed
// one is refused on its next handshake, and a malformed list keeps the old
// ones.
TEST_F(CurveTest, SighupReloadsTheAllowlists) {
  Cluster c;
  c.StartBroker(BrokerFlags());
  c.set_ctl_flags(As("control"));
  std::vector<std::string> worker_flags = As("worker");
  worker_flags.insert(worker_flags.end(), {"--handler", "echo"});
  c.StartWorker("w", worker_flags);
  ASSERT_TRUE(WaitFor([&] { return Listed(c, "w"); })) << c.WorkerLog("w");
  auto submit_as = [&](const std::string& who) {
    std::vector<std::string> args = As(who);
    args.insert(args.end(), {"--count", "5", "--payload", "hi", "--timeout-seconds", "60"});
    return c.Submit(args, seconds(90));
  };
  ASSERT_EQ(submit_as("producer").run.exit_code, 0);
  EXPECT_EQ(submit_as("stranger").run.exit_code, 3);

  // The stranger in, the producer out.
  Allow("producers.keys", "stranger");
  ::kill(c.broker().pid(), SIGHUP);
  ASSERT_TRUE(WaitFor([&] {
    return c.BrokerLog().find("CURVE allowlists reloaded: control 1 keys (+0 -0), producers 1 "
                              "keys (+1 -1), workers 1 keys (+0 -0)") != std::string::npos;
  })) << c.BrokerLog();
  Cluster::Submitted now_in = submit_as("stranger");
  EXPECT_EQ(now_in.run.exit_code, 0) << now_in.run.output;
  EXPECT_EQ(now_in.summary["ok"], "5");
  Cluster::Submitted now_out = submit_as("producer");
  EXPECT_EQ(now_out.run.exit_code, 3) << now_out.run.output;
  EXPECT_THAT(now_out.run.output, ::testing::HasSubstr("refused this client's key"));
  EXPECT_TRUE(Listed(c, "w")) << "the reload leaves the other lists and connections alone";

  // A list with a bad line: nothing changes.
  std::ofstream(dir_.File("producers.keys"), std::ios::app) << "not-a-key\n";
  ::kill(c.broker().pid(), SIGHUP);
  ASSERT_TRUE(WaitFor([&] {
    return c.BrokerLog().find("CURVE allowlists not reloaded, the old ones stay in force: ") !=
           std::string::npos;
  })) << c.BrokerLog();
  EXPECT_THAT(c.BrokerLog(), ::testing::HasSubstr("producers.keys:4: not a public key"));
  EXPECT_EQ(submit_as("stranger").run.exit_code, 0);
  EXPECT_EQ(submit_as("producer").run.exit_code, 3);
}

// A secret key that group or others may read is refused by every program
// that reads one, naming the file, its mode and the fix.
TEST_F(CurveTest, SecretKeysOthersMayReadAreRefusedByEveryProgram) {
  for (const char* name : {"broker", "producer", "worker", "control"}) {
    ASSERT_EQ(::chmod(dir_.File(std::string(name) + ".key").c_str(), 0640), 0);
  }
  struct Case {
    std::vector<std::string> argv;
    std::string key;
  };
  const std::vector<Case> cases = {
      {{Bin("fleet-broker"), "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
        "--control", "tcp://127.0.0.1:*", "--metrics", "", "--curve-secret-key",
        dir_.File("broker.key"), "--curve-producers", dir_.File("producers.keys"),
        "--curve-workers", dir_.File("workers.keys"), "--curve-control", dir_.File("control.keys")},
       "broker.key"},
      {{Bin("fleet-submit"), "--broker", "tcp://127.0.0.1:1", "--count", "1", "--curve-server-key",
        dir_.File("broker.pub"), "--curve-key", dir_.File("producer.key")},
       "producer.key"},
      {{Bin("fleet-worker"), "--broker", "tcp://127.0.0.1:1", "--id", "w", "--curve-server-key",
        dir_.File("broker.pub"), "--curve-key", dir_.File("worker.key")},
       "worker.key"},
      {{Bin("fleet-ctl"), "--control", "tcp://127.0.0.1:1", "--curve-server-key",
        dir_.File("broker.pub"), "--curve-key", dir_.File("control.key"), "workers"},
       "control.key"},
      {{Bin("fleet-autoscaler"), "--control", "tcp://127.0.0.1:1", "--metrics", "",
        "--curve-server-key", dir_.File("broker.pub"), "--curve-key", dir_.File("control.key")},
       "control.key"},
  };
  for (const Case& k : cases) {
    RunResult r = fleet::testing::Run(k.argv, seconds(20), dir_.File("mode-" + k.key + ".log"));
    EXPECT_EQ(r.exit_code, 2) << k.argv[0] << ": " << r.output;
    EXPECT_THAT(r.output, ::testing::HasSubstr("secret key file " + dir_.File(k.key) +
                                               " has mode 0640"))
        << k.argv[0];
    EXPECT_THAT(r.output, ::testing::HasSubstr("chmod 600 " + dir_.File(k.key))) << k.argv[0];
  }
  // Owner-only modes work; public keys and allowlists need none.
  ASSERT_EQ(::chmod(dir_.File("broker.key").c_str(), 0400), 0);
  ASSERT_EQ(::chmod(dir_.File("producers.keys").c_str(), 0644), 0);
  Cluster c;
  c.StartBroker(BrokerFlags());
  EXPECT_THAT(c.BrokerLog(), ::testing::HasSubstr("an unknown key was refused on every endpoint"));
}

}  // namespace
}  // namespace fleet::testing

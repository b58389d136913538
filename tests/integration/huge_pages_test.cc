// The broker runs with glibc's huge-page malloc when the kernel offers THP
// per region (common/huge_pages.h); workers run as started, since their
// start-up time is on the path of scaling from zero. Checked on the real
// programs: /proc/PID/environ is the environment a process was exec'd with.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "common/huge_pages.h"
#include "tests/support/cluster.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

std::string Environ(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& ch : env) {
    if (ch == '\0') ch = '\n';
  }
  return "\n" + env;
}

// The GLIBC_TUNABLES this machine makes a program re-execute with, started
// with `tunables` and `opt_out` (FLEET_MALLOC_HUGEPAGES); nullopt: none.
std::optional<std::string> Expected(const char* tunables, const char* opt_out) {
  if (SanitizerBuild() || !GlibcHasTunable()) return std::nullopt;
  return HugePageTunables(tunables, ThpMode(), opt_out);
}

// The probe's report, run through env(1) with `env_args` (-u NAME, K=V).
std::string Probe(const std::vector<std::string>& env_args) {
  TempDir dir;
  std::vector<std::string> argv = {"/usr/bin/env"};
  argv.insert(argv.end(), env_args.begin(), env_args.end());
  argv.push_back(HUGE_PAGES_PROBE);
  RunResult r = Run(argv, std::chrono::seconds(30), dir.File("probe.log"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// After its re-exec a program sees GLIBC_TUNABLES as it was started with
// (so what it starts inherits nothing of ours), while glibc read it with
// the tunable; the marker variable is gone.
TEST(HugePageMallocTest, ReExecutesWithTheTunableThenPutsTheVariableBack) {
  const std::string unset = Probe({"-u", "GLIBC_TUNABLES", "-u", "FLEET_MALLOC_HUGEPAGES",
                                   "-u", "FLEET_SAVED_GLIBC_TUNABLES"});
  EXPECT_NE(unset.find("now GLIBC_TUNABLES=(unset)\n"), std::string::npos) << unset;
  EXPECT_NE(unset.find("now FLEET_SAVED_GLIBC_TUNABLES=(unset)\n"), std::string::npos) << unset;
  const std::string kept = Probe({"-u", "FLEET_MALLOC_HUGEPAGES", "-u",
                                  "FLEET_SAVED_GLIBC_TUNABLES",
                                  "GLIBC_TUNABLES=glibc.malloc.arena_max=2"});
  EXPECT_NE(kept.find("now GLIBC_TUNABLES=glibc.malloc.arena_max=2\n"), std::string::npos)
      << kept;
  EXPECT_NE(kept.find("now FLEET_SAVED_GLIBC_TUNABLES=(unset)\n"), std::string::npos) << kept;
  if (!Expected(nullptr, nullptr)) {
    EXPECT_EQ(unset.find("exec'd with"), std::string::npos) << unset;
    return;
  }
  // Re-executed: with the tunable, and with the marker holding the value
  // to put back (glibc may rewrite a GLIBC_TUNABLES of several tunables in
  // place, so the marker is what shows the second exec of `kept`).
  EXPECT_NE(unset.find("exec'd with GLIBC_TUNABLES=glibc.malloc.hugetlb=1\n"),
            std::string::npos) << unset;
  EXPECT_NE(unset.find("exec'd with FLEET_SAVED_GLIBC_TUNABLES=\x01unset\n"), std::string::npos)
      << unset;
  EXPECT_NE(kept.find("exec'd with FLEET_SAVED_GLIBC_TUNABLES=glibc.malloc.arena_max=2\n"),
            std::string::npos) << kept;
}

// A marker variable the program did not set is dropped, not trusted.
TEST(HugePageMallocTest, AStrayMarkerIsIgnored) {
  const std::string out = Probe({"-u", "GLIBC_TUNABLES", "-u", "FLEET_MALLOC_HUGEPAGES",
                                 "FLEET_SAVED_GLIBC_TUNABLES=glibc.malloc.arena_max=9"});
  EXPECT_NE(out.find("now GLIBC_TUNABLES=(unset)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("now FLEET_SAVED_GLIBC_TUNABLES=(unset)\n"), std::string::npos) << out;
}

TEST(HugePageMallocTest, BrokerRunsWithItUnderItsOwnNameWorkersAsStarted) {
  const std::optional<std::string> want =
      Expected(std::getenv("GLIBC_TUNABLES"), std::getenv("FLEET_MALLOC_HUGEPAGES"));
  Cluster c;
  c.StartBroker();  // returns once the broker wrote its ready file: past any re-exec
  Process& worker = c.StartWorker("w1");
  ASSERT_TRUE(WaitFor([&] { return c.Workers().size() == 1; }, std::chrono::seconds(30)))
      << c.WorkerLog("w1");

  const pid_t broker = c.broker().pid();
  EXPECT_EQ(ReadFile("/proc/" + std::to_string(broker) + "/comm"), "fleet-broker\n");
  const std::string env = Environ(broker);
  if (want) {
    EXPECT_NE(env.find("\nGLIBC_TUNABLES=" + *want + "\n"), std::string::npos) << env;
  } else {
    EXPECT_EQ(env.find("glibc.malloc.hugetlb"), std::string::npos) << env;
  }
  const std::string worker_env = Environ(worker.pid());
  EXPECT_EQ(worker_env.find("glibc.malloc.hugetlb"), std::string::npos) << worker_env;
  EXPECT_EQ(worker_env.find("FLEET_SAVED_GLIBC_TUNABLES"), std::string::npos) << worker_env;
}

TEST(HugePageMallocTest, OptOutRunsTheBrokerAsStarted) {
  TempDir dir;
  const std::string ready = dir.File("ready");
  Process broker({Bin("fleet-broker"), "--ready-file", ready, "--frontend", "tcp://127.0.0.1:*",
                  "--backend", "tcp://127.0.0.1:*", "--control", "tcp://127.0.0.1:*",
                  "--metrics", "127.0.0.1:0"},
                 dir.File("broker.log"), {"FLEET_MALLOC_HUGEPAGES=0"});
  ASSERT_TRUE(WaitFor([&] { return !ReadFile(ready).empty(); }, std::chrono::seconds(10)))
      << broker.ReadLog();
  const std::string env = Environ(broker.pid());
  EXPECT_NE(env.find("\nFLEET_MALLOC_HUGEPAGES=0\n"), std::string::npos) << env;
  EXPECT_EQ(env.find("glibc.malloc.hugetlb"), std::string::npos) << env;
}

}  // namespace
}  // namespace fleet::testing

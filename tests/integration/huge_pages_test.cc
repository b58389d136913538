// The broker and the worker run with glibc's huge-page malloc when the
// kernel offers THP per region (common/huge_pages.h), and what they start
// does not inherit that choice. Checked on the real programs: a process's
// /proc/PID/environ is the environment it was exec'd with.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

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

// What this machine and this test's environment make the programs do.
std::optional<std::string> Expected() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string mode((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (SanitizerBuild()) return std::nullopt;
  return HugePageTunables(std::getenv("GLIBC_TUNABLES"), mode,
                          std::getenv("FLEET_MALLOC_HUGEPAGES"));
}

TEST(HugePageMallocTest, BrokerAndWorkerRunWithItTheirHandlersDoNot) {
  const std::optional<std::string> want = Expected();
  Cluster c;
  c.StartBroker();
  Process& worker = c.StartWorker(
      "w1", {"--handler", "exec", "--exec", "echo \"${GLIBC_TUNABLES-unset}\""});
  // Registered: past its re-exec, if it makes one.
  ASSERT_TRUE(WaitFor([&] { return c.Workers().size() == 1; }, std::chrono::seconds(30)))
      << c.WorkerLog("w1");
  for (pid_t pid : {c.broker().pid(), worker.pid()}) {
    // Named after its own binary still (ps, pgrep, top).
    EXPECT_EQ(ReadFile("/proc/" + std::to_string(pid) + "/comm"),
              pid == worker.pid() ? "fleet-worker\n" : "fleet-broker\n");
    const std::string env = Environ(pid);
    if (want) {
      EXPECT_NE(env.find("\nGLIBC_TUNABLES=" + *want + "\n"), std::string::npos)
          << (pid == worker.pid() ? "worker" : "broker") << env;
    } else {
      EXPECT_EQ(env.find("glibc.malloc.hugetlb"), std::string::npos) << env;
    }
  }
  // The handler sees GLIBC_TUNABLES as this test had it.
  std::string input = c.dir().File("input.txt");
  std::ofstream(input) << "x\n";
  auto s = c.Submit({"--input", input}, std::chrono::seconds(60));
  ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
  ASSERT_EQ(s.results.size(), 1u);
  const char* mine = std::getenv("GLIBC_TUNABLES");
  EXPECT_EQ(s.results[0].value("result", ""), std::string(mine ? mine : "unset") + "\n");
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

// The launchers on real child processes: start, reap, and the grace ->
// SIGTERM -> SIGKILL escalation. Waits are bounded conditions.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "autoscaler/command_launcher.h"
#include "autoscaler/process_launcher.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace fleet::autoscaler {
namespace {

using fleet::testing::TempDir;
using fleet::testing::WaitFor;
using std::chrono::milliseconds;

// A stand-in worker: writes its arguments to FILE, then runs until killed
// (ignoring SIGTERM when told to).
std::string FakeWorker(const TempDir& dir, bool ignore_term) {
  std::string path = dir.File(ignore_term ? "stubborn.sh" : "worker.sh");
  std::ofstream(path) << "#!/bin/sh\n"
                      << "echo \"$@\" > " << dir.File("args") << "\n"
                      << (ignore_term ? "trap '' TERM\n" : "")
                      << "while :; do sleep 0.05; done\n";
  chmod(path.c_str(), 0755);
  return path;
}

std::vector<Exited> PollUntilExit(Launcher& l, milliseconds bound) {
  std::vector<Exited> out;
  WaitFor([&] {
    out = l.Poll(std::chrono::steady_clock::now());
    return !out.empty();
  }, bound);
  return out;
}

TEST(ProcessLauncherTest, StartsWorkerWithIdThenArgsAndStopsAfterGraceWithSigterm) {
  TempDir dir;
  ProcessLauncher l(FakeWorker(dir, false), "--broker 'tcp://x:1' --handler sleep");
  std::string error;
  ASSERT_TRUE(l.Start("w-1", std::chrono::steady_clock::now(), &error)) << error;
  ASSERT_TRUE(WaitFor([&] { return !fleet::testing::ReadFile(dir.File("args")).empty(); }));
  EXPECT_EQ(fleet::testing::ReadFile(dir.File("args")), "--id w-1 --broker tcp://x:1 --handler sleep\n");
  EXPECT_EQ(l.Alive(), std::vector<std::string>{"w-1"});
  l.Stop("w-1", milliseconds(50), std::chrono::steady_clock::now());
  auto exited = PollUntilExit(l, milliseconds(10000));
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].id, "w-1");
  EXPECT_EQ(exited[0].status, 128 + SIGTERM);
  EXPECT_TRUE(l.Alive().empty());
}

TEST(ProcessLauncherTest, WorkerIgnoringSigtermIsKilledAfterASecondGrace) {
  TempDir dir;
  ProcessLauncher l(FakeWorker(dir, true), "");
  std::string error;
  ASSERT_TRUE(l.Start("w-2", std::chrono::steady_clock::now(), &error)) << error;
  ASSERT_TRUE(WaitFor([&] { return !fleet::testing::ReadFile(dir.File("args")).empty(); }));
  l.Stop("w-2", milliseconds(50), std::chrono::steady_clock::now());
  auto exited = PollUntilExit(l, milliseconds(10000));
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].status, 128 + SIGKILL);
}

TEST(ProcessLauncherTest, CancelledStopLeavesTheWorkerRunningAndStopAllEndsIt) {
  TempDir dir;
  ProcessLauncher l(FakeWorker(dir, false), "");
  std::string error;
  ASSERT_TRUE(l.Start("w-3", std::chrono::steady_clock::now(), &error)) << error;
  auto now = std::chrono::steady_clock::now();
  l.Stop("w-3", milliseconds(0), now - milliseconds(10));
  l.CancelStop("w-3");
  EXPECT_TRUE(l.Poll(now + std::chrono::seconds(5)).empty());
  EXPECT_EQ(l.Alive().size(), 1u);
  l.StopAll(milliseconds(2000));
  EXPECT_TRUE(l.Alive().empty());
}

TEST(CommandLauncherTest, ExpandsIdQuotedForTheShell) {
  EXPECT_EQ(CommandLauncher::Expand("run {id} --name={id}", "a b"),
            "run 'a b' --name='a b'");
  EXPECT_EQ(CommandLauncher::Expand("x", "it's"), "x");
  EXPECT_EQ(CommandLauncher::Expand("{id}", "it's"), "'it'\\''s'");
}

TEST(CommandLauncherTest, FailingStartCommandIsReportedAsExit) {
  CommandLauncher l("exit 3", "");
  std::string error;
  ASSERT_TRUE(l.Start("w-4", std::chrono::steady_clock::now(), &error)) << error;
  auto exited = PollUntilExit(l, milliseconds(10000));
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0].status, 3);
}

TEST(CommandLauncherTest, DetachedStartIsStoppedWithTheStopCommand) {
  TempDir dir;
  std::string marker = dir.File("stopped");
  CommandLauncher l("true", "echo {id} > " + marker);
  std::string error;
  ASSERT_TRUE(l.Start("w-5", std::chrono::steady_clock::now(), &error)) << error;
  // The start command exits 0: the worker now runs elsewhere.
  EXPECT_FALSE(WaitFor([&] { return !l.Poll(std::chrono::steady_clock::now()).empty(); },
                       milliseconds(300)));
  l.Stop("w-5", milliseconds(0), std::chrono::steady_clock::now());
  auto exited = PollUntilExit(l, milliseconds(10000));
  ASSERT_EQ(exited.size(), 1u);
  ASSERT_TRUE(WaitFor([&] {
    l.Poll(std::chrono::steady_clock::now());
    return fleet::testing::ReadFile(marker) == "w-5\n";
  }));
}

TEST(ChildEnvironmentTest, DropsEveryFleetVariableAndKeepsTheRestInOrder) {
  const char* env[] = {"PATH=/usr/bin", "FLEET_METRICS=127.0.0.1:9751", "HOME=/root",
                       "FLEET_CURVE_KEY=/k", "FLEETX=kept", "LANG=C.UTF-8", "FLEET_=x",
                       nullptr};
  EXPECT_EQ(ChildEnvironment(env),
            (std::vector<std::string>{"PATH=/usr/bin", "HOME=/root", "FLEETX=kept",
                                      "LANG=C.UTF-8"}));
  EXPECT_TRUE(ChildEnvironment(nullptr).empty());
}

// Sets FLEET_* variables in this (the autoscaler's) process for one test.
class FleetVariables {
 public:
  FleetVariables() {
    setenv("FLEET_METRICS", "127.0.0.1:48770", 1);
    setenv("FLEET_LOG_LEVEL", "debug", 1);
    setenv("FLEET_CURVE_KEY", "/keys/control.key", 1);
    setenv("NOT_FLEET_VALUE", "-DFLEET_WERROR=ON", 1);
  }
  ~FleetVariables() {
    unsetenv("FLEET_METRICS");
    unsetenv("FLEET_LOG_LEVEL");
    unsetenv("FLEET_CURVE_KEY");
    unsetenv("NOT_FLEET_VALUE");
  }
};

// The names of the variables in `env`'s output (one NAME=value a line).
// Only names count: a value may well mention FLEET_ (CI sets
// CMAKE_FLAGS=-DFLEET_WERROR=ON, say) and is passed on untouched.
std::vector<std::string> FleetNames(const std::string& env_dump) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start < env_dump.size()) {
    size_t end = env_dump.find('\n', start);
    if (end == std::string::npos) end = env_dump.size();
    std::string line = env_dump.substr(start, end - start);
    if (line.rfind("FLEET_", 0) == 0) names.push_back(line.substr(0, line.find('=')));
    start = end + 1;
  }
  return names;
}

// The environment a started process saw, as `env` printed it.
void ExpectNoFleetVariables(const std::string& env_dump) {
  EXPECT_NE(env_dump.find("PATH="), std::string::npos) << env_dump;
  EXPECT_EQ(FleetNames(env_dump), std::vector<std::string>{}) << env_dump;
  // A variable that is not fleet's own is passed on, whatever its value says.
  EXPECT_NE(("\n" + env_dump).find("\nNOT_FLEET_VALUE=-DFLEET_WERROR=ON\n"), std::string::npos)
      << env_dump;
}

TEST(ProcessLauncherTest, WorkerGetsNoneOfTheAutoscalersFleetVariables) {
  FleetVariables vars;
  TempDir dir;
  std::string path = dir.File("env-worker.sh");
  std::ofstream(path) << "#!/bin/sh\nenv > " << dir.File("env.tmp") << "\nmv "
                      << dir.File("env.tmp") << " " << dir.File("env") << "\nexec sleep 60\n";
  chmod(path.c_str(), 0755);
  ProcessLauncher l(path, "");
  std::string error;
  ASSERT_TRUE(l.Start("w-env", std::chrono::steady_clock::now(), &error)) << error;
  ASSERT_TRUE(WaitFor([&] { return !fleet::testing::ReadFile(dir.File("env")).empty(); }));
  ExpectNoFleetVariables(fleet::testing::ReadFile(dir.File("env")));
  l.StopAll(milliseconds(2000));
}

TEST(CommandLauncherTest, StartAndStopCommandsGetNoneOfTheAutoscalersFleetVariables) {
  FleetVariables vars;
  TempDir dir;
  CommandLauncher l("env > " + dir.File("start.tmp") + " && mv " + dir.File("start.tmp") + " " +
                        dir.File("start"),
                    "env > " + dir.File("stop.tmp") + " && mv " + dir.File("stop.tmp") + " " +
                        dir.File("stop"));
  std::string error;
  ASSERT_TRUE(l.Start("w-env", std::chrono::steady_clock::now(), &error)) << error;
  ASSERT_TRUE(WaitFor([&] { return !fleet::testing::ReadFile(dir.File("start")).empty(); }));
  ExpectNoFleetVariables(fleet::testing::ReadFile(dir.File("start")));
  l.Stop("w-env", milliseconds(0), std::chrono::steady_clock::now());
  ASSERT_TRUE(WaitFor([&] {
    l.Poll(std::chrono::steady_clock::now());
    return !fleet::testing::ReadFile(dir.File("stop")).empty();
  }));
  ExpectNoFleetVariables(fleet::testing::ReadFile(dir.File("stop")));
}

}  // namespace
}  // namespace fleet::autoscaler

#include "common/flags.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace fleet {
namespace {

TEST(FlagsTest, ReadsEveryLongFlagFromFleetEnvironmentVariable) {
  CLI::App app("t");
  int max_queue = 1;
  std::string frontend = "default";
  app.add_option("--max-queue", max_queue);
  app.add_option("--frontend", frontend);
  setenv("FLEET_MAX_QUEUE", "42", 1);
  setenv("FLEET_FRONTEND", "tcp://*:1", 1);
  char arg0[] = "t";
  char* argv[] = {arg0};
  EXPECT_EQ(ParseFlags(app, 1, argv), -1);
  EXPECT_EQ(max_queue, 42);
  EXPECT_EQ(frontend, "tcp://*:1");
  unsetenv("FLEET_MAX_QUEUE");
  unsetenv("FLEET_FRONTEND");
}

TEST(FlagsTest, FlagWinsOverEnvironment) {
  CLI::App app("t");
  int max_queue = 1;
  app.add_option("--max-queue", max_queue);
  setenv("FLEET_MAX_QUEUE", "42", 1);
  char arg0[] = "t";
  char arg1[] = "--max-queue=7";
  char* argv[] = {arg0, arg1};
  EXPECT_EQ(ParseFlags(app, 2, argv), -1);
  EXPECT_EQ(max_queue, 7);
  unsetenv("FLEET_MAX_QUEUE");
}

TEST(FlagsTest, BadFlagReturnsNonZeroExitCode) {
  CLI::App app("t");
  int n = 0;
  app.add_option("--n", n);
  char arg0[] = "t";
  char arg1[] = "--nope";
  char* argv[] = {arg0, arg1};
  EXPECT_GT(ParseFlags(app, 2, argv), 0);
}

}  // namespace
}  // namespace fleet

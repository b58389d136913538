#include "worker/exec_handler.h"

#include <gtest/gtest.h>

#include <string>

namespace fleet::worker {
namespace {

constexpr Timeout kExecNoTimeout{0};

ExecHandler MakeExec(const std::string& command) {
  ExecHandler::Options o;
  o.command = command;
  return ExecHandler(o);
}

TEST(ExecHandlerTest, ReturnsStdoutOfCommandFedThePayload) {
  ExecHandler h = MakeExec("tr a-z A-Z");
  HandlerOutput out = h.Run("hello fleet", kExecNoTimeout);
  EXPECT_TRUE(out.ok) << out.error;
  EXPECT_EQ(out.result, "HELLO FLEET");
}

TEST(ExecHandlerTest, EmptyPayloadGivesEmptyStdin) {
  ExecHandler h = MakeExec("wc -c");
  HandlerOutput out = h.Run("", kExecNoTimeout);
  EXPECT_TRUE(out.ok) << out.error;
  EXPECT_EQ(out.result.find_first_not_of(" "), out.result.find('0'));
}

TEST(ExecHandlerTest, NonZeroExitFailsWithStatusAndStderrTail) {
  ExecHandler h = MakeExec("cat >/dev/null; echo 'something broke' >&2; exit 3");
  HandlerOutput out = h.Run("x", kExecNoTimeout);
  EXPECT_FALSE(out.ok);
  EXPECT_NE(out.error.find("exit status 3"), std::string::npos) << out.error;
  EXPECT_NE(out.error.find("something broke"), std::string::npos) << out.error;
}

TEST(ExecHandlerTest, KeepsOnlyTheTailOfLongStderr) {
  ExecHandler h = MakeExec("i=0; while [ $i -lt 2000 ]; do echo line$i >&2; i=$((i+1)); done; "
                       "echo LAST >&2; exit 1");
  HandlerOutput out = h.Run("", kExecNoTimeout);
  EXPECT_FALSE(out.ok);
  EXPECT_NE(out.error.find("LAST"), std::string::npos);
  EXPECT_EQ(out.error.find("line0\n"), std::string::npos);
  EXPECT_LT(out.error.size(), 2048u + 100u);
}

TEST(ExecHandlerTest, DeathBySignalFails) {
  ExecHandler h = MakeExec("kill -9 $$");
  HandlerOutput out = h.Run("", kExecNoTimeout);
  EXPECT_FALSE(out.ok);
  EXPECT_NE(out.error.find("signal 9"), std::string::npos) << out.error;
}

TEST(ExecHandlerTest, HangingCommandIsKilledAtTimeout) {
  ExecHandler h = MakeExec("sleep 30");
  HandlerOutput out = h.Run("", Timeout(0.5));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.error, "timed out after 0.5s");
}

TEST(ExecHandlerTest, TimeoutKillsTheWholeProcessGroup) {
  // The shell's child keeps stdout open; only killing the group ends it.
  ExecHandler h = MakeExec("sleep 30 & wait");
  HandlerOutput out = h.Run("", Timeout(0.3));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.error, "timed out after 0.3s");
}

TEST(ExecHandlerTest, BigPayloadRoundTripsThroughCat) {
  std::string payload(2u << 20, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<char>('a' + i % 26);
  }
  ExecHandler h = MakeExec("cat");
  HandlerOutput out = h.Run(payload, kExecNoTimeout);
  EXPECT_TRUE(out.ok) << out.error;
  EXPECT_EQ(out.result.size(), payload.size());
  EXPECT_TRUE(out.result == payload);
}

TEST(ExecHandlerTest, StdoutOverTheLimitFails) {
  ExecHandler::Options o;
  o.command = "head -c 5000 /dev/zero";
  o.max_output_bytes = 1000;
  ExecHandler h(o);
  HandlerOutput out = h.Run("", kExecNoTimeout);
  EXPECT_FALSE(out.ok);
  EXPECT_NE(out.error.find("exceeded"), std::string::npos) << out.error;
}

TEST(ExecHandlerTest, CommandThatIgnoresStdinStillSucceeds) {
  ExecHandler h = MakeExec("echo done");
  HandlerOutput out = h.Run(std::string(1u << 20, 'x'), kExecNoTimeout);
  EXPECT_TRUE(out.ok) << out.error;
  EXPECT_EQ(out.result, "done\n");
}

}  // namespace
}  // namespace fleet::worker

#include "worker/handler.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace fleet::worker {
namespace {

constexpr Timeout kHandlerNoTimeout{0};

TEST(EchoHandlerTest, ReturnsThePayload) {
  EchoHandler h;
  HandlerOutput out = h.Run(std::string("hello\0world", 11), kHandlerNoTimeout);
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.result, std::string("hello\0world", 11));
  EXPECT_EQ(out.error, "");
}

TEST(Sha256HandlerTest, ReturnsLowercaseHexDigest) {
  Sha256Handler h;
  HandlerOutput out = h.Run("abc", kHandlerNoTimeout);
  EXPECT_TRUE(out.ok);
  EXPECT_EQ(out.result, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256HandlerTest, DigestsEmptyPayload) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(SleepHandlerTest, SleepsAndReturnsEmpty) {
  SleepHandler h;
  HandlerOutput out = h.Run("1", kHandlerNoTimeout);
  EXPECT_TRUE(out.ok) << out.error;
  EXPECT_EQ(out.result, "");
}

TEST(SleepHandlerTest, AcceptsSurroundingWhitespace) {
  SleepHandler h;
  EXPECT_TRUE(h.Run(" 0\n", kHandlerNoTimeout).ok);
}

TEST(SleepHandlerTest, FailsOnBadPayload) {
  SleepHandler h;
  for (const char* bad : {"", "abc", "-5", "1.5", "12ms", "99999999999999999999999"}) {
    HandlerOutput out = h.Run(bad, kHandlerNoTimeout);
    EXPECT_FALSE(out.ok) << "payload '" << bad << "'";
    EXPECT_NE(out.error.find("milliseconds"), std::string::npos) << out.error;
  }
}

TEST(SleepHandlerTest, SleepLongerThanTimeoutIsCutShortAndFails) {
  SleepHandler h;
  HandlerOutput out = h.Run("60000", Timeout(0.05));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.error, "timed out after 0.05s");
}

HandlerOptions Named(const std::string& name, const std::string& exec = "") {
  HandlerOptions o;
  o.name = name;
  o.exec = exec;
  return o;
}

TEST(MakeHandlerTest, BuildsEachHandlerByName) {
  for (const char* name : {"echo", "sleep", "sha256"}) {
    EXPECT_EQ(MakeHandler(Named(name))->name(), name);
  }
  EXPECT_EQ(MakeHandler(Named("exec", "cat"))->name(), "exec");
  EXPECT_EQ(MakeHandler(Named("process", "cat"))->name(), "process");
}

TEST(MakeHandlerTest, RejectsUnknownNameAndExecOrProcessWithoutCommand) {
  EXPECT_THROW(MakeHandler(Named("nope")), std::invalid_argument);
  EXPECT_THROW(MakeHandler(Named("exec")), std::invalid_argument);
  EXPECT_THROW(MakeHandler(Named("process")), std::invalid_argument);
}

}  // namespace
}  // namespace fleet::worker

// The fault tests' ledger: fleet-submit's line formats and the checker's
// verdicts on hand-written ledgers, one fault of each kind.
#include "tests/support/ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "client/submit_output.h"
#include "tests/support/cluster.h"

namespace fleet::testing {
namespace {

using client::LedgerResultLine;
using client::LedgerSubmitLine;
using client::ResultView;

ResultView Ok(std::string_view id, std::string_view result) {
  ResultView r;
  r.id = id;
  r.attempts = 1;
  r.result = result;
  return r;
}

class LedgerTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::vector<std::string>& lines) {
    std::string path = dir_.File(name);
    std::ofstream out(path);
    for (const auto& l : lines) out << l << "\n";
    return path;
  }
  TempDir dir_;
};

TEST_F(LedgerTest, LinesCarryIdOutcomeAttemptsAndHashes) {
  EXPECT_EQ(LedgerSubmitLine("a-1", "x"), "submit a-1 af63f54c86021707 1");
  ResultView failed;
  failed.id = "a-2";
  failed.outcome = proto::Outcome::kFailed;
  failed.attempts = 3;
  EXPECT_EQ(LedgerResultLine(failed), "result a-2 failed 3 cbf29ce484222325");
  EXPECT_EQ(LedgerResultLine(Ok("a-1", "x")), "result a-1 ok 1 af63f54c86021707");
}

TEST_F(LedgerTest, CleanRunPasses) {
  auto ledger = Write("l", {LedgerSubmitLine("a-1", "p1"), LedgerSubmitLine("a-2", "p2"),
                            LedgerResultLine(Ok("a-2", "p2")), LedgerResultLine(Ok("a-1", "p1"))});
  auto execs = Write("e", {"a-1", "a-2", "a-2"});
  LedgerReport r = CheckLedger({ledger}, {execs});
  EXPECT_TRUE(r.passed) << r.Describe();
  EXPECT_EQ(r.submitted, 2u);
  EXPECT_EQ(r.ok, 2u);
  EXPECT_EQ(r.executions, 3u);
  EXPECT_EQ(r.reexecuted, 1u);
  EXPECT_EQ(r.max_executions, 2u);
  EXPECT_EQ(r.by_executions.at(1), 1u);
  EXPECT_EQ(r.by_executions.at(2), 1u);
}

TEST_F(LedgerTest, EachKindOfFaultIsCountedAndFails) {
  auto ledger = Write("l", {
      LedgerSubmitLine("lost", "p"), LedgerSubmitLine("dup", "p"),
      LedgerSubmitLine("wrong", "p"), LedgerSubmitLine("many", "p"),
      LedgerResultLine(Ok("dup", "p")), LedgerResultLine(Ok("dup", "p")),
      LedgerResultLine(Ok("wrong", "not-p")), LedgerResultLine(Ok("stranger", "p")),
      LedgerResultLine(Ok("many", "p"))});
  auto execs = Write("e", {"dup", "wrong", "many", "many", "many", "many", "ghost"});
  LedgerReport r = CheckLedger({ledger}, {execs});
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.lost, 1u);
  EXPECT_EQ(r.duplicated, 1u);
  // The wrong value, the result nobody asked for, the execution of "ghost".
  EXPECT_EQ(r.unexpected, 3u) << r.Describe();
  EXPECT_EQ(r.over_executed, 1u);
  EXPECT_EQ(r.max_executions, 4u);
  EXPECT_THAT(r.Describe(), ::testing::HasSubstr("lost (no result): lost"));
  EXPECT_THAT(r.Describe(), ::testing::HasSubstr("FAIL"));
}

TEST_F(LedgerTest, DeadLettersPassOnlyWhenAllowed) {
  ResultView dead;
  dead.id = "d";
  dead.outcome = proto::Outcome::kFailed;
  dead.attempts = 3;
  auto ledger = Write("l", {LedgerSubmitLine("d", "p"), LedgerResultLine(dead)});
  EXPECT_FALSE(CheckLedger({ledger}, {}).passed);
  LedgerOptions allow;
  allow.allow_failed = true;
  LedgerReport r = CheckLedger({ledger}, {}, allow);
  EXPECT_TRUE(r.passed) << r.Describe();
  EXPECT_EQ(r.failed, 1u);
}

TEST_F(LedgerTest, MissingOrMalformedFilesAndEmptyRunsFail) {
  EXPECT_FALSE(CheckLedger({dir_.File("absent")}, {}).passed);
  EXPECT_FALSE(CheckLedger({Write("bad", {"submit"})}, {}).passed);
  EXPECT_FALSE(CheckLedger({Write("empty", {})}, {}).passed);
}

TEST_F(LedgerTest, LoggingEchoCommandLogsTheIdAndEchoes) {
  std::string log = dir_.File("execs");
  RunResult r = fleet::testing::Run({"/bin/sh", "-c", "printf 'id-7 abc' | { " + LoggingEchoCommand(log, 0) + "; }"},
                    std::chrono::seconds(10), dir_.File("sh.log"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(ReadFile(dir_.File("sh.log")), "id-7 abc");
  EXPECT_EQ(ReadFile(log), "id-7\n");
}

}  // namespace
}  // namespace fleet::testing

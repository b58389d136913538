// Runs the real fleet-submit and fleet-ctl binaries against fake brokers.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "client/producer.h"
#include "client/submit_output.h"
#include "tests/client/fake_router.h"
#include "tests/support/process.h"

namespace fleet::client {
namespace {

using fleet::testing::Bin;
using fleet::testing::Process;
using fleet::testing::TempDir;
using std::chrono::seconds;
using testing::Received;
using testing::ThreadedRouter;

// The line of `log` matching `re`, or "".
std::string FindLine(const std::string& log, const std::regex& re) {
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (std::regex_match(line, re)) return line;
  }
  return "";
}

// Acks every SUBMIT and returns each payload as the result.
std::vector<std::string> EchoBroker(const Received& r) {
  std::vector<std::string> out;
  if (r.command != proto::Command::kSubmit) return out;
  proto::Ack ack;
  proto::Result result;
  for (const auto& b : r.batches) {
    ack.accepted.push_back(b.id);
    result.results.push_back({b.id, proto::Outcome::kOk, 1, b.payload, ""});
  }
  out.push_back(proto::Encode(ack));
  out.push_back(proto::Encode(result));
  return out;
}

std::vector<std::string> Silent(const Received&) { return {}; }

TEST(SubmitCliTest, PrintsExactSummaryAndExitsZeroWhenAllResultsArrive) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, EchoBroker);
  TempDir dir;
  Process submit({Bin("fleet-submit"), "--broker", broker.endpoint(),
                  "--count", "300", "--size", "20", "--inflight", "50",
                  "--output", dir.File("out.jsonl")},
                 dir.File("log"));
  ASSERT_EQ(submit.Wait(seconds(60)), 0) << submit.ReadLog();
  std::regex summary(
      R"(submitted=300 ok=300 failed=0 lost=0 seconds=\d+\.\d{3} batches_per_s=\d+\.\d)");
  EXPECT_NE(FindLine(submit.ReadLog(), summary), "") << submit.ReadLog();

  std::istringstream out(fleet::testing::ReadFile(dir.File("out.jsonl")));
  std::string line;
  int lines = 0;
  while (std::getline(out, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["outcome"], "ok");
    EXPECT_EQ(j["attempts"], 1);
    EXPECT_EQ(j["result"].get<std::string>(),
              GeneratePayload(j["id"].get<std::string>(), 20));
    ++lines;
  }
  EXPECT_EQ(lines, 300);
}

TEST(SubmitCliTest, CountsLostBatchesAndExitsOneOnTimeout) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, Silent);
  TempDir dir;
  Process submit({Bin("fleet-submit"), "--broker", broker.endpoint(),
                  "--count", "7", "--timeout-seconds", "1"},
                 dir.File("log"));
  ASSERT_EQ(submit.Wait(seconds(30)), 1) << submit.ReadLog();
  std::regex summary(
      R"(submitted=7 ok=0 failed=0 lost=7 seconds=\d+\.\d{3} batches_per_s=0\.0)");
  EXPECT_NE(FindLine(submit.ReadLog(), summary), "") << submit.ReadLog();
}

TEST(SubmitCliTest, BadFlagExitsTwo) {
  TempDir dir;
  Process submit({Bin("fleet-submit"), "--inflight", "0"}, dir.File("log"));
  EXPECT_EQ(submit.Wait(seconds(30)), 2) << submit.ReadLog();
}

TEST(CtlCliTest, HelpExitsZero) {
  TempDir dir;
  Process ctl({Bin("fleet-ctl"), "--help"}, dir.File("log"));
  ASSERT_EQ(ctl.Wait(seconds(30)), 0) << ctl.ReadLog();
  EXPECT_NE(ctl.ReadLog().find("retire"), std::string::npos);
}

TEST(CtlCliTest, ExitsTwoWithMessageWhenNoBrokerAnswers) {
  zmq::context_t context(1);
  std::string ep = testing::UnusedEndpoint(context);
  TempDir dir;
  Process ctl({Bin("fleet-ctl"), "--control", ep, "--timeout-ms", "300",
               "workers"},
              dir.File("log"));
  ASSERT_EQ(ctl.Wait(seconds(30)), 2) << ctl.ReadLog();
  EXPECT_NE(ctl.ReadLog().find("no answer from " + ep +
                               " within 300 ms: is fleet-broker running?"),
            std::string::npos)
      << ctl.ReadLog();
}

std::vector<std::string> ControlBroker(const Received& r) {
  if (r.op == "workers") {
    proto::WorkersReply reply;
    reply.request_id = r.request_id;
    reply.workers.push_back({"w1", "busy", 4, 2, 0, 17, 1, 1});
    return {proto::Encode(reply)};
  }
  if (r.op == "stats") {
    proto::StatsReply reply;
    reply.request_id = r.request_id;
    reply.queues = {{"default", 5}};
    reply.values = {{"queued", 5}, {"inflight", 2}};
    return {proto::Encode(reply)};
  }
  proto::ControlReply reply{r.request_id, proto::ErrorCode::kOk, ""};
  if (r.op == "retire-if-idle") {
    reply.code = proto::ErrorCode::kBusy;
    reply.message = "worker w1 holds 2 batches";
  }
  return {proto::Encode(reply)};
}

TEST(CtlCliTest, PrintsWorkersTable) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, ControlBroker);
  TempDir dir;
  Process ctl({Bin("fleet-ctl"), "--control", broker.endpoint(), "workers"},
              dir.File("log"));
  ASSERT_EQ(ctl.Wait(seconds(30)), 0) << ctl.ReadLog();
  std::string log = ctl.ReadLog();
  std::regex header(R"(ID\s+STATE\s+HELD\s+SLOTS\s+PREFETCH\s+IDLE_S\s+PROCESSED\s+FAILED)");
  EXPECT_NE(FindLine(log, header), "") << log;
  // 4 batches held at most: 1 slot and 3 prefetched.
  EXPECT_NE(FindLine(log, std::regex(R"(w1\s+busy\s+2\s+1\s+3\s+0\.0\s+17\s+1)")), "") << log;
}

TEST(CtlCliTest, StatsAsJson) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, ControlBroker);
  TempDir dir;
  Process ctl({Bin("fleet-ctl"), "--control", broker.endpoint(), "--json",
               "stats"},
              dir.File("log"));
  ASSERT_EQ(ctl.Wait(seconds(30)), 0) << ctl.ReadLog();
  auto j = nlohmann::json::parse(ctl.ReadLog());
  EXPECT_EQ(j["queues"]["default"], 5);
  EXPECT_EQ(j["values"]["inflight"], 2);
}

// Regression: `fleet-ctl workers --json` exited 2; the program's flags
// are taken before or after the subcommand.
TEST(CtlCliTest, ProgramFlagsWorkAfterTheSubcommandToo) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, ControlBroker);
  TempDir dir;
  const std::vector<std::vector<std::string>> forms = {
      {"--control", broker.endpoint(), "--json", "workers"},
      {"--control", broker.endpoint(), "workers", "--json"},
      {"workers", "--json", "--control", broker.endpoint(), "--timeout-ms", "5000"},
      {"--json", "workers", "--control", broker.endpoint()}};
  int n = 0;
  for (const auto& form : forms) {
    std::vector<std::string> argv{Bin("fleet-ctl")};
    argv.insert(argv.end(), form.begin(), form.end());
    Process ctl(argv, dir.File("log" + std::to_string(++n)));
    ASSERT_EQ(ctl.Wait(seconds(30)), 0) << ctl.ReadLog();
    auto j = nlohmann::json::parse(ctl.ReadLog());
    ASSERT_EQ(j["workers"].size(), 1u) << ctl.ReadLog();
    EXPECT_EQ(j["workers"][0]["id"], "w1");
  }
  Process retire({Bin("fleet-ctl"), "retire", "w1", "--if-idle", "--json", "--control",
                  broker.endpoint()},
                 dir.File("retire"));
  ASSERT_EQ(retire.Wait(seconds(30)), 1) << retire.ReadLog();
  EXPECT_NE(retire.ReadLog().find("\"code\":\"busy\""), std::string::npos) << retire.ReadLog();
}

TEST(CtlCliTest, RefusedRetireExitsOne) {
  zmq::context_t context(1);
  ThreadedRouter broker(context, ControlBroker);
  TempDir dir;
  Process ctl({Bin("fleet-ctl"), "--control", broker.endpoint(), "retire",
               "w1", "--if-idle"},
              dir.File("log"));
  ASSERT_EQ(ctl.Wait(seconds(30)), 1) << ctl.ReadLog();
  EXPECT_NE(ctl.ReadLog().find("refused: busy: worker w1 holds 2 batches"),
            std::string::npos)
      << ctl.ReadLog();
}

TEST(SubmitOutputTest, GeneratedPayloadIsPrintableSizedAndDeterministic) {
  EXPECT_EQ(GeneratePayload("ab-1", 10), "ab-1 abcde");
  EXPECT_EQ(GeneratePayload("ab-1", 2), "ab");
  EXPECT_EQ(GeneratePayload("ab-1", 0), "");
  EXPECT_EQ(GeneratePayload("x", 100), GeneratePayload("x", 100));
}

TEST(SubmitOutputTest, NonUtf8ResultIsBase64) {
  ResultView r{"id", proto::Outcome::kOk, 1, std::string_view("\xff\x00", 2), ""};
  EXPECT_EQ(ResultJsonLine(r),
            R"({"id":"id","outcome":"ok","attempts":1,"result_base64":"/wA=","error":""})");
  r.result = "hi";
  EXPECT_EQ(ResultJsonLine(r),
            R"({"id":"id","outcome":"ok","attempts":1,"result":"hi","error":""})");
}

TEST(SubmitOutputTest, SummaryLineFormat) {
  SubmitSummary s{10, 7, 2, 1.5};
  EXPECT_EQ(SummaryLine(s),
            "submitted=10 ok=7 failed=2 lost=1 seconds=1.500 batches_per_s=6.0");
}

}  // namespace
}  // namespace fleet::client

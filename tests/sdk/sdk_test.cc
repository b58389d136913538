// The C++ SDK (include/fleet/client.h, include/fleet/worker.h) in this
// process against a real fleet-broker on 127.0.0.1: futures and callbacks,
// a function's results and errors, and a worker's ways to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fleet/client.h"
#include "fleet/worker.h"
#include "tests/support/cluster.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class SdkTest : public ::testing::Test {
 protected:
  void SetUp() override { c_.StartBroker({"--heartbeat-ms", "250"}); }

  ClientOptions Options() {
    ClientOptions o;
    o.endpoint = c_.frontend();
    return o;
  }

  WorkerOptions WorkerOpts(const std::string& id) {
    WorkerOptions o;
    o.broker = c_.backend();
    o.id = id;
    o.concurrency = 2;
    o.heartbeat = milliseconds(250);
    o.handle_signals = false;
    return o;
  }

  bool Registered(const std::string& id) {
    for (const auto& w : c_.Workers()) {
      if (w.value("id", "") == id) return true;
    }
    return false;
  }

  Cluster c_;
};

TEST_F(SdkTest, ClientGetsEveryResultThroughFuturesAndCallbacks) {
  c_.StartWorker("echo-1");
  Client client(Options());
  std::vector<std::future<Result>> futures;
  for (int i = 0; i < 200; ++i) futures.push_back(client.Submit("p-" + std::to_string(i)));
  std::mutex mu;
  std::set<std::string> by_callback;
  for (int i = 0; i < 100; ++i) {
    client.Submit("cb-" + std::to_string(i), [&](const Result& r) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(r.ok) << r.error;
      by_callback.insert(r.result);
    });
  }
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(futures[i].wait_for(seconds(60)), std::future_status::ready);
    Result r = futures[i].get();
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.result, "p-" + std::to_string(i));
    EXPECT_EQ(r.attempts, 1u);
    ids.insert(r.id);
  }
  EXPECT_EQ(ids.size(), 200u);  // made-up ids are unique
  ASSERT_TRUE(client.WaitAll(milliseconds(60000)));
  EXPECT_EQ(client.outstanding(), 0u);
  // Counted at the end of the I/O thread's turn.
  EXPECT_TRUE(WaitFor([&] { return client.counters().results == 300; }));
  EXPECT_EQ(client.counters().accepted, 300u);
  EXPECT_EQ(client.counters().rejected, 0u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(by_callback.size(), 100u);
}

TEST_F(SdkTest, AnIdWaitingForItsResultIsRefusedAndAClosedClientFailsWhatWaits) {
  // No worker: the batches wait at the broker.
  auto client = std::make_unique<Client>(Options());
  std::future<Result> first = client->SubmitWithId("same", "a");
  std::future<Result> second = client->SubmitWithId("same", "b");
  ASSERT_EQ(second.wait_for(seconds(20)), std::future_status::ready);
  Result refused = second.get();
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.attempts, 0u);
  EXPECT_NE(refused.error.find("already waiting"), std::string::npos) << refused.error;
  EXPECT_FALSE(client->WaitAll(milliseconds(200)));
  EXPECT_EQ(client->outstanding(), 1u);
  client.reset();
  ASSERT_EQ(first.wait_for(seconds(1)), std::future_status::ready);
  EXPECT_THROW(first.get(), std::runtime_error);
}

TEST_F(SdkTest, AWorkerRunsTheFunctionAndReportsItsErrorsAndExceptions) {
  std::atomic<int> calls{0};
  Worker worker(WorkerOpts("fn-1"), [&](const Batch& b) {
    ++calls;
    const std::string p(b.payload);
    if (p == "bad") return Reply::Error("bad input: " + p);
    if (p == "throw") throw std::runtime_error("boom");
    return Reply::Ok(p + "@" + std::string(b.queue) + "#" + std::to_string(b.attempt));
  });
  std::promise<int> code;
  std::thread run([&] { code.set_value(worker.Run()); });
  Client client(Options());
  auto ok = client.Submit("x");
  auto bad = client.Submit("bad");
  auto thrown = client.Submit("throw");
  ASSERT_EQ(ok.wait_for(seconds(60)), std::future_status::ready);
  Result r = ok.get();
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.result, "x@default#1");
  r = bad.get();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "bad input: bad");
  EXPECT_EQ(r.attempts, 1u);
  r = thrown.get();
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("boom"), std::string::npos) << r.error;
  EXPECT_EQ(calls.load(), 3);
  worker.Stop();
  auto f = code.get_future();
  ASSERT_EQ(f.wait_for(seconds(30)), std::future_status::ready);
  EXPECT_EQ(f.get(), 0);
  run.join();
}

TEST_F(SdkTest, StopLetsTheRunningBatchFinishFirst) {
  std::promise<void> started;
  std::atomic<bool> finished{false};
  Worker worker(WorkerOpts("fn-2"), [&](const Batch&) {
    started.set_value();
    std::this_thread::sleep_for(milliseconds(300));
    finished = true;
    return Reply::Ok("done");
  });
  std::thread run([&] { EXPECT_EQ(worker.Run(), 0); });
  Client client(Options());
  auto f = client.Submit("slow");
  started.get_future().wait();
  worker.Stop();
  run.join();  // Run returned: the batch ran to its end and its result went back
  EXPECT_TRUE(finished.load());
  ASSERT_EQ(f.wait_for(seconds(30)), std::future_status::ready);
  Result r = f.get();
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.result, "done");
}

TEST_F(SdkTest, ARetiredWorkerReturnsFromRun) {
  Worker worker(WorkerOpts("fn-3"), [](const Batch& b) { return Reply::Ok(std::string(b.payload)); });
  std::promise<int> code;
  std::thread run([&] { code.set_value(worker.Run()); });
  ASSERT_TRUE(WaitFor([&] { return Registered("fn-3"); }));
  RunResult r = c_.Ctl({"retire", "fn-3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto f = code.get_future();
  ASSERT_EQ(f.wait_for(seconds(30)), std::future_status::ready);
  EXPECT_EQ(f.get(), 0);
  run.join();
}

TEST_F(SdkTest, BadOptionsAreRefusedWithTheirName) {
  WorkerOptions o = WorkerOpts("x");
  o.concurrency = 0;
  try {
    Worker w(o, [](const Batch&) { return Reply::Ok(""); });
    FAIL() << "accepted concurrency 0";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("concurrency"), std::string::npos) << e.what();
  }
  o = WorkerOpts("x");
  o.curve_key = "/nonexistent.key";
  EXPECT_THROW(Worker(o, [](const Batch&) { return Reply::Ok(""); }), std::invalid_argument);
  ClientOptions co = Options();
  co.endpoint = "not an endpoint";
  EXPECT_THROW(Client{co}, std::invalid_argument);
  o = WorkerOpts("x");
  o.handler = "process";
  EXPECT_THROW(Worker{o}, std::invalid_argument);
}

}  // namespace
}  // namespace fleet::testing

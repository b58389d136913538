// Objects through the process handler (docs/handler-protocol.md,
// "Objects"): a handler's `get` frames become requests the worker relays,
// their answers reach the handler that asked, and the bad, the excessive
// and the orphaned ones are answered or dropped as the spec says. The
// test plays the worker's loop and the broker: it answers each request
// from objects it holds.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"
#include "tests/worker/drive_loop.h"
#include "worker/process_handler.h"

namespace fleet::worker {
namespace {

using fleet::testing::Bin;
using fleet::testing::WaitFor;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kOk = static_cast<std::uint32_t>(proto::ObjectStatus::kOk);
constexpr auto kUnavailable = static_cast<std::uint32_t>(proto::ObjectStatus::kUnavailable);

std::unique_ptr<ProcessHandler> MakeObjectsHandler(int slots, bool objects = true) {
  ProcessHandler::Options o;
  o.command = Bin("fleet-test-handler");
  o.slots = slots;
  o.worker_id = "w-objects";
  o.grace = Timeout(2);
  o.backoff_initial = milliseconds(20);
  o.backoff_max = milliseconds(200);
  o.objects = objects;
  return std::make_unique<ProcessHandler>(o);
}

// The loop and the broker: runs `tasks`, answering every get from
// `objects` (by digest) unless `hold` is set, in which case the gets are
// kept in `held` unanswered. `gets` records every request relayed.
struct ObjectsLoop {
  explicit ObjectsLoop(ProcessHandler& handler) : h(handler) {}
  ProcessHandler& h;
  std::map<std::string, std::string> objects;
  bool hold = false;
  std::vector<ProcessHandler::ObjectGetOut> gets;
  std::vector<ProcessHandler::ObjectGetOut> held;

  std::map<std::string, Completion> Run(std::vector<Task> tasks, std::size_t want) {
    ProcessHandler::Limits limits;
    limits.max_result_bytes = 64u << 20;  // the large object comes back whole
    return DriveLoop(h, std::move(tasks), want, limits, seconds(30), [this] { Serve(); });
  }

  // The gets the handler made since the last turn, answered or held.
  void Serve() {
    h.TakeObjectGets(&taken_);
    for (const auto& g : taken_) {
      gets.push_back(g);
      if (hold) {
        held.push_back(g);
        continue;
      }
      const auto it = objects.find(g.digest);
      if (it == objects.end()) {
        h.DeliverObject(g.tag, static_cast<std::uint32_t>(proto::ObjectStatus::kUnknownObject), 0,
                        g.offset, {}, "no such object");
        continue;
      }
      const std::string& o = it->second;
      const std::string chunk = o.substr(std::min<std::size_t>(g.offset, o.size()), g.length);
      h.DeliverObject(g.tag, kOk, o.size(), g.offset, chunk, {});
    }
  }

 private:
  std::vector<ProcessHandler::ObjectGetOut> taken_;
};

Task MakeObjectTask(const std::string& id, const std::string& payload) {
  return Task{id, "default", 1, payload};
}

TEST(ProcessHandlerObjectsTest, TheFeatureIsInTheEnvironmentOnlyWhenObjectsAreOn) {
  for (const bool on : {true, false}) {
    auto h = MakeObjectsHandler(1, on);
    ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
    ObjectsLoop loop{*h};
    auto got = loop.Run({MakeObjectTask("f", "features")}, 1);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_TRUE(got.at("f").ok()) << got.at("f").error();
    EXPECT_EQ(got.at("f").result(), on ? "objects" : "-");
  }
}

TEST(ProcessHandlerObjectsTest, AHandlerReadsAnObjectInChunksOnBehalfOfItsBatch) {
  auto h = MakeObjectsHandler(2);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 2; }, seconds(20)));
  std::string object;
  for (int i = 0; i < 100000; ++i) object.push_back(static_cast<char>('a' + i % 26));
  ObjectsLoop loop{*h};
  loop.objects["\xab\xcd"] = object;
  auto got = loop.Run({MakeObjectTask("b-1", "fetch:abcd:30000"), MakeObjectTask("b-2", "fetch:abcd:1000000")},
                      2);
  ASSERT_EQ(got.size(), 2u);
  for (const char* id : {"b-1", "b-2"}) {
    ASSERT_TRUE(got.at(id).ok()) << got.at(id).error();
    EXPECT_EQ(got.at(id).result(), object);
  }
  // 4 chunks for one, 1 for the other, each on behalf of its own batch.
  ASSERT_EQ(loop.gets.size(), 5u);
  std::map<std::string, int> per_batch;
  for (const auto& g : loop.gets) {
    ++per_batch[g.batch_id];
    EXPECT_EQ(g.digest, "\xab\xcd");
    EXPECT_LE(g.length, 1000000u);
  }
  EXPECT_EQ(per_batch["b-1"], 4);
  EXPECT_EQ(per_batch["b-2"], 1);
  EXPECT_EQ(h->object_gets_out(), 0u);
  EXPECT_EQ(h->starts(), 2);  // nothing broke
}

TEST(ProcessHandlerObjectsTest, AChunkLargerThanTheLimitIsShortenedAndAskedAgain) {
  auto h = MakeObjectsHandler(1);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
  ObjectsLoop loop{*h};
  loop.objects["\x01"] = std::string(ProcessHandler::kMaxObjectChunk + 10, 'z');
  auto got = loop.Run({MakeObjectTask("big", "fetch:01:100000000")}, 1);
  ASSERT_TRUE(got.at("big").ok()) << got.at("big").error();
  EXPECT_EQ(got.at("big").result().size(), ProcessHandler::kMaxObjectChunk + 10);
  ASSERT_EQ(loop.gets.size(), 2u);
  EXPECT_EQ(loop.gets[0].length, ProcessHandler::kMaxObjectChunk);
  EXPECT_EQ(loop.gets[1].offset, ProcessHandler::kMaxObjectChunk);
}

TEST(ProcessHandlerObjectsTest, BadAndExcessGetsAreAnsweredAtOnceWithoutReachingTheWorker) {
  auto h = MakeObjectsHandler(1);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
  ObjectsLoop loop{*h};
  loop.objects["\x07"] = "x";
  // 17 at once: 16 relayed and answered, the 17th busy.
  auto got = loop.Run({MakeObjectTask("many", "gets:17:07"), MakeObjectTask("bad", "badget")}, 2);
  ASSERT_TRUE(got.at("many").ok()) << got.at("many").error();
  EXPECT_EQ(got.at("many").result(), "0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,4");
  ASSERT_TRUE(got.at("bad").ok()) << got.at("bad").error();
  EXPECT_EQ(got.at("bad").result(), "6");  // bad_request
  EXPECT_EQ(loop.gets.size(), 16u);
  // An answer for a tag that is not out is refused for the caller to count.
  EXPECT_EQ(h->DeliverObject(loop.gets[0].tag, kOk, 1, 0, "x", {}),
            ProcessHandler::Delivery::kUnknown);
  EXPECT_EQ(h->DeliverObject(999999, kOk, 1, 0, "x", {}), ProcessHandler::Delivery::kUnknown);
}

TEST(ProcessHandlerObjectsTest, GetsOutWhenTheConnectionIsReplacedAreAnsweredUnavailable) {
  auto h = MakeObjectsHandler(1);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
  ObjectsLoop loop{*h};
  loop.hold = true;
  std::vector<Completion> done;
  std::vector<Task> tasks{MakeObjectTask("f", "fetch:0a0b:10")};
  h->Submit(tasks, {}, &done);
  // Wait for its get, then answer it as the worker does on a reconnect.
  std::vector<ProcessHandler::ObjectGetOut> taken;
  std::vector<zmq::pollitem_t> items;
  ASSERT_TRUE(WaitFor([&] {
    items.clear();
    h->PollItems(&items);
    zmq::poll(items.data(), items.size(), milliseconds(20));
    h->Service(items.data(), items.size(), {}, &done);
    return h->has_object_gets();
  }, seconds(20)));
  h->TakeObjectGets(&taken);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(h->object_gets_out(), 1u);
  h->FailObjectGets(kUnavailable, "the connection was replaced");
  EXPECT_EQ(h->object_gets_out(), 0u);
  ASSERT_TRUE(WaitFor([&] {
    items.clear();
    h->PollItems(&items);
    zmq::poll(items.data(), items.size(), milliseconds(20));
    h->Service(items.data(), items.size(), {}, &done);
    return !done.empty();
  }, seconds(20)));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok());
  EXPECT_EQ(done[0].error(), "status 7: the connection was replaced");
}

TEST(ProcessHandlerObjectsTest, AHandlerKilledDuringAFetchIsRestartedAndGetsNoStaleAnswer) {
  auto h = MakeObjectsHandler(1);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
  ObjectsLoop loop{*h};
  loop.hold = true;
  auto got = loop.Run({MakeObjectTask("k", "getkill:0c")}, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got.at("k").retry());
  ASSERT_EQ(loop.held.size(), 1u);
  ASSERT_TRUE(WaitFor([&] { return h->starts() == 2 && h->ready_slots() == 1; }, seconds(20)));
  // The late answer is taken (the tag was ours) and not written to the new
  // process, which runs the next batch as if nothing happened.
  EXPECT_EQ(h->DeliverObject(loop.held[0].tag, kOk, 1, 0, "y", {}),
            ProcessHandler::Delivery::kStale);
  loop.hold = false;
  loop.objects["\x0c"] = "fresh";
  auto next = loop.Run({MakeObjectTask("n", "fetch:0c:3")}, 1);
  ASSERT_TRUE(next.at("n").ok()) << next.at("n").error();
  EXPECT_EQ(next.at("n").result(), "fresh");
  EXPECT_EQ(h->starts(), 2);
}

TEST(ProcessHandlerObjectsTest, AGetAfterTheLastAnswerRestartsTheHandlerButKeepsTheAnswer) {
  auto h = MakeObjectsHandler(1);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
  ObjectsLoop loop{*h};
  auto got = loop.Run({MakeObjectTask("l", "lateget")}, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got.at("l").ok()) << got.at("l").error();
  EXPECT_TRUE(loop.gets.empty());  // not relayed: it held no batch
  ASSERT_TRUE(WaitFor([&] { return h->starts() == 2 && h->ready_slots() == 1; }, seconds(20)));
}

TEST(ProcessHandlerObjectsTest, AGetToAWorkerWithoutObjectsIsAProtocolError) {
  auto h = MakeObjectsHandler(1, /*objects=*/false);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
  ObjectsLoop loop{*h};
  auto got = loop.Run({MakeObjectTask("g", "fetch:01:10")}, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got.at("g").retry());
  EXPECT_EQ(std::string(got.at("g").error()).rfind("protocol error: get", 0), 0u)
      << got.at("g").error();
  EXPECT_TRUE(loop.gets.empty());
}

TEST(ProcessHandlerObjectsTest, RunBatchRefusesGetsWithBadRequest) {
  auto h = MakeObjectsHandler(1);
  ASSERT_TRUE(WaitFor([&] { return h->ready_slots() == 1; }, seconds(20)));
  const HandlerOutput out = h->RunBatch(BatchInfo{"r", "default", 1}, "fetch:01:10", Timeout(0));
  EXPECT_FALSE(out.ok);
  EXPECT_FALSE(out.retry);
  EXPECT_EQ(out.error.rfind("status 6: objects are fetched only", 0), 0u) << out.error;
}

}  // namespace
}  // namespace fleet::worker

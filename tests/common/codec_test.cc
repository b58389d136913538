#include "common/codec.h"

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include <functional>
#include <string>

namespace fleet::proto {
namespace {

std::string Packed(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& f);

Message RoundTrip(const Message& in, std::string* keep) {
  *keep = Encode(in);
  Decoded d = Decode(keep->data(), keep->size());
  EXPECT_TRUE(d.ok()) << d.detail;
  EXPECT_EQ(d.message->index(), in.index());
  return *d.message;
}

TEST(CodecTest, RoundTripsSubmit) {
  std::string payload(1000, '\0');
  payload[3] = 'x';
  Submit in{{{"b1", "default", payload}, {"b2", "", "hi"}}};
  std::string buf;
  auto out = std::get<Submit>(RoundTrip(in, &buf));
  ASSERT_EQ(out.batches.size(), 2u);
  EXPECT_EQ(out.batches[0].id, "b1");
  EXPECT_EQ(out.batches[0].queue, "default");
  EXPECT_EQ(out.batches[0].payload, payload);
  EXPECT_EQ(out.batches[1].queue, "");
  EXPECT_EQ(out.batches[1].payload, "hi");
}

TEST(CodecTest, RoundTripsAckAndResult) {
  std::string buf;
  Ack ack{{"a", "b"}, {{"c", ErrorCode::kQueueFull, "queue full"}}};
  auto a = std::get<Ack>(RoundTrip(ack, &buf));
  ASSERT_EQ(a.accepted.size(), 2u);
  EXPECT_EQ(a.accepted[1], "b");
  ASSERT_EQ(a.rejected.size(), 1u);
  EXPECT_EQ(a.rejected[0].code, ErrorCode::kQueueFull);
  EXPECT_EQ(a.rejected[0].message, "queue full");

  std::string buf2;
  Result res{{{"x", Outcome::kFailed, 5, "out", "dead-lettered"}}};
  auto r = std::get<Result>(RoundTrip(res, &buf2));
  ASSERT_EQ(r.results.size(), 1u);
  EXPECT_EQ(r.results[0].outcome, Outcome::kFailed);
  EXPECT_EQ(r.results[0].attempts, 5u);
  EXPECT_EQ(r.results[0].result, "out");
  EXPECT_EQ(r.results[0].error, "dead-lettered");
}

TEST(CodecTest, RoundTripsWorkerMessages) {
  std::string b1, b2, b3, b4;
  auto h = std::get<Hello>(RoundTrip(Hello{"w1", 4, 3, {"q1", "q2"}}, &b1));
  EXPECT_EQ(h.worker_id, "w1");
  EXPECT_EQ(h.concurrency, 4u);
  EXPECT_EQ(h.credit, 3u);
  ASSERT_EQ(h.queues.size(), 2u);
  EXPECT_EQ(h.queues[1], "q2");

  auto d = std::get<Dispatch>(RoundTrip(Dispatch{{{"b", "q", 2, "p"}}}, &b2));
  ASSERT_EQ(d.batches.size(), 1u);
  EXPECT_EQ(d.batches[0].attempt, 2u);
  EXPECT_EQ(d.batches[0].payload, "p");

  auto done = std::get<Done>(
      RoundTrip(Done{2, {{"b", 2, Outcome::kOk, "r", ""}}}, &b3));
  EXPECT_EQ(done.credit, 2u);
  ASSERT_EQ(done.results.size(), 1u);
  EXPECT_EQ(done.results[0].result, "r");

  // A DONE's outcome: 0 ok, 3 retry, any other value failed.
  auto retry = std::get<Done>(RoundTrip(Done{0, {{"b", 1, Outcome::kRetry, "", "died"}}}, &b3));
  ASSERT_EQ(retry.results.size(), 1u);
  EXPECT_EQ(retry.results[0].outcome, Outcome::kRetry);
  std::string odd = Packed([](auto& p) {
    p.pack_array(4); p.pack(1); p.pack(13); p.pack(0);
    p.pack_array(1); p.pack_array(5); p.pack("id"); p.pack(1); p.pack(7);
    p.pack_bin(0); p.pack("x");
  });
  Decoded odd_done = Decode(odd.data(), odd.size());
  ASSERT_TRUE(odd_done.ok()) << odd_done.detail;
  EXPECT_EQ(std::get<Done>(*odd_done.message).results[0].outcome, Outcome::kFailed);

  auto w = std::get<Welcome>(RoundTrip(Welcome{250, 4}, &b4));
  EXPECT_EQ(w.heartbeat_ms, 250u);
  EXPECT_EQ(w.liveness, 4u);

  std::string b5, b6, b7, b8, b9;
  RoundTrip(Drain{}, &b5);
  RoundTrip(Bye{}, &b6);
  RoundTrip(Heartbeat{}, &b7);
  EXPECT_EQ(std::get<Stop>(RoundTrip(Stop{"retired"}, &b8)).reason, "retired");
  EXPECT_EQ(std::get<Reset>(RoundTrip(Reset{"unknown"}, &b9)).reason, "unknown");
}

TEST(CodecTest, RoundTripsControlMessages) {
  std::string b1, b2, b3, b4, b5, b6;
  auto c = std::get<Control>(RoundTrip(Control{7, "retire", {"w1"}}, &b1));
  EXPECT_EQ(c.request_id, 7u);
  EXPECT_EQ(c.op, "retire");
  ASSERT_EQ(c.args.size(), 1u);

  auto r = std::get<ControlReply>(
      RoundTrip(ControlReply{7, ErrorCode::kBusy, "holds 2"}, &b2));
  EXPECT_EQ(r.code, ErrorCode::kBusy);

  WorkersReply wr{9, {{"w1", "idle", 4, 0, 1.5, 10, 1}}};
  auto w = std::get<WorkersReply>(RoundTrip(wr, &b3));
  ASSERT_EQ(w.workers.size(), 1u);
  EXPECT_DOUBLE_EQ(w.workers[0].idle_seconds, 1.5);
  EXPECT_EQ(w.workers[0].processed, 10u);

  StatsReply sr{3, {{"default", 12}}, {{"submitted", 40}, {"inflight", 2}}};
  auto s = std::get<StatsReply>(RoundTrip(sr, &b4));
  ASSERT_EQ(s.queues.size(), 1u);
  EXPECT_EQ(s.queues[0].second, 12u);
  ASSERT_EQ(s.values.size(), 2u);
  EXPECT_DOUBLE_EQ(s.values[1].second, 2.0);

  auto e = std::get<Error>(RoundTrip(Error{ErrorCode::kMalformed, "bad"}, &b5));
  EXPECT_EQ(e.code, ErrorCode::kMalformed);
  auto f = std::get<Fetch>(RoundTrip(Fetch{{"a", "b"}}, &b6));
  EXPECT_EQ(f.ids.size(), 2u);
}

TEST(CodecTest, HelloCarriesSlotsAndIncarnationAndFourFieldHellosStillDecode) {
  std::string b1;
  auto h = std::get<Hello>(RoundTrip(Hello{"w1", 8, 8, {}, 2, "run-7f3a"}, &b1));
  EXPECT_EQ(h.concurrency, 8u);
  EXPECT_EQ(h.slots, 2u);
  EXPECT_EQ(h.incarnation, "run-7f3a");
  // What a worker written to the first version of the spec sends.
  for (int fields : {4, 5}) {
    std::string old = Packed([&](auto& p) {
      p.pack_array(2 + fields);
      p.pack(1);
      p.pack(10);
      p.pack(std::string("w2"));
      p.pack(3);
      p.pack(3);
      p.pack_array(0);
      if (fields == 5) p.pack(1);
    });
    Decoded d = Decode(old.data(), old.size());
    ASSERT_TRUE(d.ok()) << d.detail;
    const auto& m = std::get<Hello>(*d.message);
    EXPECT_EQ(m.worker_id, "w2");
    EXPECT_EQ(m.slots, fields == 5 ? 1u : 0u);
    EXPECT_EQ(m.incarnation, "");
  }
}

TEST(CodecTest, WorkerInfoCarriesSlotsAndSevenFieldEntriesStillDecode) {
  std::string b1;
  WorkersReply wr{9, {{"w1", "busy", 64, 3, 0, 10, 1, 1}}};
  auto w = std::get<WorkersReply>(RoundTrip(wr, &b1));
  ASSERT_EQ(w.workers.size(), 1u);
  EXPECT_EQ(w.workers[0].slots, 1u);
  EXPECT_EQ(w.workers[0].concurrency, 64u);
  std::string old = Packed([](auto& p) {
    p.pack_array(4);
    p.pack(1);
    p.pack(32);
    p.pack(9);
    p.pack_array(1);
    p.pack_array(7);
    p.pack(std::string("w1"));
    p.pack(std::string("idle"));
    p.pack(4);
    p.pack(0);
    p.pack(1.5);
    p.pack(10);
    p.pack(1);
  });
  Decoded d = Decode(old.data(), old.size());
  ASSERT_TRUE(d.ok()) << d.detail;
  EXPECT_EQ(std::get<WorkersReply>(*d.message).workers.at(0).slots, 0u);
}

// A CONTROL refused as a whole still yields its request id, so the broker
// can answer under it; other commands have none.
TEST(CodecTest, RefusedControlStillGivesItsRequestId) {
  std::string bad_op = Packed([](auto& p) {
    p.pack_array(5);
    p.pack(1);
    p.pack(30);
    p.pack(77);
    p.pack(std::string("retire"));
    p.pack(12);  // args must be a list
  });
  Decoded d = Decode(bad_op.data(), bad_op.size());
  EXPECT_FALSE(d.ok());
  ASSERT_TRUE(d.request_id.has_value());
  EXPECT_EQ(*d.request_id, 77u);
  std::string no_id = Packed([](auto& p) {
    p.pack_array(3);
    p.pack(1);
    p.pack(30);
    p.pack(std::string("x"));
  });
  Decoded e = Decode(no_id.data(), no_id.size());
  EXPECT_FALSE(e.ok());
  EXPECT_FALSE(e.request_id.has_value());
  std::string hello = Encode(Hello{"w", 1, 1, {}});
  EXPECT_FALSE(Decode(hello.data(), hello.size()).request_id.has_value());
}

TEST(CodecTest, RoundTripsObjectMessagesWithSixtyFourBitFields) {
  const std::string digest(32, '\xab');
  const std::uint64_t big = (std::uint64_t{1} << 40) + 7;
  std::string b1, b2, b3, b4;
  auto rq = std::get<ObjectRequest>(RoundTrip(ObjectRequest{big, "b-3", digest, big, 4u << 20}, &b1));
  EXPECT_EQ(rq.token, big);
  EXPECT_EQ(rq.batch_id, "b-3");
  EXPECT_EQ(rq.digest, digest);
  EXPECT_EQ(rq.offset, big);
  EXPECT_EQ(rq.length, 4u << 20);

  const std::string data(1000, '\0');
  auto rp = std::get<ObjectReply>(RoundTrip(ObjectReply{big, 0, big, data, ""}, &b2));
  EXPECT_EQ(rp.token, big);
  EXPECT_EQ(rp.status, 0u);
  EXPECT_EQ(rp.total, big);
  EXPECT_EQ(rp.data, data);

  auto g = std::get<ObjectGet>(RoundTrip(ObjectGet{big, "b-3", digest, 5, 9}, &b3));
  EXPECT_EQ(g.tag, big);
  EXPECT_EQ(g.digest, digest);
  EXPECT_EQ(g.offset, 5u);
  EXPECT_EQ(g.length, 9u);

  // A status outside the enum decodes: the receiver checks it.
  auto od = std::get<ObjectData>(RoundTrip(ObjectData{big, 99, 0, 5, "", "why"}, &b4));
  EXPECT_EQ(od.tag, big);
  EXPECT_EQ(od.status, 99u);
  EXPECT_EQ(od.offset, 5u);
  EXPECT_EQ(od.error, "why");
  EXPECT_STREQ(ObjectStatusName(ObjectStatus::kProducerGone), "producer_gone");
  EXPECT_STREQ(ObjectStatusName(static_cast<ObjectStatus>(99)), "invalid");

  // A length past u32 is refused, as every other u32 field.
  std::string wide = Packed([](auto& p) {
    p.pack_array(7);
    p.pack(1);
    p.pack(19);
    p.pack(1);
    p.pack(std::string("b"));
    p.pack_bin(1);
    p.pack_bin_body("d", 1);
    p.pack(0);
    p.pack(std::uint64_t{1} << 32);
  });
  Decoded d = Decode(wide.data(), wide.size());
  EXPECT_FALSE(d.ok());
  EXPECT_EQ(d.error, ErrorCode::kMalformed);
}

TEST(CodecTest, CommandOfMatchesEncodedCommand) {
  std::string buf = Encode(Hello{"w", 1, 1, {}});
  Decoded d = Decode(buf.data(), buf.size());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(CommandOf(*d.message), Command::kHello);
}

std::string Packed(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& f) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> p(sb);
  f(p);
  return std::string(sb.data(), sb.size());
}

struct BadCase {
  const char* name;
  std::string bytes;
  ErrorCode want;
};

TEST(CodecTest, RejectsMalformedTruncatedOversizedAndWrongVersion) {
  std::string good = Encode(Submit{{{"b1", "", "payload"}}});
  std::string trailing = good + "x";
  std::string truncated = good.substr(0, good.size() - 3);
  std::vector<BadCase> cases = {
      {"empty", "", ErrorCode::kMalformed},
      {"random bytes", "\xc1\xc1\xc1", ErrorCode::kMalformed},
      {"not an array", Packed([](auto& p) { p.pack(42); }), ErrorCode::kMalformed},
      {"array too short", Packed([](auto& p) { p.pack_array(1); p.pack(1); }),
       ErrorCode::kMalformed},
      {"trailing bytes", trailing, ErrorCode::kMalformed},
      {"truncated", truncated, ErrorCode::kMalformed},
      {"wrong version",
       Packed([](auto& p) { p.pack_array(3); p.pack(2); p.pack(1); p.pack_array(0); }),
       ErrorCode::kUnsupportedVersion},
      {"negative version",
       Packed([](auto& p) { p.pack_array(3); p.pack(-1); p.pack(1); p.pack_array(0); }),
       ErrorCode::kMalformed},
      {"unknown command",
       Packed([](auto& p) { p.pack_array(2); p.pack(1); p.pack(99); }),
       ErrorCode::kUnknownCommand},
      {"wrong field count",
       Packed([](auto& p) { p.pack_array(4); p.pack(1); p.pack(1); p.pack_array(0); p.pack(1); }),
       ErrorCode::kMalformed},
      {"id wrong type",
       Packed([](auto& p) {
         p.pack_array(3); p.pack(1); p.pack(1);
         p.pack_array(1); p.pack_array(3); p.pack(5); p.pack(""); p.pack("x");
       }),
       ErrorCode::kMalformed},
      // array32 header claiming 2^32-1 elements with no body (msgpack-c #1013).
      {"huge array header", std::string("\xdd\xff\xff\xff\xff", 5), ErrorCode::kTooLarge},
      {"huge inner array header",
       Packed([](auto& p) { p.pack_array(3); p.pack(1); p.pack(1); }) +
           std::string("\xdd\x00\xff\xff\xff", 5),
       ErrorCode::kTooLarge},
      {"huge map header", std::string("\xdf\xff\xff\xff\xff", 5), ErrorCode::kTooLarge},
      {"truncated str32", std::string("\x93\x01\x04\xdb\x00\x00\x10\x00" "ab", 10),
       ErrorCode::kMalformed},
      {"huge bin header, no body", std::string("\xc6\xff\xff\xff\xff", 5), ErrorCode::kMalformed},
      {"ext type", std::string("\xd4\x01\x02", 3), ErrorCode::kTooLarge},
      // Complete but too deep: the unpacker's depth limit.
      {"deep nesting", std::string(2000, '\x91') + '\xc0', ErrorCode::kTooLarge},
      // Headers announcing more elements than bytes remain are refused
      // before anything is allocated for them.
      {"deep nesting, truncated", std::string(2000, '\x91'), ErrorCode::kMalformed},
      {"nested array headers", std::string(100000, '\xdc'), ErrorCode::kMalformed},
      {"array16 of 65535 with no body", std::string("\xdc\xff\xff", 3), ErrorCode::kMalformed},
      {"unknown outcome",
       Packed([](auto& p) {
         p.pack_array(3); p.pack(1); p.pack(3);
         p.pack_array(1); p.pack_array(5); p.pack("id"); p.pack(9); p.pack(1);
         p.pack_bin(0); p.pack("");
       }),
       ErrorCode::kMalformed},
  };
  for (const auto& c : cases) {
    Decoded d = Decode(c.bytes.data(), c.bytes.size());
    EXPECT_FALSE(d.ok()) << c.name;
    EXPECT_EQ(d.error, c.want) << c.name << ": " << d.detail;
    EXPECT_FALSE(d.detail.empty()) << c.name;
  }
}

TEST(CodecTest, EnforcesConfiguredLimits) {
  Limits lim;
  lim.max_payload_bytes = 10;
  lim.max_items = 2;
  lim.max_id_bytes = 4;
  lim.max_message_bytes = 200;
  struct Case {
    const char* name;
    Message msg;
  };
  std::string big(11, 'x');
  std::string huge(300, 'x');
  std::vector<Case> cases = {
      {"payload", Submit{{{"b", "", big}}}},
      {"items", Submit{{{"a", "", ""}, {"b", "", ""}, {"c", "", ""}}}},
      {"id", Submit{{{"abcde", "", ""}}}},
      {"frame", Submit{{{"a", "", std::string_view(huge).substr(0, 10)}, {"b", "", huge}}}},
  };
  for (const auto& c : cases) {
    std::string buf = Encode(c.msg);
    Decoded d = Decode(buf.data(), buf.size(), lim);
    EXPECT_FALSE(d.ok()) << c.name;
    EXPECT_EQ(d.error, ErrorCode::kTooLarge) << c.name << ": " << d.detail;
  }
  std::string ok = Encode(Submit{{{"abcd", "", "0123456789"}}});
  EXPECT_TRUE(Decode(ok.data(), ok.size(), lim).ok());
}

TEST(CodecTest, AcceptsStrPayloadFromHandWrittenProducers) {
  std::string bytes = Packed([](auto& p) {
    p.pack_array(3); p.pack(1); p.pack(1);
    p.pack_array(1); p.pack_array(3); p.pack("id"); p.pack("q"); p.pack("text payload");
  });
  Decoded d = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.detail;
  EXPECT_EQ(std::get<Submit>(*d.message).batches[0].payload, "text payload");
}

// A stats map's value is checked before its key; a key that is itself a
// container is stepped over to reach its value.
TEST(CodecTest, StatsReplyChecksEachValueBeforeItsKey) {
  auto stats = [](auto&& key, auto&& value) {
    return Packed([&](auto& p) {
      p.pack_array(5); p.pack(1); p.pack(33); p.pack(7);
      p.pack_map(1); key(p); value(p);
      p.pack_map(0);
    });
  };
  auto array_key = [](auto& p) { p.pack_array(2); p.pack(1); p.pack_array(1); p.pack(2); };
  auto str_key = [](auto& p) { p.pack("default"); };
  auto bad_value = [](auto& p) { p.pack("x"); };
  auto good_value = [](auto& p) { p.pack(4); };
  struct Case {
    const char* name;
    std::string bytes;
    const char* detail;
  };
  const Case cases[] = {
      {"array key, bad value", stats(array_key, bad_value),
       "stats: queue depth not an unsigned integer"},
      {"array key, good value", stats(array_key, good_value), "message: expected str"},
      {"str key, bad value", stats(str_key, bad_value),
       "stats: queue depth not an unsigned integer"},
  };
  for (const auto& c : cases) {
    Decoded d = Decode(c.bytes.data(), c.bytes.size());
    EXPECT_FALSE(d.ok()) << c.name;
    EXPECT_EQ(d.error, ErrorCode::kMalformed) << c.name;
    EXPECT_EQ(d.detail, c.detail) << c.name;
  }
  std::string good = stats(str_key, good_value);
  Decoded d = Decode(good.data(), good.size());
  ASSERT_TRUE(d.ok()) << d.detail;
  const auto& reply = std::get<StatsReply>(*d.message);
  ASSERT_EQ(reply.queues.size(), 1u);
  EXPECT_EQ(reply.queues[0].first, "default");
  EXPECT_EQ(reply.queues[0].second, 4u);
}

}  // namespace
}  // namespace fleet::proto

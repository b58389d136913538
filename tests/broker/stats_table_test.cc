#include "broker/stats_table.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <set>
#include <string>

#include "broker/broker_core.h"
#include "broker/broker_metrics.h"
#include "common/codec.h"

namespace fleet::broker {
namespace {

TEST(StatsTableTest, NamesAreUniqueAndEveryFamilyHasOneHelpAndOneKind) {
  std::set<std::string> stats;
  std::map<std::string, StatSpec::Kind> kinds;
  std::set<std::string> series;
  for (const StatSpec& s : StatsTable()) {
    if (*s.stat != '\0') {
      EXPECT_TRUE(stats.insert(s.stat).second) << s.stat;
    }
    if (*s.metric == '\0') continue;
    auto [it, first] = kinds.emplace(s.metric, s.kind);
    if (first) {
      EXPECT_NE(std::string(s.help), "") << s.metric;
    } else {
      EXPECT_EQ(it->second, s.kind) << s.metric;
    }
    EXPECT_TRUE(series.insert(std::string(s.metric) + "{" + s.label_key + "=" + s.label_value +
                              "}")
                    .second)
        << s.metric;
    const std::string name = s.metric;
    if (s.kind == StatSpec::Kind::kCounter) {
      EXPECT_EQ(name.substr(name.size() - 6), "_total") << name;
    }
  }
}

// fleet-ctl stats and /metrics report the same numbers: after some traffic
// every stat of the table is in the STATS_REPLY with the value /metrics
// shows for its series.
TEST(StatsTableTest, StatsReplyAndMetricsPageShowTheSameValues) {
  BrokerOptions o;
  BrokerCore core(o);
  const TimePoint now{};
  const std::vector<std::string_view> none;
  core.OnMessage(Socket::kBackend, "W", proto::Hello{"w1", 2, 2, {}, 1, "run"}, now);
  const std::string p1 = "p1", p2 = "p2";
  core.OnMessage(Socket::kFrontend, "P",
                 proto::Submit{{{"a", "", p1}, {"b", "", p2}, {"", "", p2}}}, now);
  core.Pump(now);
  core.OnMessage(Socket::kBackend, "W", proto::Done{1, {{"a", 1, proto::Outcome::kOk, "r", ""}}},
                 now);
  core.OnMessage(Socket::kControl, "C", proto::Control{7, "stats", none}, now);
  std::map<std::string, double> reply;
  for (const auto& f : core.outbox().frames) {
    auto d = proto::Decode(f.body.data(), f.body.size());
    ASSERT_TRUE(d.ok());
    if (const auto* s = std::get_if<proto::StatsReply>(&*d.message)) {
      for (const auto& [name, v] : s->values) reply[std::string(name)] = v;
    }
  }
  prometheus::Registry registry;
  BrokerMetrics metrics(registry);
  metrics.Update(core, now);
  const std::string page = prometheus::TextSerializer().Serialize(registry.Collect());
  for (const StatSpec& s : StatsTable()) {
    if (*s.stat == '\0') continue;
    ASSERT_EQ(reply.count(s.stat), 1u) << s.stat;
    EXPECT_EQ(reply[s.stat], s.read(core)) << s.stat;
    if (*s.metric == '\0') continue;
    std::string series = s.metric;
    if (*s.label_key != '\0') {
      series += std::string("{") + s.label_key + "=\"" + s.label_value + "\"}";
    }
    const auto at = page.find("\n" + series + " ");
    ASSERT_NE(at, std::string::npos) << series << "\n" << page;
    EXPECT_EQ(std::stod(page.substr(at + series.size() + 2)), reply[s.stat]) << series;
  }
  EXPECT_EQ(reply["submitted"], 2);
  EXPECT_EQ(reply["rejected_invalid"], 1);
  EXPECT_EQ(reply["completed_ok"], 1);
  EXPECT_EQ(reply["inflight"], 1);
  EXPECT_EQ(reply["workers_registered"], 1);
}

}  // namespace
}  // namespace fleet::broker

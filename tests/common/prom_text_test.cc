#include "common/prom_text.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace fleet::prom {
namespace {

// A page in the shape fleet-broker serves, checked with `promtool check
// metrics` (which only lints the missing HELP of temperature_delta).
constexpr std::string_view kFleetPage = R"(# HELP fleet_queue_depth Batches waiting for a worker.
# TYPE fleet_queue_depth gauge
fleet_queue_depth{queue="default"} 12
fleet_queue_depth{queue="bulk"} 3
# HELP fleet_batches_inflight Batches dispatched, not yet reported.
# TYPE fleet_batches_inflight gauge
fleet_batches_inflight 4
# HELP fleet_workers Workers by state.
# TYPE fleet_workers gauge
fleet_workers{state="idle"} 2
fleet_workers{state="busy"} 3
fleet_workers{state="retiring"} 1
# HELP fleet_worker_idle_seconds Seconds since the worker's last batch finished.
# TYPE fleet_worker_idle_seconds gauge
fleet_worker_idle_seconds{worker="w-1"} 0
fleet_worker_idle_seconds{worker="w-2"} 17.25
fleet_worker_idle_seconds{worker="w-\"quoted\"\\path\nline"} 1.5e2
# HELP fleet_batches_completed_total Results returned.\nSecond line with a \\ backslash.
# TYPE fleet_batches_completed_total counter
fleet_batches_completed_total{outcome="ok"} 1027 1700000000000
fleet_batches_completed_total{outcome="failed"} 3 1700000000000
# HELP fleet_batch_seconds How long a batch took.
# TYPE fleet_batch_seconds histogram
fleet_batch_seconds_bucket{le="0.005"} 10
fleet_batch_seconds_bucket{le="0.05"} 240
fleet_batch_seconds_bucket{le="0.5"} 1000
fleet_batch_seconds_bucket{le="+Inf"} 1030
fleet_batch_seconds_sum 53.75
fleet_batch_seconds_count 1030
# HELP rpc_duration_seconds RPC latency.
# TYPE rpc_duration_seconds summary
rpc_duration_seconds{quantile="0.5"} 0.012
rpc_duration_seconds{quantile="0.99"} NaN
rpc_duration_seconds_sum 1.7560473e+07
rpc_duration_seconds_count 2693
# A plain comment, then a blank line.

# HELP process_max_fds Maximum number of open file descriptors.
# TYPE process_max_fds gauge
process_max_fds +Inf
# TYPE temperature_delta gauge
temperature_delta{sensor="a",} -Inf
temperature_delta{} -3.5E-2
)";

// An excerpt of what Debian's prometheus 2.42 serves on its own /metrics.
constexpr std::string_view kPrometheusPage =
    R"(# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 6.2567e-05
go_gc_duration_seconds{quantile="0.25"} 7.6053e-05
go_gc_duration_seconds{quantile="0.5"} 0.000229211
go_gc_duration_seconds{quantile="0.75"} 0.000378248
go_gc_duration_seconds{quantile="1"} 0.000378248
go_gc_duration_seconds_sum 0.000746079
go_gc_duration_seconds_count 4
# HELP go_info Information about the Go environment.
# TYPE go_info gauge
go_info{version="go1.19.8"} 1
# HELP go_memstats_alloc_bytes_total Total number of bytes allocated, even if freed.
# TYPE go_memstats_alloc_bytes_total counter
go_memstats_alloc_bytes_total 1.3203216e+07
# HELP net_conntrack_dialer_conn_failed_total Total number of connections failed to dial by the dialer a given name.
# TYPE net_conntrack_dialer_conn_failed_total counter
net_conntrack_dialer_conn_failed_total{dialer_name="default",reason="refused"} 0
net_conntrack_dialer_conn_failed_total{dialer_name="default",reason="resolution"} 0
net_conntrack_dialer_conn_failed_total{dialer_name="default",reason="timeout"} 2
net_conntrack_dialer_conn_failed_total{dialer_name="default",reason="unknown"} 0
# HELP prometheus_engine_query_duration_seconds Query timings
# TYPE prometheus_engine_query_duration_seconds summary
prometheus_engine_query_duration_seconds{slice="inner_eval",quantile="0.5"} NaN
prometheus_engine_query_duration_seconds{slice="inner_eval",quantile="0.9"} NaN
prometheus_engine_query_duration_seconds{slice="inner_eval",quantile="0.99"} NaN
prometheus_engine_query_duration_seconds_sum{slice="inner_eval"} 0
prometheus_engine_query_duration_seconds_count{slice="inner_eval"} 0
# HELP prometheus_http_request_duration_seconds Histogram of latencies for HTTP requests.
# TYPE prometheus_http_request_duration_seconds histogram
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="0.1"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="0.2"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="0.4"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="1"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="3"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="8"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="20"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="60"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="120"} 1
prometheus_http_request_duration_seconds_bucket{handler="/-/ready",le="+Inf"} 1
prometheus_http_request_duration_seconds_sum{handler="/-/ready"} 3.7089e-05
prometheus_http_request_duration_seconds_count{handler="/-/ready"} 1
# HELP prometheus_http_response_size_bytes Histogram of response size for HTTP requests.
# TYPE prometheus_http_response_size_bytes histogram
prometheus_http_response_size_bytes_bucket{handler="/-/ready",le="100"} 1
prometheus_http_response_size_bytes_bucket{handler="/-/ready",le="1e+06"} 1
prometheus_http_response_size_bytes_bucket{handler="/-/ready",le="+Inf"} 1
prometheus_http_response_size_bytes_sum{handler="/-/ready"} 47
prometheus_http_response_size_bytes_count{handler="/-/ready"} 1
)";

std::string Describe(const ParseResult& r) {
  if (!r.first_error) return "no error";
  return "line " + std::to_string(r.first_error->line) + ": " + r.first_error->reason;
}

TEST(PromTextTest, ParsesFleetPage) {
  ParseResult r = ParsePromText(kFleetPage);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.samples.size(), 24u);
  EXPECT_EQ(r.Value("fleet_queue_depth", {{"queue", "default"}}), 12.0);
  EXPECT_EQ(r.Sum("fleet_queue_depth"), 15.0);
  EXPECT_EQ(r.Value("fleet_batches_inflight"), 4.0);
  EXPECT_EQ(r.Sum("fleet_workers"), 6.0);
  EXPECT_EQ(r.Value("fleet_workers", {{"state", "retiring"}}), 1.0);
  EXPECT_EQ(r.Count("fleet_worker_idle_seconds"), 3u);
  EXPECT_EQ(r.Value("fleet_worker_idle_seconds", {{"worker", "w-2"}}), 17.25);
  EXPECT_EQ(r.Value("fleet_worker_idle_seconds", {{"worker", "w-\"quoted\"\\path\nline"}}), 150.0);
  EXPECT_FALSE(r.Value("fleet_worker_idle_seconds", {{"worker", "w-9"}}));
  EXPECT_FALSE(r.Value("no_such_metric"));
  EXPECT_EQ(r.Sum("no_such_metric"), 0.0);

  auto completed = r.Series("fleet_batches_completed_total");
  ASSERT_EQ(completed.size(), 2u);
  EXPECT_EQ(completed[0]->labels, (Labels{{"outcome", "ok"}}));
  EXPECT_EQ(completed[0]->value, 1027.0);
  EXPECT_EQ(completed[0]->timestamp_ms, 1700000000000);
  EXPECT_EQ(completed[1]->value, 3.0);
  EXPECT_FALSE(r.Series("fleet_queue_depth")[0]->timestamp_ms);

  EXPECT_EQ(r.Value("fleet_batch_seconds_bucket", {{"le", "+Inf"}}), 1030.0);
  EXPECT_EQ(r.Value("fleet_batch_seconds_bucket", {{"le", "0.05"}}), 240.0);
  EXPECT_EQ(r.Value("fleet_batch_seconds_sum"), 53.75);
  EXPECT_EQ(r.Value("fleet_batch_seconds_count"), 1030.0);
  EXPECT_EQ(r.Value("rpc_duration_seconds_sum"), 1.7560473e+07);
  EXPECT_TRUE(std::isnan(*r.Value("rpc_duration_seconds", {{"quantile", "0.99"}})));
  EXPECT_EQ(r.Value("process_max_fds"), INFINITY);
  EXPECT_EQ(r.Value("temperature_delta", {{"sensor", "a"}}), -INFINITY);
  auto deltas = r.Series("temperature_delta");
  ASSERT_EQ(deltas.size(), 2u);
  EXPECT_TRUE(deltas[1]->labels.empty());
  EXPECT_DOUBLE_EQ(deltas[1]->value, -0.035);
}

TEST(PromTextTest, ReadsTypeAndHelpPerFamily) {
  ParseResult r = ParsePromText(kFleetPage);
  const FamilyInfo* completed = r.FamilyOf("fleet_batches_completed_total");
  ASSERT_NE(completed, nullptr);
  EXPECT_EQ(completed->type, MetricType::kCounter);
  EXPECT_EQ(completed->help, "Results returned.\nSecond line with a \\ backslash.");
  EXPECT_EQ(r.FamilyOf("fleet_workers")->type, MetricType::kGauge);
  for (const char* name : {"fleet_batch_seconds_bucket", "fleet_batch_seconds_sum",
                           "fleet_batch_seconds_count", "fleet_batch_seconds"}) {
    ASSERT_NE(r.FamilyOf(name), nullptr) << name;
    EXPECT_EQ(r.FamilyOf(name)->type, MetricType::kHistogram) << name;
    EXPECT_EQ(r.FamilyOf(name)->help, "How long a batch took.");
  }
  EXPECT_EQ(r.FamilyOf("rpc_duration_seconds_count")->type, MetricType::kSummary);
  EXPECT_EQ(r.FamilyOf("rpc_duration_seconds_bucket"), nullptr);  // summaries have no buckets
  EXPECT_EQ(r.FamilyOf("fleet_workers_sum"), nullptr);            // gauges have no _sum
  EXPECT_EQ(r.FamilyOf("unknown"), nullptr);
  EXPECT_EQ(r.FamilyOf("temperature_delta")->help, "");
}

TEST(PromTextTest, ParsesPrometheusOwnMetricsPage) {
  ParseResult r = ParsePromText(kPrometheusPage);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.Count("go_gc_duration_seconds"), 5u);
  EXPECT_EQ(r.Value("go_gc_duration_seconds", {{"quantile", "0.5"}}), 0.000229211);
  EXPECT_EQ(r.Value("go_memstats_alloc_bytes_total"), 1.3203216e+07);
  EXPECT_EQ(r.Sum("net_conntrack_dialer_conn_failed_total", {{"dialer_name", "default"}}), 2.0);
  EXPECT_EQ(r.Count("prometheus_engine_query_duration_seconds", {{"slice", "inner_eval"}}), 3u);
  EXPECT_EQ(r.Count("prometheus_http_request_duration_seconds_bucket", {{"handler", "/-/ready"}}),
            10u);
  EXPECT_EQ(r.Value("prometheus_http_response_size_bytes_bucket", {{"le", "1e+06"}}), 1.0);
  EXPECT_EQ(r.FamilyOf("go_gc_duration_seconds_sum")->type, MetricType::kSummary);
}

TEST(PromTextTest, EmptyLabelValueInSubsetMatchesAnAbsentLabel) {
  ParseResult r = ParsePromText("x 1\nx{a=\"\"} 2\nx{a=\"b\"} 4\n");
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.Sum("x", {{"a", ""}}), 3.0);
  EXPECT_EQ(r.Sum("x", {{"a", "b"}}), 4.0);
  EXPECT_EQ(r.Sum("x"), 7.0);
  EXPECT_EQ(r.Value("x"), 1.0);  // the first in page order
}

TEST(PromTextTest, ToleratesCrlfBlanksAndMissingFinalNewline) {
  ParseResult r = ParsePromText(
      "# TYPE x gauge\r\n\r\n  x { a = \"1\" , b=\"2\" , } 5 \r\n\tx{a=\"2\"}6\t100\r\ny 7");
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.Value("x", {{"a", "1"}, {"b", "2"}}), 5.0);
  EXPECT_EQ(r.Series("x", {{"a", "2"}})[0]->timestamp_ms, 100);
  EXPECT_EQ(r.Value("y"), 7.0);
  EXPECT_EQ(r.lines, 5u);
}

TEST(PromTextTest, ParsesFloatSpellings) {
  struct Case {
    const char* text;
    std::optional<double> want;
  };
  const Case cases[] = {
      {"0", 0.0},
      {"-0.5", -0.5},
      {"+3", 3.0},
      {"1e3", 1000.0},
      {"1.5E-3", 0.0015},
      {".5", 0.5},
      {"7.", 7.0},
      {"+Inf", INFINITY},
      {"-Inf", -INFINITY},
      {"inf", INFINITY},
      {"1e-400", 0.0},
      {"1e400", std::nullopt},
      {"", std::nullopt},
      {"1.2.3", std::nullopt},
      {"abc", std::nullopt},
      {"--1", std::nullopt},
      {"1e", std::nullopt},
      {"0x10", std::nullopt},
      {"nan(1)", std::nullopt},
      {"1_000", std::nullopt},
      {"1 ", std::nullopt},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(ParsePromFloat(c.text), c.want) << "\"" << c.text << "\"";
  }
  EXPECT_TRUE(std::isnan(*ParsePromFloat("NaN")));
  EXPECT_TRUE(std::isnan(*ParsePromFloat("nan")));
}

TEST(PromTextTest, SkipsMalformedLinesAndKeepsTheGoodOnesAround) {
  const std::string bad_lines[] = {
      "x{a=\"b} 1",            // unterminated label value
      "x{a=\"b\"",             // unterminated label set
      "x{a=\"b\" 1",           // no closing brace
      "x",                     // missing value
      "x{a=\"b\"}",            // missing value after labels
      "x 1.2.3",               // bad number
      "x abc",                 // bad number
      "x 1e400",               // out of range
      "x 1 notatime",          // bad timestamp
      "x 1 2.5",               // fractional timestamp
      "x 1 123 extra",         // trailing text
      "{a=\"b\"} 1",           // no metric name
      "9x 1",                  // name starts with a digit
      "x-y 1",                 // invalid character in the name
      "x{a=b} 1",              // unquoted label value
      "x{1a=\"b\"} 1",         // bad label name
      "x{a=\"\\q\"} 1",        // invalid escape
      "x{a=\"1\",a=\"2\"} 1",  // duplicate label
      "x{a=\"b\"}} 1",         // stray brace
      "x{,} 1",                // comma without a label
      "x{a=\"b\",,} 1",        // double comma
      "# TYPE x flavour",      // unknown type
      "# TYPE 9x gauge",       // bad name in TYPE
      "# TYPE",                // TYPE without a name
      "# TYPE good gauge extra",
      "\x01\xff\xfe garbage",
      std::string("x\0 1", 4),
  };
  for (const auto& bad : bad_lines) {
    std::string page = "good 1\n" + bad + "\ngood{b=\"2\"} 2\n";
    ParseResult r = ParsePromText(page);
    EXPECT_EQ(r.bad_lines, 1u) << bad;
    ASSERT_TRUE(r.first_error) << bad;
    EXPECT_EQ(r.first_error->line, 2u) << bad;
    EXPECT_FALSE(r.first_error->reason.empty()) << bad;
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_FALSE(r.truncated) << bad;
    EXPECT_EQ(r.Sum("good"), 3.0) << bad;
    EXPECT_EQ(r.Count("x"), 0u) << bad;
  }
}

TEST(PromTextTest, KeepsFirstErrorAndCountsEveryBadLine) {
  ParseResult r = ParsePromText("a 1\nb\nc 3\nd{ 4\ne 5\n");
  EXPECT_EQ(r.bad_lines, 2u);
  ASSERT_TRUE(r.first_error);
  EXPECT_EQ(r.first_error->line, 2u);
  EXPECT_EQ(r.first_error->reason, "missing value");
  EXPECT_EQ(r.samples.size(), 3u);
}

TEST(PromTextTest, RejectsHistogramBucketWithoutFloatLe) {
  ParseResult r = ParsePromText(
      "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket 2\nh_bucket{le=\"big\"} 3\n"
      "h_bucket{le=\"+Inf\"} 4\nh_sum 1\nh_count 4\n"
      "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns 2\ns_sum 3\n");
  EXPECT_EQ(r.bad_lines, 3u);
  EXPECT_EQ(r.first_error->line, 3u);
  EXPECT_EQ(r.Count("h_bucket"), 2u);
  EXPECT_EQ(r.Count("s"), 1u);
  EXPECT_EQ(r.Value("h_count"), 4.0);
  EXPECT_EQ(r.Value("s_sum"), 3.0);
}

TEST(PromTextTest, RejectsSecondTypeOrHelpForAFamily) {
  ParseResult r = ParsePromText("# TYPE x gauge\n# TYPE x counter\n# HELP x a\n# HELP x b\nx 1\n");
  EXPECT_EQ(r.bad_lines, 2u);
  EXPECT_EQ(r.FamilyOf("x")->type, MetricType::kGauge);
  EXPECT_EQ(r.FamilyOf("x")->help, "a");
  EXPECT_EQ(r.Value("x"), 1.0);
}

TEST(PromTextTest, RefusesInputOverTheByteLimitUnread) {
  ParseLimits limits;
  limits.max_input_bytes = 10;
  ParseResult r = ParsePromText("a 1\nb 2\nc 3\n", limits);
  EXPECT_TRUE(r.truncated);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.samples.empty());
  ASSERT_TRUE(r.first_error);
  EXPECT_EQ(r.first_error->line, 0u);
  EXPECT_TRUE(ParsePromText("a 1\nb 2\n", limits).ok());  // exactly 8 bytes
}

TEST(PromTextTest, StopsAtTheSampleLimit) {
  ParseLimits limits;
  limits.max_samples = 2;
  ParseResult r = ParsePromText("a 1\nb 2\nc 3\nd 4\n", limits);
  EXPECT_TRUE(r.truncated);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.first_error->line, 3u);
  EXPECT_FALSE(r.Value("c"));
}

TEST(PromTextTest, EnforcesLabelCountAndLengthLimits) {
  ParseLimits limits;
  limits.max_labels = 2;
  limits.max_name_bytes = 8;
  limits.max_label_value_bytes = 4;
  const std::string bad_lines[] = {
      "x{a=\"1\",b=\"2\",c=\"3\"} 1",  // three labels
      "abcdefghi 1",                   // metric name of 9 bytes
      "x{abcdefghi=\"1\"} 1",          // label name of 9 bytes
      "x{a=\"12345\"} 1",              // label value of 5 bytes
      "x{a=\"12\\n45\"} 1",            // 5 bytes once unescaped
      "# TYPE abcdefghi gauge",
  };
  for (const auto& bad : bad_lines) {
    ParseResult r =
        ParsePromText(bad + "\nok{a=\"1\",b=\"2\"} 1\nabcdefgh{a=\"1234\"} 2\n", limits);
    EXPECT_EQ(r.bad_lines, 1u) << bad;
    EXPECT_EQ(r.samples.size(), 2u) << bad;
  }
}

// Random bytes and random damage to real pages: the parser must neither
// throw nor crash, and what it reports must be self-consistent.
TEST(PromTextTest, NeverThrowsOnDamagedOrRandomInput) {
  std::mt19937 rng(12345);
  const std::string alphabet = "abc_:{}=\",\\n#\t \r\n0123456789.+-eEINaf";
  const std::string base = std::string(kFleetPage) + std::string(kPrometheusPage);
  for (int round = 0; round < 3000; ++round) {
    std::string input;
    if (round % 3 == 0) {
      input.resize(rng() % 300);
      for (auto& ch : input) ch = static_cast<char>(rng());
    } else if (round % 3 == 1) {
      input.resize(rng() % 300);
      for (auto& ch : input) ch = alphabet[rng() % alphabet.size()];
    } else {
      input = base.substr(0, rng() % (base.size() + 1));
      for (int i = 0; i < 8 && !input.empty(); ++i) {
        input[rng() % input.size()] = alphabet[rng() % alphabet.size()];
      }
    }
    ParseResult r;
    ASSERT_NO_THROW(r = ParsePromText(input)) << round;
    EXPECT_LE(r.samples.size() + r.bad_lines, r.lines) << round;
    std::size_t indexed = 0;
    for (const auto& [name, ids] : r.index) {
      for (std::size_t id : ids) {
        ASSERT_LT(id, r.samples.size());
        EXPECT_EQ(r.samples[id].name, name);
      }
      indexed += ids.size();
    }
    EXPECT_EQ(indexed, r.samples.size()) << round;
  }
}

std::string ThousandWorkerPage() {
  std::string page =
      "# HELP fleet_queue_depth Batches waiting for a worker.\n"
      "# TYPE fleet_queue_depth gauge\nfleet_queue_depth{queue=\"default\"} 250\n"
      "# TYPE fleet_worker_idle_seconds gauge\n";
  for (int w = 0; w < 1000; ++w) {
    page += "fleet_worker_idle_seconds{worker=\"worker-" + std::to_string(w) + "\"} " +
            std::to_string(w % 7 == 0 ? 0.0 : w * 0.25) + "\n";
  }
  page += "# TYPE fleet_worker_batches_total counter\n";
  for (int w = 0; w < 1000; ++w) {
    for (const char* outcome : {"ok", "failed"}) {
      page += "fleet_worker_batches_total{worker=\"worker-" + std::to_string(w) + "\",outcome=\"" +
              outcome + "\"} " + std::to_string(w) + "\n";
    }
  }
  page += "# TYPE fleet_worker_batch_seconds histogram\n";
  for (int w = 0; w < 1000; ++w) {
    std::string worker = "worker=\"worker-" + std::to_string(w) + "\"";
    for (const char* le : {"0.01", "0.1", "1", "10", "+Inf"}) {
      page += "fleet_worker_batch_seconds_bucket{" + worker + ",le=\"" + le + "\"} 5\n";
    }
    page += "fleet_worker_batch_seconds_sum{" + worker + "} 1.25\n";
    page += "fleet_worker_batch_seconds_count{" + worker + "} 5\n";
  }
  return page;
}

TEST(PromTextTest, ParsesAThousandWorkerPage) {
  const std::string page = ThousandWorkerPage();
  auto start = std::chrono::steady_clock::now();
  ParseResult r = ParsePromText(page);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.samples.size(), 1u + 1000u + 2000u + 7000u);
  EXPECT_EQ(r.Count("fleet_worker_idle_seconds"), 1000u);
  EXPECT_EQ(r.Value("fleet_worker_idle_seconds", {{"worker", "worker-999"}}), 249.75);
  EXPECT_EQ(r.Sum("fleet_worker_batches_total", {{"outcome", "failed"}}), 999.0 * 1000 / 2);
  EXPECT_EQ(r.Sum("fleet_worker_batch_seconds_count"), 5000.0);
  EXPECT_EQ(r.Value("fleet_queue_depth", {{"queue", "default"}}), 250.0);
  // Reported, not asserted: timing depends on the machine.
  std::cout << "[ info     ] " << page.size() << " bytes, " << r.samples.size()
            << " samples parsed in "
            << std::chrono::duration_cast<std::chrono::microseconds>(took).count() << " us\n";
}

}  // namespace
}  // namespace fleet::prom

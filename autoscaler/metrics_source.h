// MetricsSource: where the autoscaler reads the broker's state each poll.
//  - ScrapeSource: GET the broker's /metrics and parse the text format.
//  - PrometheusSource: PromQL instant queries against a Prometheus server
//    (as deployed with compose); staleness from timestamp() of the scrape.
// A read that fails, times out or is older than max_staleness comes back
// with fresh == false: the policy then freezes scale-down. Either source
// sends HTTP basic auth when given credentials (--metrics-source-auth-file):
// a broker's /metrics or a Prometheus server may sit behind it.
//
// `timeout` (--metrics-timeout) is ONE deadline for the whole read: the
// Prometheus source's several queries share it (each gets what is left), so
// a slow server costs a read at most `timeout`, not `timeout` per query.
// A read that runs into it comes back with timed_out set.
//
// Not thread-safe; blocking (bounded by the timeout, real time). The
// autoscaler runs reads on a MetricsReader's thread, off its loop.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "autoscaler/pool.h"
#include "common/basic_auth.h"
#include "common/http_client.h"
#include "common/prom_api.h"
#include "common/prom_text.h"

namespace fleet::autoscaler {

// One read's outcome.
struct MetricsRead {
  Observation obs;    // obs.fresh false when the read is unusable
  std::string error;  // why, when obs.fresh is false
  bool timed_out = false;  // the read ran into its deadline (--metrics-timeout)
};

class MetricsSource {
 public:
  virtual ~MetricsSource() = default;
  // Reads one observation within the source's deadline. Never throws on
  // network or data errors: they come back in the result.
  virtual MetricsRead Read() = 0;
  // For logs. Immutable after construction, so any thread may call it.
  virtual std::string Describe() const = 0;
};

// Builds an Observation from a parsed broker /metrics page. fresh is true
// when the page has the broker's core series and its refresh time
// (fleet_metrics_updated_timestamp_seconds, wall clock) is within
// `max_staleness` of `wall_now` (seconds since the epoch); a page without
// that series is judged by the core series alone. On a stale page `error`
// says how old it is.
Observation ObservationFromPage(const prom::ParseResult& page, double wall_now = 0,
                                std::chrono::milliseconds max_staleness = {},
                                std::string* error = nullptr);

class ScrapeSource : public MetricsSource {
 public:
  ScrapeSource(std::string url, std::chrono::milliseconds timeout,
               std::chrono::milliseconds max_staleness = std::chrono::milliseconds(10000),
               const std::optional<BasicAuth>& auth = std::nullopt);
  MetricsRead Read() override;
  std::string Describe() const override { return url_; }

 private:
  std::string url_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds max_staleness_;
  http::HttpOptions request_;  // basic auth, when given
  http::HttpClient http_;
};

class PrometheusSource : public MetricsSource {
 public:
  // `base`: http://host:9090. `max_staleness`: an answer whose newest
  // broker scrape is older than this is not fresh.
  PrometheusSource(std::string base, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds max_staleness,
                   const std::optional<BasicAuth>& auth = std::nullopt);
  MetricsRead Read() override;
  std::string Describe() const override { return "prometheus:" + base_; }

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  // Runs one query with what is left until `deadline`; false with
  // out->error (and out->timed_out) set on failure.
  bool Query(const std::string& promql, Deadline deadline, prom::QueryResult* result,
             MetricsRead* out);

  std::string base_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds max_staleness_;
  http::HttpOptions request_;  // basic auth, when given
  http::HttpClient http_;
};

// "prometheus:http://host:9090" -> PrometheusSource, "http://..." ->
// ScrapeSource, either sending `auth` when set. Throws
// std::invalid_argument on anything else.
std::unique_ptr<MetricsSource> MakeMetricsSource(
    const std::string& spec, std::chrono::milliseconds timeout,
    std::chrono::milliseconds max_staleness,
    const std::optional<BasicAuth>& auth = std::nullopt);

}  // namespace fleet::autoscaler

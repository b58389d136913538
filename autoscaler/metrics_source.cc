#include "autoscaler/metrics_source.h"

#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>

#include "common/prom_api.h"

namespace fleet::autoscaler {
namespace {

BrokerWorkerState StateFrom(double held, double retiring) {
  if (retiring > 0.5) return BrokerWorkerState::kRetiring;
  return held > 0 ? BrokerWorkerState::kBusy : BrokerWorkerState::kIdle;
}

http::HttpOptions WithAuth(const std::optional<BasicAuth>& auth) {
  http::HttpOptions options;
  if (auth) {
    options.username = auth->username;
    options.password = auth->password;
  }
  return options;
}

// Why a complete response was refused, with a hint for the one status an
// operator can fix here.
std::string StatusError(long status) {
  std::string e = "HTTP status " + std::to_string(status);
  if (status == 401 || status == 403) e += " (check --metrics-source-auth-file)";
  return e;
}

using SteadyTime = std::chrono::steady_clock::time_point;

// Whether a failed request ran into `deadline` (rather than being refused,
// cut short, ...). curl stops a request at its timeout, which is what was
// left until the deadline, so the deadline has passed by then.
bool RanIntoDeadline(const http::HttpResponse& r, SteadyTime deadline) {
  return !r.error.empty() && std::chrono::steady_clock::now() >= deadline;
}

std::string TimeoutError(std::chrono::milliseconds timeout) {
  return "no complete answer within " + std::to_string(timeout.count()) +
         " ms (--metrics-timeout)";
}

}  // namespace

static double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Observation ObservationFromPage(const prom::ParseResult& page, double wall_now,
                                std::chrono::milliseconds max_staleness, std::string* error) {
  Observation obs;
  auto inflight = page.Value("fleet_batches_inflight");
  obs.fresh = inflight.has_value() && page.Count("fleet_workers") > 0;
  if (!obs.fresh) return obs;
  auto updated = page.Value("fleet_metrics_updated_timestamp_seconds");
  if (updated && max_staleness.count() > 0 &&
      (wall_now - *updated) * 1000 > static_cast<double>(max_staleness.count())) {
    if (error != nullptr) {
      *error = "broker metrics last refreshed " +
               std::to_string(static_cast<long>(wall_now - *updated)) +
               " s ago (is its loop stuck?)";
    }
    obs.fresh = false;
    return obs;
  }
  obs.inflight = *inflight;
  obs.queued = page.Sum("fleet_queue_depth");
  std::map<std::string, double> held, retiring;
  for (const prom::Sample* s : page.Series("fleet_worker_held_batches")) {
    if (auto w = prom::LabelValue(s->labels, "worker")) held[std::string(*w)] = s->value;
  }
  for (const prom::Sample* s : page.Series("fleet_worker_retiring")) {
    if (auto w = prom::LabelValue(s->labels, "worker")) retiring[std::string(*w)] = s->value;
  }
  for (const prom::Sample* s : page.Series("fleet_worker_idle_seconds")) {
    auto w = prom::LabelValue(s->labels, "worker");
    if (!w) continue;
    std::string id(*w);
    obs.workers.push_back({id, StateFrom(held[id], retiring[id]), s->value});
  }
  obs.submitted_total = page.Value("fleet_batches_submitted_total").value_or(kUnknown);
  obs.completed_total = page.Count("fleet_batches_completed_total") > 0
                            ? page.Sum("fleet_batches_completed_total")
                            : kUnknown;
  obs.processing_seconds_sum = page.Value("fleet_batch_processing_seconds_sum").value_or(kUnknown);
  obs.processing_seconds_count =
      page.Value("fleet_batch_processing_seconds_count").value_or(kUnknown);
  return obs;
}

ScrapeSource::ScrapeSource(std::string url, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds max_staleness,
                           const std::optional<BasicAuth>& auth)
    : url_(std::move(url)),
      timeout_(timeout),
      max_staleness_(max_staleness),
      request_(WithAuth(auth)) {}

MetricsRead ScrapeSource::Read() {
  MetricsRead out;
  const SteadyTime deadline = std::chrono::steady_clock::now() + timeout_;
  http::HttpResponse r = http_.Get(url_, timeout_, request_);
  if (!r.ok()) {
    out.timed_out = RanIntoDeadline(r, deadline);
    out.error = out.timed_out ? TimeoutError(timeout_) + ": " + r.error
                              : (r.error.empty() ? StatusError(r.status) : r.error);
    return out;
  }
  prom::ParseResult page = prom::ParsePromText(r.body);
  out.obs = ObservationFromPage(page, WallNow(), max_staleness_, &out.error);
  if (!out.obs.fresh && out.error.empty()) {
    out.error = "the page has no fleet broker metrics (fleet_batches_inflight, fleet_workers)";
  }
  return out;
}

PrometheusSource::PrometheusSource(std::string base, std::chrono::milliseconds timeout,
                                   std::chrono::milliseconds max_staleness,
                                   const std::optional<BasicAuth>& auth)
    : base_(std::move(base)),
      timeout_(timeout),
      max_staleness_(max_staleness),
      request_(WithAuth(auth)) {}

bool PrometheusSource::Query(const std::string& promql, Deadline deadline,
                             prom::QueryResult* result, MetricsRead* out) {
  // What is left of the read's one deadline, rounded up so that a request
  // is never given 0 ms (HttpClient would take that as 1 ms anyway).
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) {
    out->timed_out = true;
    out->error = TimeoutError(timeout_) + " (before query " + promql + ")";
    return false;
  }
  http::HttpResponse r = http_.Get(prom::QueryUrl(base_, promql), left, request_);
  if (!r.error.empty()) {
    out->timed_out = RanIntoDeadline(r, deadline);
    out->error = (out->timed_out ? TimeoutError(timeout_) + ": " : std::string()) + "query " +
                 promql + ": " + r.error;
    return false;
  }
  // Prometheus answers a bad query with 400 and a JSON error, which the
  // reader below reports; an auth failure has no JSON to read.
  if (r.status == 401 || r.status == 403) {
    out->error = "query " + promql + ": " + StatusError(r.status);
    return false;
  }
  *result = prom::ParseQueryResponse(r.body);
  if (!result->ok()) {
    out->error = "query " + promql + ": " + result->error_type + ": " + result->error;
    return false;
  }
  return true;
}

MetricsRead PrometheusSource::Read() {
  MetricsRead out;
  Observation& obs = out.obs;
  // One deadline for every query of this read. Rejected: the timeout per
  // query, which let a slow server hold a read for ten times the timeout.
  const Deadline deadline = std::chrono::steady_clock::now() + timeout_;
  prom::QueryResult q;
  // When did Prometheus last scrape the broker? Older than max_staleness:
  // the numbers describe a past that must not drive a scale-down.
  if (!Query("max(timestamp(fleet_batches_inflight))", deadline, &q, &out)) return out;
  if (q.samples.empty() || !std::isfinite(q.samples[0].value)) {
    out.error = "Prometheus has no fleet_batches_inflight series (is it scraping the broker?)";
    return out;
  }
  double age = WallNow() - q.samples[0].value;
  if (age * 1000 > static_cast<double>(max_staleness_.count())) {
    out.error = "broker metrics in Prometheus are " + std::to_string(static_cast<int>(age)) +
                " s old";
    return out;
  }
  auto scalar = [&](const std::string& promql, double* v) {
    prom::QueryResult r;
    if (!Query(promql, deadline, &r, &out)) return false;
    *v = r.samples.empty() ? 0 : r.samples[0].value;
    return true;
  };
  auto per_worker = [&](const std::string& metric, std::map<std::string, double>* into) {
    prom::QueryResult r;
    if (!Query(metric, deadline, &r, &out)) return false;
    for (const auto& s : r.samples) {
      auto it = s.labels.find("worker");
      if (it != s.labels.end()) (*into)[it->second] = s.value;
    }
    return true;
  };
  std::map<std::string, double> idle, held, retiring;
  if (!scalar("sum(fleet_queue_depth)", &obs.queued) ||
      !scalar("sum(fleet_batches_inflight)", &obs.inflight) ||
      !per_worker("fleet_worker_idle_seconds", &idle) ||
      !per_worker("fleet_worker_held_batches", &held) ||
      !per_worker("fleet_worker_retiring", &retiring) ||
      !scalar("sum(fleet_batches_submitted_total)", &obs.submitted_total) ||
      !scalar("sum(fleet_batches_completed_total)", &obs.completed_total) ||
      !scalar("sum(fleet_batch_processing_seconds_sum)", &obs.processing_seconds_sum) ||
      !scalar("sum(fleet_batch_processing_seconds_count)", &obs.processing_seconds_count)) {
    out.obs = Observation{};  // a partial read changes nothing
    return out;
  }
  for (const auto& [id, secs] : idle) {
    obs.workers.push_back({id, StateFrom(held[id], retiring[id]), secs});
  }
  obs.fresh = true;
  return out;
}

std::unique_ptr<MetricsSource> MakeMetricsSource(const std::string& spec,
                                                 std::chrono::milliseconds timeout,
                                                 std::chrono::milliseconds max_staleness,
                                                 const std::optional<BasicAuth>& auth) {
  const std::string prefix = "prometheus:";
  if (spec.rfind(prefix, 0) == 0) {
    return std::make_unique<PrometheusSource>(spec.substr(prefix.size()), timeout,
                                              max_staleness, auth);
  }
  if (spec.rfind("http://", 0) == 0 || spec.rfind("https://", 0) == 0) {
    return std::make_unique<ScrapeSource>(spec, timeout, max_staleness, auth);
  }
  throw std::invalid_argument("--metrics-source must be http://HOST:PORT/metrics or "
                              "prometheus:http://HOST:9090, not '" + spec + "'");
}

}  // namespace fleet::autoscaler

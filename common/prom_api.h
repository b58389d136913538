// Reads answers of the Prometheus HTTP API's instant query
// (GET /api/v1/query?query=...), for an autoscaler that reads its metrics
// from a Prometheus server rather than scraping the broker itself.
//
// The JSON comes from the network: parsing never throws, bounds the input
// size and nesting, and reports anything unexpected as an error value.
// Thread-safe: free functions without shared state.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace fleet::prom {

struct QuerySample {
  std::map<std::string, std::string> labels;  // the series' labels ("__name__" if given)
  double value = 0;                           // NaN and +-Inf as sent
  double timestamp = 0;                       // seconds since the epoch
};

struct QueryResult {
  std::string result_type;           // "vector" or "scalar" on success
  std::vector<QuerySample> samples;  // a scalar is one sample without labels
  std::vector<std::string> warnings;
  // Empty on success. For a Prometheus error ("status":"error") error_type is
  // its errorType (e.g. "bad_data") and error its text; for a reply we cannot
  // read, error_type is "client" and error says why.
  std::string error_type;
  std::string error;

  bool ok() const { return error.empty(); }
};

struct QueryLimits {
  std::size_t max_bytes = 16u << 20;  // whole response
  std::size_t max_samples = 1'000'000;
  std::size_t max_depth = 32;  // nesting of arrays and objects; the API needs 5
};

// Parses one /api/v1/query response body (whatever the HTTP status: an error
// comes with 400/422/503 and a JSON body). Result types "matrix" and "string"
// are reported as errors. Never throws.
QueryResult ParseQueryResponse(std::string_view json, const QueryLimits& limits = {});

// The instant-query URL for `promql` on the server at `base`
// (e.g. "http://prometheus:9090", with or without a trailing slash or a path
// prefix): base + "/api/v1/query?query=" + the percent-encoded query.
std::string QueryUrl(std::string_view base, std::string_view promql);

}  // namespace fleet::prom

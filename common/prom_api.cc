#include "common/prom_api.h"

#include <exception>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/http_client.h"
#include "common/prom_text.h"

// nlohmann::json is parsed with allow_exceptions = false and then walked
// with explicit type checks, so a well-formed but unexpected document is an
// error value rather than a type_error; the whole call is still wrapped in a
// catch for bad_alloc. Before parsing, one cheap pass bounds the nesting
// depth, so a hostile "[[[[..." never builds a deep tree. Rejected: the
// exception-based json::at()/get<>() style, which turns every missing field
// into a throw-and-catch on the poll path.

namespace fleet::prom {
namespace {

using nlohmann::json;

// Maximum nesting of arrays/objects, skipping string contents.
std::size_t NestingDepth(std::string_view s) {
  std::size_t depth = 0, max_depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) max_depth = depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max_depth;
}

QueryResult Fail(std::string reason) {
  QueryResult r;
  r.error_type = "client";
  r.error = std::move(reason);
  return r;
}

// [ <unix time as a number>, "<value as a string>" ]
std::optional<QuerySample> ReadPoint(const json& point) {
  if (!point.is_array() || point.size() != 2 || !point[0].is_number()) return std::nullopt;
  QuerySample s;
  s.timestamp = point[0].get<double>();
  if (point[1].is_string()) {
    auto v = ParsePromFloat(point[1].get_ref<const std::string&>());
    if (!v) return std::nullopt;
    s.value = *v;
  } else if (point[1].is_number()) {  // not what Prometheus sends; harmless
    s.value = point[1].get<double>();
  } else {
    return std::nullopt;
  }
  return s;
}

QueryResult Parse(std::string_view text, const QueryLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return Fail("response is " + std::to_string(text.size()) + " bytes, over the limit of " +
                std::to_string(limits.max_bytes));
  }
  if (NestingDepth(text) > limits.max_depth) {
    return Fail("response nested deeper than " + std::to_string(limits.max_depth));
  }
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Fail("response is not valid JSON");
  if (!doc.is_object()) return Fail("response is not a JSON object");

  QueryResult r;
  if (auto w = doc.find("warnings"); w != doc.end() && w->is_array()) {
    for (const auto& item : *w) {
      if (item.is_string()) r.warnings.push_back(item.get<std::string>());
    }
  }
  auto status = doc.find("status");
  if (status == doc.end() || !status->is_string()) return Fail("response has no status");
  if (*status == "error") {
    auto type = doc.find("errorType");
    auto error = doc.find("error");
    // An error always has a type for the caller to log, even when the
    // server sent none, a non-string or an empty one.
    if (type != doc.end() && type->is_string()) r.error_type = type->get<std::string>();
    if (r.error_type.empty()) r.error_type = "unknown";
    r.error = error != doc.end() && error->is_string() ? error->get<std::string>() : "";
    if (r.error.empty()) r.error = "Prometheus returned an error without a message";
    return r;
  }
  if (*status != "success") return Fail("unknown status " + status->dump());

  auto data = doc.find("data");
  if (data == doc.end() || !data->is_object()) return Fail("response has no data object");
  auto type = data->find("resultType");
  auto result = data->find("result");
  if (type == data->end() || !type->is_string() || result == data->end()) {
    return Fail("data has no resultType or result");
  }
  r.result_type = type->get<std::string>();

  if (r.result_type == "scalar") {
    auto point = ReadPoint(*result);
    if (!point) return Fail("malformed scalar result");
    r.samples.push_back(std::move(*point));
    return r;
  }
  if (r.result_type != "vector") return Fail("unsupported resultType " + r.result_type);
  if (!result->is_array()) return Fail("vector result is not an array");
  if (result->size() > limits.max_samples) {
    return Fail("more than " + std::to_string(limits.max_samples) + " samples");
  }
  r.samples.reserve(result->size());
  for (const auto& item : *result) {
    if (!item.is_object()) return Fail("vector element is not an object");
    auto value = item.find("value");
    if (value == item.end()) return Fail("vector element has no value");
    auto point = ReadPoint(*value);
    if (!point) return Fail("malformed value in vector element");
    if (auto metric = item.find("metric"); metric != item.end()) {
      if (!metric->is_object()) return Fail("metric is not an object");
      for (const auto& [k, v] : metric->items()) {
        if (!v.is_string()) return Fail("label " + k + " is not a string");
        point->labels.emplace(k, v.get<std::string>());
      }
    }
    r.samples.push_back(std::move(*point));
  }
  return r;
}

}  // namespace

QueryResult ParseQueryResponse(std::string_view json_text, const QueryLimits& limits) {
  try {
    return Parse(json_text, limits);
  } catch (const std::exception& e) {
    try {
      return Fail(std::string("cannot read response: ") + e.what());
    } catch (...) {
      QueryResult r;  // both strings fit the small-string buffer: no allocation
      r.error_type = "client";
      r.error = "out of memory";
      return r;
    }
  }
}

std::string QueryUrl(std::string_view base, std::string_view promql) {
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  std::string url(base);
  url += "/api/v1/query?query=";
  url += http::UrlEncode(promql);
  return url;
}

}  // namespace fleet::prom

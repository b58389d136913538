// Parses the Prometheus text exposition format, version 0.0.4 (what a
// /metrics endpoint serves), into samples plus per-family TYPE/HELP metadata.
//
// The input comes from the network, so the parser is defensive: it never
// throws, bounds everything a peer controls (ParseLimits), and treats a bad
// line as a value: the line is skipped and counted, the first error is kept
// with its line number, and the good lines around it still count.
//
// Thread-safe: ParsePromText is a pure function; a ParseResult is a value
// whose const methods may be called from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/string_map.h"

namespace fleet::prom {

// Label pairs in the order the page gave them.
using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  std::string name;  // the series name as written, e.g. "x_bucket"
  Labels labels;
  double value = 0;
  std::optional<std::int64_t> timestamp_ms;
};

enum class MetricType { kUntyped, kCounter, kGauge, kHistogram, kSummary };

// What "# TYPE" and "# HELP" said about a family (a histogram "x" owns the
// series x_bucket, x_sum and x_count; a summary "x" owns x, x_sum, x_count).
struct FamilyInfo {
  MetricType type = MetricType::kUntyped;
  std::string help;  // unescaped ("\\" and "\n")
};

// Bounds on one page; past them the parser stops allocating.
struct ParseLimits {
  std::size_t max_input_bytes = 16u << 20;   // whole page; larger is rejected unread
  std::size_t max_samples = 1'000'000;       // parsing stops at this many samples
  std::size_t max_labels = 64;               // label pairs per sample
  std::size_t max_name_bytes = 1024;         // metric and label names
  std::size_t max_label_value_bytes = 1024;  // one label value, unescaped
  std::size_t max_help_bytes = 64u << 10;    // one HELP text
};

struct ParseError {
  std::size_t line = 0;  // 1-based; 0 for the whole input
  std::string reason;
};

// The result of parsing one page. Queries match a sample when its name is
// equal and every (label, value) pair of `subset` is among its labels; as in
// PromQL, a pair with an empty value also matches a sample without that label.
struct ParseResult {
  std::vector<Sample> samples;     // in page order
  StringMap<FamilyInfo> families;  // by family name, from TYPE/HELP lines
  std::size_t lines = 0;           // lines read
  std::size_t bad_lines = 0;       // lines skipped as malformed
  bool truncated = false;          // a limit stopped parsing (see first_error)
  std::optional<ParseError> first_error;

  // True when every line parsed and no limit was hit.
  bool ok() const { return bad_lines == 0 && !truncated; }

  // The value of the first sample (in page order) named `name` whose labels
  // include `subset`; empty if there is none.
  std::optional<double> Value(std::string_view name, const Labels& subset = {}) const;

  // The sum over every sample named `name` whose labels include `subset`;
  // 0 if there is none.
  double Sum(std::string_view name, const Labels& subset = {}) const;

  // How many samples named `name` have labels including `subset`.
  std::size_t Count(std::string_view name, const Labels& subset = {}) const;

  // The samples named `name` whose labels include `subset`, in page order.
  // The pointers borrow from `samples` and live as long as this result.
  std::vector<const Sample*> Series(std::string_view name, const Labels& subset = {}) const;

  // The family a series name belongs to: `name` itself if a TYPE/HELP line
  // named it, else `name` minus _bucket/_sum/_count when that is a histogram
  // or summary family. Null if no metadata names it.
  const FamilyInfo* FamilyOf(std::string_view series_name) const;

  // Sample indices by series name, built by ParsePromText. Kept as indices
  // (not pointers) so a ParseResult can be copied and moved freely.
  StringMap<std::vector<std::size_t>> index;
};

// Parses `text`. Never throws (an allocation failure ends parsing with
// truncated = true). Accepts LF or CRLF line ends.
ParseResult ParsePromText(std::string_view text, const ParseLimits& limits = {});

// Parses one sample value as Prometheus writes it: a decimal or exponent
// float, "NaN", "+Inf"/"Inf"/"-Inf" (case-insensitive). Empty on anything
// else, including out-of-range numbers and trailing characters.
std::optional<double> ParsePromFloat(std::string_view text);

// The label's value in `labels`, or empty if absent.
std::optional<std::string_view> LabelValue(const Labels& labels, std::string_view name);

}  // namespace fleet::prom

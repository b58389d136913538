#include "common/prom_text.h"

#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <system_error>

// One pass over the page, one line at a time, with a cursor per line. Each
// line is parsed completely into a scratch Sample before anything is
// committed, so a bad line leaves no trace but a count and (if first) a
// reason. Rejected alternative: a regex per line is several times slower on a
// 1000-worker page and cannot bound label counts or lengths as it goes.
//
// The grammar follows Prometheus' own text parser (expfmt): blanks are space
// and tab, leading blanks are skipped, blanks may surround '{', '=', ',' and
// '}', a trailing comma before '}' is allowed, label values escape only \\,
// \" and \n, and a histogram bucket needs a float "le" label (a summary
// quantile a float "quantile" label). It is stricter in one place: a metric
// name must be followed by a blank or '{' (expfmt reads "x-1" as x = -1).

namespace fleet::prom {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t'; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsMetricNameStart(char c) { return IsAlpha(c) || c == '_' || c == ':'; }
bool IsMetricNameChar(char c) { return IsMetricNameStart(c) || IsDigit(c); }
bool IsLabelNameStart(char c) { return IsAlpha(c) || c == '_'; }
bool IsLabelNameChar(char c) { return IsLabelNameStart(c) || IsDigit(c); }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A cursor over one line (without its line end). Errors are returned as
// reasons; the happy path builds no strings but the sample's own.
class LineCursor {
 public:
  explicit LineCursor(std::string_view line) : s_(line) {}

  bool AtEnd() const { return i_ >= s_.size(); }
  char Peek() const { return s_[i_]; }
  void Advance() { ++i_; }
  void SkipBlanks() {
    while (i_ < s_.size() && IsBlank(s_[i_])) ++i_;
  }
  // Reads up to the next blank or the end.
  std::string_view Token() {
    std::size_t start = i_;
    while (i_ < s_.size() && !IsBlank(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }
  template <typename Pred>
  std::string_view While(Pred pred) {
    std::size_t start = i_;
    while (i_ < s_.size() && pred(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }
  std::string_view Rest() const { return s_.substr(i_); }

 private:
  std::string_view s_;
  std::size_t i_ = 0;
};

std::string TooLong(const char* what, std::size_t limit) {
  return std::string(what) + " longer than " + std::to_string(limit) + " bytes";
}

// Reads a quoted label value after its opening quote, through the closing
// quote, unescaping into *out. Returns an error reason, or empty.
std::string ReadLabelValue(LineCursor& c, std::size_t max_bytes, std::string* out) {
  // Fast path: most values have no escapes and go in with one copy.
  std::string_view plain = c.While([](char ch) { return ch != '"' && ch != '\\'; });
  if (plain.size() > max_bytes) return TooLong("label value", max_bytes);
  out->assign(plain);
  while (!c.AtEnd()) {
    char ch = c.Peek();
    c.Advance();
    if (ch == '"') return {};
    if (ch == '\\') {
      if (c.AtEnd()) break;
      char esc = c.Peek();
      c.Advance();
      if (esc == '\\' || esc == '"') {
        ch = esc;
      } else if (esc == 'n') {
        ch = '\n';
      } else {
        return "invalid escape sequence in label value";
      }
    }
    if (out->size() >= max_bytes) return TooLong("label value", max_bytes);
    out->push_back(ch);
  }
  return "unterminated label value";
}

// Parses the part of a sample line after '{', through '}'.
std::string ReadLabels(LineCursor& c, const ParseLimits& limits, Labels* labels) {
  labels->clear();
  for (;;) {
    c.SkipBlanks();
    if (c.AtEnd()) return "unterminated label set";
    if (c.Peek() == '}') {
      c.Advance();
      return {};
    }
    if (!IsLabelNameStart(c.Peek())) return "expected a label name";
    if (labels->size() >= limits.max_labels) {
      return "more than " + std::to_string(limits.max_labels) + " labels";
    }
    std::string_view name = c.While(IsLabelNameChar);
    if (name.size() > limits.max_name_bytes) return TooLong("label name", limits.max_name_bytes);
    for (const auto& [existing, value] : *labels) {
      if (existing == name) return "duplicate label " + std::string(name);
    }
    c.SkipBlanks();
    if (c.AtEnd() || c.Peek() != '=') return "expected '=' after label name";
    c.Advance();
    c.SkipBlanks();
    if (c.AtEnd() || c.Peek() != '"') return "expected '\"' to open label value";
    c.Advance();
    auto& pair = labels->emplace_back(std::string(name), std::string());
    if (auto err = ReadLabelValue(c, limits.max_label_value_bytes, &pair.second); !err.empty()) {
      return err;
    }
    c.SkipBlanks();
    if (c.AtEnd()) return "unterminated label set";
    if (c.Peek() == ',') {
      c.Advance();
    } else if (c.Peek() != '}') {
      return "expected ',' or '}' after label value";
    }
  }
}

std::optional<std::int64_t> ParseTimestamp(std::string_view t) {
  if (!t.empty() && t[0] == '+') t.remove_prefix(1);
  if (t.empty() || t[0] == '+') return std::nullopt;
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size()) return std::nullopt;
  return v;
}

std::string ParseSampleLine(LineCursor& c, const ParseLimits& limits, Sample* out) {
  std::string_view name = c.While(IsMetricNameChar);
  if (name.empty() || !IsMetricNameStart(name[0])) return "expected a metric name";
  if (name.size() > limits.max_name_bytes) return TooLong("metric name", limits.max_name_bytes);
  out->name.assign(name);
  out->labels.clear();
  out->timestamp_ms.reset();
  if (!c.AtEnd() && !IsBlank(c.Peek()) && c.Peek() != '{')
    return "invalid character in metric name";
  c.SkipBlanks();
  if (!c.AtEnd() && c.Peek() == '{') {
    c.Advance();
    if (auto err = ReadLabels(c, limits, &out->labels); !err.empty()) return err;
    c.SkipBlanks();
  }
  if (c.AtEnd()) return "missing value";
  std::string_view value = c.Token();
  auto v = ParsePromFloat(value);
  if (!v) return "invalid value \"" + std::string(value.substr(0, 64)) + "\"";
  out->value = *v;
  c.SkipBlanks();
  if (c.AtEnd()) return {};
  std::string_view ts = c.Token();
  auto t = ParseTimestamp(ts);
  if (!t) return "invalid timestamp \"" + std::string(ts.substr(0, 64)) + "\"";
  out->timestamp_ms = t;
  c.SkipBlanks();
  if (!c.AtEnd()) return "unexpected text after timestamp";
  return {};
}

std::optional<MetricType> ParseType(std::string_view t) {
  if (t == "counter") return MetricType::kCounter;
  if (t == "gauge") return MetricType::kGauge;
  if (t == "histogram") return MetricType::kHistogram;
  if (t == "summary") return MetricType::kSummary;
  if (t == "untyped") return MetricType::kUntyped;
  return std::nullopt;
}

// Unescapes a HELP text: \\ and \n. Any other backslash is kept as written
// (expfmt rejects it; a HELP text never changes a value, so we are lenient).
std::string UnescapeHelp(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == '\\' || s[i + 1] == 'n')) {
      out.push_back(s[i + 1] == 'n' ? '\n' : '\\');
      ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// A '#' line: HELP, TYPE, or a comment (anything else).
std::string ParseCommentLine(LineCursor& c, const ParseLimits& limits,
                             StringMap<FamilyInfo>* families, StringSet* seen_type,
                             StringSet* seen_help) {
  c.Advance();  // '#'
  c.SkipBlanks();
  std::string_view keyword = c.Token();
  bool is_help = keyword == "HELP";
  if (!is_help && keyword != "TYPE") return {};  // a plain comment
  c.SkipBlanks();
  std::string_view name = c.While(IsMetricNameChar);
  if (name.empty() || !IsMetricNameStart(name[0]) || (!c.AtEnd() && !IsBlank(c.Peek()))) {
    return "invalid metric name in " + std::string(keyword) + " line";
  }
  if (name.size() > limits.max_name_bytes) return TooLong("metric name", limits.max_name_bytes);
  c.SkipBlanks();
  if (is_help) {
    std::string_view text = c.Rest();
    if (text.size() > limits.max_help_bytes) return TooLong("HELP text", limits.max_help_bytes);
    if (seen_help->contains(name)) return "second HELP line for " + std::string(name);
    seen_help->emplace(name);
    auto it = families->find(name);
    if (it == families->end()) it = families->emplace(std::string(name), FamilyInfo()).first;
    it->second.help = UnescapeHelp(text);
    return {};
  }
  std::string_view type_text = c.Token();
  auto type = ParseType(type_text);
  if (!type) return "unknown metric type \"" + std::string(type_text.substr(0, 64)) + "\"";
  c.SkipBlanks();
  if (!c.AtEnd()) return "unexpected text after TYPE";
  if (seen_type->contains(name)) return "second TYPE line for " + std::string(name);
  seen_type->emplace(name);
  auto it = families->find(name);
  if (it == families->end()) it = families->emplace(std::string(name), FamilyInfo()).first;
  it->second.type = *type;
  return {};
}

// Histogram buckets and summary quantiles must carry a float bound; a
// bucket without "le" would silently corrupt any quantile computed later.
std::string CheckTypedSample(const ParseResult& result, const Sample& s) {
  if (auto it = result.families.find(s.name);
      it != result.families.end() && it->second.type == MetricType::kSummary) {
    auto q = LabelValue(s.labels, "quantile");
    if (!q || !ParsePromFloat(*q)) return "summary sample without a float \"quantile\" label";
  } else if (EndsWith(s.name, "_bucket")) {
    const FamilyInfo* family = result.FamilyOf(s.name);
    if (family != nullptr && family->type == MetricType::kHistogram) {
      auto le = LabelValue(s.labels, "le");
      if (!le || !ParsePromFloat(*le)) return "histogram bucket without a float \"le\" label";
    }
  }
  return {};
}

bool Matches(const Sample& s, const Labels& subset) {
  for (const auto& [name, want] : subset) {
    auto got = LabelValue(s.labels, name);
    if (got ? *got != want : !want.empty()) return false;
  }
  return true;
}

template <typename F>
void ForEachMatch(const ParseResult& r, std::string_view name, const Labels& subset, F&& f) {
  auto it = r.index.find(name);
  if (it == r.index.end()) return;
  for (std::size_t i : it->second) {
    const Sample& s = r.samples[i];
    if (Matches(s, subset) && !f(s)) return;
  }
}

void ParseInto(std::string_view text, const ParseLimits& limits, ParseResult* r) {
  auto fail = [r](std::size_t line, std::string reason) {
    ++r->bad_lines;
    if (!r->first_error) r->first_error = ParseError{line, std::move(reason)};
  };
  StringSet seen_type, seen_help;
  Sample scratch;
  std::vector<std::size_t>* last_entry = nullptr;  // index entry of last_name
  std::string_view last_name;                      // borrows the index's key
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    std::size_t end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(pos, end - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::size_t line_no = ++r->lines;

    LineCursor c(line);
    c.SkipBlanks();
    if (c.AtEnd()) continue;
    if (c.Peek() == '#') {
      if (auto err = ParseCommentLine(c, limits, &r->families, &seen_type, &seen_help);
          !err.empty()) {
        fail(line_no, std::move(err));
      }
      continue;
    }
    if (auto err = ParseSampleLine(c, limits, &scratch); !err.empty()) {
      fail(line_no, std::move(err));
      continue;
    }
    if (auto err = CheckTypedSample(*r, scratch); !err.empty()) {
      fail(line_no, std::move(err));
      continue;
    }
    if (r->samples.size() >= limits.max_samples) {
      r->truncated = true;
      if (!r->first_error) {
        r->first_error = ParseError{line_no, "more than " + std::to_string(limits.max_samples) +
                                                 " samples; the rest of the page was ignored"};
      }
      return;
    }
    // The sample goes in before its index entry: if indexing runs out of
    // memory, the index still never points past the end of `samples`.
    std::size_t at = r->samples.size();
    r->samples.push_back(std::move(scratch));
    scratch = Sample();
    // Pages group a family's series together: remember the last name's
    // entry instead of hashing every sample's name.
    const std::string& name = r->samples.back().name;
    if (last_entry == nullptr || name != last_name) {
      auto it = r->index.find(std::string_view(name));
      if (it == r->index.end()) it = r->index.emplace(name, std::vector<std::size_t>()).first;
      last_entry = &it->second;
      last_name = it->first;
    }
    last_entry->push_back(at);
  }
}

}  // namespace

std::optional<double> ParsePromFloat(std::string_view text) {
  if (text.empty()) return std::nullopt;
  bool negative = false;
  std::string_view rest = text;
  if (rest[0] == '+' || rest[0] == '-') {
    negative = rest[0] == '-';
    rest.remove_prefix(1);
  }
  if (EqualsIgnoreCase(rest, "inf") || EqualsIgnoreCase(rest, "infinity")) {
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  }
  if (EqualsIgnoreCase(rest, "nan")) return std::numeric_limits<double>::quiet_NaN();
  // from_chars would also take "nan(...)", "infinity" spellings and a
  // second sign; insist on a digit or '.' first.
  if (rest.empty() || !(IsDigit(rest[0]) || rest[0] == '.')) return std::nullopt;
  double v = 0;
  const char* end = rest.data() + rest.size();
  auto [p, ec] = std::from_chars(rest.data(), end, v, std::chars_format::general);
  if (p != end) return std::nullopt;
  if (ec == std::errc::result_out_of_range) {
    // Underflow (a negative exponent) reads as zero, as in Go; overflow is an
    // error, as in Go.
    auto e = rest.find_first_of("eE");
    if (e == std::string_view::npos || e + 1 >= rest.size() || rest[e + 1] != '-') {
      return std::nullopt;
    }
    v = 0;
  } else if (ec != std::errc()) {
    return std::nullopt;
  }
  return negative ? -v : v;
}

std::optional<std::string_view> LabelValue(const Labels& labels, std::string_view name) {
  for (const auto& [k, v] : labels) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

ParseResult ParsePromText(std::string_view text, const ParseLimits& limits) {
  ParseResult r;
  if (text.size() > limits.max_input_bytes) {
    r.truncated = true;
    r.first_error =
        ParseError{0, "input is " + std::to_string(text.size()) + " bytes, over the limit of " +
                          std::to_string(limits.max_input_bytes)};
    return r;
  }
  try {
    ParseInto(text, limits, &r);
  } catch (const std::exception& e) {
    // Only allocation can throw here (bad_alloc, length_error). What was
    // committed before stays usable: see the insertion order in ParseInto.
    r.truncated = true;
    try {
      if (!r.first_error) r.first_error = ParseError{r.lines, e.what()};
    } catch (...) {
    }
  }
  return r;
}

std::optional<double> ParseResult::Value(std::string_view name, const Labels& subset) const {
  std::optional<double> out;
  ForEachMatch(*this, name, subset, [&](const Sample& s) {
    out = s.value;
    return false;
  });
  return out;
}

double ParseResult::Sum(std::string_view name, const Labels& subset) const {
  double sum = 0;
  ForEachMatch(*this, name, subset, [&](const Sample& s) {
    sum += s.value;
    return true;
  });
  return sum;
}

std::size_t ParseResult::Count(std::string_view name, const Labels& subset) const {
  std::size_t n = 0;
  ForEachMatch(*this, name, subset, [&](const Sample&) {
    ++n;
    return true;
  });
  return n;
}

std::vector<const Sample*> ParseResult::Series(std::string_view name, const Labels& subset) const {
  std::vector<const Sample*> out;
  ForEachMatch(*this, name, subset, [&](const Sample& s) {
    out.push_back(&s);
    return true;
  });
  return out;
}

const FamilyInfo* ParseResult::FamilyOf(std::string_view series_name) const {
  if (auto it = families.find(series_name); it != families.end()) return &it->second;
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (!EndsWith(series_name, suffix)) continue;
    auto it = families.find(series_name.substr(0, series_name.size() - suffix.size()));
    if (it == families.end()) return nullptr;
    MetricType t = it->second.type;
    if (t == MetricType::kHistogram || (t == MetricType::kSummary && suffix != "_bucket")) {
      return &it->second;
    }
    return nullptr;
  }
  return nullptr;
}

}  // namespace fleet::prom

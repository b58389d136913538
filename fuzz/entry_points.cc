#include "fuzz/entry_points.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <msgpack.hpp>

#include "common/codec.h"
#include "common/msgpack_read.h"
#include "common/prom_api.h"
#include "common/prom_text.h"

// Invariants are checked by comparing re-encodings rather than by a
// hand-written equality per struct: Encode is deterministic and writes every
// field, so "encode(decode(encode(m))) == encode(m)" catches a field that is
// dropped, swapped or changed either way, and needs no update when a field is
// added. Rejected: asserting encode(decode(x)) == x, which does not hold
// (peers may use wider integer headers than needed, or str for a payload).

namespace fleet::fuzz {
namespace {

constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

bool SameDouble(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;  // tells 0 from -0
}

std::string Quote(std::string_view s, std::size_t max = 80) {
  std::string out = "\"";
  for (char c : s.substr(0, max)) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
      out.push_back(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  out += s.size() > max ? "\"..." : "\"";
  return out;
}

// ---- protocol ----

// What the broker decodes with, derived from BrokerOptions' defaults in
// broker_server.cc (payload and text are checked later by the core).
proto::Limits BrokerLimits() {
  proto::Limits l;
  l.max_message_bytes = 64u << 20;
  l.max_payload_bytes = l.max_message_bytes;
  l.max_id_bytes = 256;
  l.max_text_bytes = 1u << 20;
  return l;
}

// Small enough that short fuzz inputs reach every "over the limit" branch.
proto::Limits TightLimits() {
  proto::Limits l;
  l.max_message_bytes = 4096;
  l.max_payload_bytes = 64;
  l.max_items = 4;
  l.max_id_bytes = 8;
  l.max_text_bytes = 32;
  return l;
}

// Every byte field and list length of a message, by the limit that bounds it.
struct Fields {
  enum Kind { kId, kText, kPayload };
  std::vector<std::pair<std::string_view, Kind>> strings;
  std::vector<std::size_t> lists;
  bool bad_outcome = false;

  void Id(std::string_view s) { strings.emplace_back(s, kId); }
  void Text(std::string_view s) { strings.emplace_back(s, kText); }
  void Payload(std::string_view s) { strings.emplace_back(s, kPayload); }
  void Outcome(proto::Outcome o) {
    if (o != proto::Outcome::kOk && o != proto::Outcome::kFailed && o != proto::Outcome::kUnknown &&
        o != proto::Outcome::kRetry) {
      bad_outcome = true;
    }
  }
  template <typename T>
  void List(const std::vector<T>& v) {
    lists.push_back(v.size());
  }

  void operator()(const proto::Submit& m) {
    List(m.batches);
    for (const auto& b : m.batches) {
      Id(b.id);
      Id(b.queue);
      Payload(b.payload);
    }
  }
  void operator()(const proto::Ack& m) {
    List(m.accepted);
    for (auto id : m.accepted) Id(id);
    List(m.rejected);
    for (const auto& r : m.rejected) {
      Id(r.id);
      Text(r.message);
    }
  }
  void operator()(const proto::Result& m) {
    List(m.results);
    for (const auto& r : m.results) {
      Id(r.id);
      Outcome(r.outcome);
      if (r.outcome == proto::Outcome::kRetry) bad_outcome = true;  // DONE only
      Payload(r.result);
      Text(r.error);
    }
  }
  void operator()(const proto::Fetch& m) {
    List(m.ids);
    for (auto id : m.ids) Id(id);
  }
  void operator()(const proto::Hello& m) {
    Id(m.worker_id);
    List(m.queues);
    for (auto q : m.queues) Id(q);
  }
  void operator()(const proto::Dispatch& m) {
    List(m.batches);
    for (const auto& b : m.batches) {
      Id(b.id);
      Id(b.queue);
      Payload(b.payload);
    }
  }
  void operator()(const proto::Done& m) {
    List(m.results);
    for (const auto& r : m.results) {
      Id(r.id);
      // A DONE's outcome is ok, failed or retry (other values read as failed).
      if (r.outcome == proto::Outcome::kUnknown) bad_outcome = true;
      Payload(r.result);
      Text(r.error);
    }
  }
  void operator()(const proto::Stop& m) { Text(m.reason); }
  void operator()(const proto::Reset& m) { Text(m.reason); }
  void operator()(const proto::Control& m) {
    Id(m.op);
    List(m.args);
    for (auto a : m.args) Id(a);
  }
  void operator()(const proto::ControlReply& m) { Text(m.message); }
  void operator()(const proto::WorkersReply& m) {
    List(m.workers);
    for (const auto& w : m.workers) {
      Id(w.id);
      Id(w.state);
    }
  }
  void operator()(const proto::StatsReply& m) {
    List(m.queues);
    for (const auto& q : m.queues) Id(q.first);
    List(m.values);
    for (const auto& v : m.values) Id(v.first);
  }
  void operator()(const proto::Error& m) { Text(m.message); }
  void operator()(const proto::ObjectRequest& m) {
    Id(m.batch_id);
    Payload(m.digest);
  }
  void operator()(const proto::ObjectReply& m) {
    Payload(m.data);
    Text(m.error);
  }
  void operator()(const proto::ObjectGet& m) {
    Id(m.batch_id);
    Payload(m.digest);
  }
  void operator()(const proto::ObjectData& m) {
    Payload(m.data);
    Text(m.error);
  }
  // Welcome, Drain, Bye, Heartbeat: nothing a peer sizes.
  template <typename T>
  void operator()(const T&) {}
};

std::string CheckFields(const proto::Message& m, const proto::Limits& limits,
                        const std::uint8_t* data, std::size_t size) {
  Fields f;
  std::visit(f, m);
  if (f.bad_outcome) return "decoded an outcome outside the enum";
  for (std::size_t n : f.lists) {
    if (n > limits.max_items) return "decoded a list of " + std::to_string(n) + " items";
  }
  const char* begin = reinterpret_cast<const char*>(data);
  for (const auto& [s, kind] : f.strings) {
    std::size_t max = kind == Fields::kId     ? limits.max_id_bytes
                      : kind == Fields::kText ? limits.max_text_bytes
                                              : limits.max_payload_bytes;
    if (s.size() > max) return "decoded a field of " + std::to_string(s.size()) + " bytes";
    // A decoded message borrows from its frame (protocol.h).
    if (!s.empty() && (s.data() < begin || s.data() + s.size() > begin + size)) {
      return "decoded field " + Quote(s) + " does not point into the frame";
    }
  }
  return {};
}

// Decodes under `limits` and checks the result; *encoded gets the canonical
// encoding of the message, or stays empty when the frame was rejected.
std::string DecodeAndCheck(const std::uint8_t* data, std::size_t size, const proto::Limits& limits,
                           const char* which, std::string* encoded) {
  encoded->clear();
  proto::Decoded d = proto::Decode(data, size, limits);
  std::string where = std::string(" (") + which + " limits)";
  if (!d.ok()) {
    if (d.error == proto::ErrorCode::kOk) return "rejected with error code ok" + where;
    if (d.detail.empty()) return "rejected without a reason" + where;
    return {};
  }
  if (d.error != proto::ErrorCode::kOk) return "decoded, yet error is set" + where;
  if (auto err = CheckFields(*d.message, limits, data, size); !err.empty()) return err + where;

  std::string first = proto::Encode(*d.message);
  // Re-encoding may grow a frame a little (a str payload comes back as bin),
  // so only the frame size limit is lifted for the second decode.
  proto::Limits again_limits = limits;
  again_limits.max_message_bytes = kUnlimited;
  proto::Decoded again = proto::Decode(first.data(), first.size(), again_limits);
  if (!again.ok()) return "re-encoded message does not decode: " + again.detail + where;
  if (proto::CommandOf(*again.message) != proto::CommandOf(*d.message)) {
    return "round trip changed the command" + where;
  }
  std::string second = proto::Encode(*again.message);
  if (second != first) return "decode(encode(m)) differs from m" + where;
  *encoded = std::move(first);
  return {};
}

// ---- Prometheus text ----

prom::ParseLimits TightTextLimits() {
  prom::ParseLimits l;
  l.max_input_bytes = 4096;
  l.max_samples = 16;
  l.max_labels = 2;
  l.max_name_bytes = 8;
  l.max_label_value_bytes = 8;
  l.max_help_bytes = 16;
  return l;
}

prom::ParseLimits NoTextLimits() {
  prom::ParseLimits l;
  l.max_input_bytes = kUnlimited;
  l.max_samples = kUnlimited;
  l.max_labels = kUnlimited;
  l.max_name_bytes = kUnlimited;
  l.max_label_value_bytes = kUnlimited;
  l.max_help_bytes = kUnlimited;
  return l;
}

bool IsNameChar(char c, bool first, bool colon) {
  bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
  return alpha || (!first && c >= '0' && c <= '9');
}

bool ValidName(std::string_view s, bool colon) {
  if (s.empty() || !IsNameChar(s[0], true, colon)) return false;
  for (char c : s) {
    if (!IsNameChar(c, false, colon)) return false;
  }
  return true;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

const char* TypeName(prom::MetricType t) {
  switch (t) {
    case prom::MetricType::kCounter:
      return "counter";
    case prom::MetricType::kGauge:
      return "gauge";
    case prom::MetricType::kHistogram:
      return "histogram";
    case prom::MetricType::kSummary:
      return "summary";
    case prom::MetricType::kUntyped:
      break;
  }
  return "untyped";
}

// The page as a well-behaved exporter would write it: samples first (so no
// TYPE line can reject one on the way back in), then HELP and TYPE lines.
// CRLF line ends, so a HELP text that ends in '\r' survives the one '\r' the
// parser strips.
std::string WriteText(const prom::ParseResult& r) {
  std::string out;
  for (const auto& s : r.samples) {
    out += s.name;
    if (!s.labels.empty()) {
      out += '{';
      for (std::size_t i = 0; i < s.labels.size(); ++i) {
        if (i > 0) out += ',';
        out += s.labels[i].first;
        out += "=\"";
        for (char c : s.labels[i].second) {
          if (c == '\\' || c == '"') {
            out += '\\';
            out += c;
          } else if (c == '\n') {
            out += "\\n";
          } else {
            out += c;
          }
        }
        out += '"';
      }
      out += '}';
    }
    out += ' ';
    out += FormatValue(s.value);
    if (s.timestamp_ms) out += ' ' + std::to_string(*s.timestamp_ms);
    out += "\r\n";
  }
  for (const auto& [name, info] : r.families) {
    out += "# HELP " + name + ' ';
    for (char c : info.help) {
      if (c == '\\') {
        out += "\\\\";
      } else if (c == '\n') {
        out += "\\n";
      } else {
        out += c;
      }
    }
    out += "\r\n# TYPE " + name + ' ' + TypeName(info.type) + "\r\n";
  }
  return out;
}

std::string SameSample(const prom::Sample& a, const prom::Sample& b) {
  if (a.name != b.name) return "name " + Quote(a.name) + " came back as " + Quote(b.name);
  if (a.labels != b.labels) return "labels of " + Quote(a.name) + " changed";
  if (!SameDouble(a.value, b.value)) {
    return "value of " + Quote(a.name) + " " + FormatValue(a.value) + " came back as " +
           FormatValue(b.value);
  }
  if (a.timestamp_ms != b.timestamp_ms) return "timestamp of " + Quote(a.name) + " changed";
  return {};
}

std::string CheckPage(const prom::ParseResult& r, const prom::ParseLimits& limits,
                      std::size_t input_size) {
  if ((r.bad_lines > 0 || r.truncated) != r.first_error.has_value()) {
    return "first_error set iff a line was bad or a limit was hit: broken";
  }
  if (r.first_error && r.first_error->line > r.lines) return "first_error past the last line";
  if (r.bad_lines > r.lines) return "more bad lines than lines";
  if (r.samples.size() > r.lines) return "more samples than lines";
  if (r.samples.size() > limits.max_samples) return "more samples than max_samples";
  if (input_size > limits.max_input_bytes && (!r.samples.empty() || !r.truncated)) {
    return "input over max_input_bytes was read";
  }
  for (const auto& s : r.samples) {
    if (!ValidName(s.name, true)) return "sample with invalid name " + Quote(s.name);
    if (s.name.size() > limits.max_name_bytes) return "sample name over the limit";
    if (s.labels.size() > limits.max_labels) return "more labels than max_labels";
    for (std::size_t i = 0; i < s.labels.size(); ++i) {
      const auto& [k, v] = s.labels[i];
      if (!ValidName(k, false)) return "invalid label name " + Quote(k);
      if (k.size() > limits.max_name_bytes) return "label name over the limit";
      if (v.size() > limits.max_label_value_bytes) return "label value over the limit";
      for (std::size_t j = 0; j < i; ++j) {
        if (s.labels[j].first == k) return "duplicate label " + Quote(k) + " accepted";
      }
    }
  }
  for (const auto& [name, info] : r.families) {
    if (!ValidName(name, true)) return "family with invalid name " + Quote(name);
    if (info.help.size() > limits.max_help_bytes) return "HELP text over the limit";
  }
  // The index lists every sample exactly once, under its own name, in order.
  std::size_t indexed = 0;
  for (const auto& [name, positions] : r.index) {
    for (std::size_t k = 0; k < positions.size(); ++k) {
      std::size_t i = positions[k];
      if (i >= r.samples.size()) return "index points past the samples";
      if (r.samples[i].name != name) return "index entry " + Quote(name) + " names another sample";
      if (k > 0 && positions[k - 1] >= i) return "index out of page order";
    }
    indexed += positions.size();
  }
  if (indexed != r.samples.size()) return "index does not cover every sample once";
  // Queries against a scan, for the first few names and label sets.
  for (std::size_t q = 0; q < r.samples.size() && q < 4; ++q) {
    const prom::Sample& probe = r.samples[q];
    for (const prom::Labels& subset : {prom::Labels{}, probe.labels}) {
      std::size_t count = 0;
      std::optional<double> first;
      for (const auto& s : r.samples) {
        if (s.name != probe.name) continue;
        bool match = true;
        for (const auto& [k, v] : subset) {
          auto got = prom::LabelValue(s.labels, k);
          if (got ? *got != v : !v.empty()) match = false;
        }
        if (!match) continue;
        if (!first) first = s.value;
        ++count;
      }
      if (count == 0) return "a sample does not match its own labels";
      if (r.Count(probe.name, subset) != count) return "Count disagrees with a scan";
      if (r.Series(probe.name, subset).size() != count) return "Series disagrees with a scan";
      auto value = r.Value(probe.name, subset);
      if (!value || !SameDouble(*value, *first)) return "Value disagrees with a scan";
    }
  }
  return {};
}

std::string RoundTripPage(const prom::ParseResult& r) {
  std::string text = WriteText(r);
  prom::ParseResult again = prom::ParsePromText(text, NoTextLimits());
  if (!again.ok()) {
    return "written page does not parse: line " +
           std::to_string(again.first_error ? again.first_error->line : 0) + ": " +
           (again.first_error ? again.first_error->reason : "?");
  }
  if (again.samples.size() != r.samples.size()) return "round trip changed the sample count";
  for (std::size_t i = 0; i < r.samples.size(); ++i) {
    if (auto err = SameSample(r.samples[i], again.samples[i]); !err.empty()) {
      return "round trip: " + err;
    }
  }
  if (again.families.size() != r.families.size()) return "round trip changed the families";
  for (const auto& [name, info] : r.families) {
    auto it = again.families.find(name);
    if (it == again.families.end()) return "round trip lost family " + Quote(name);
    if (it->second.type != info.type) return "round trip changed the type of " + Quote(name);
    if (it->second.help != info.help) {
      return "round trip changed HELP of " + Quote(name) + ": " + Quote(info.help) + " -> " +
             Quote(it->second.help);
    }
  }
  return {};
}

std::string ParseAndCheckText(std::string_view text, const prom::ParseLimits& limits,
                              const char* which) {
  prom::ParseResult r = prom::ParsePromText(text, limits);
  std::string where = std::string(" (") + which + " limits)";
  if (auto err = CheckPage(r, limits, text.size()); !err.empty()) return err + where;
  if (text.size() > limits.max_input_bytes) return {};
  if (auto err = RoundTripPage(r); !err.empty()) return err + where;
  return {};
}

// ---- Prometheus API ----

std::string CheckQuery(const prom::QueryResult& r, const prom::QueryLimits& limits) {
  if (!r.ok()) {
    if (r.error_type.empty()) return "error without error_type";
    if (!r.samples.empty() || !r.result_type.empty()) return "error result carries data";
    return {};
  }
  if (!r.error_type.empty()) return "success with an error_type";
  if (r.samples.size() > limits.max_samples) return "more samples than max_samples";
  if (r.result_type == "scalar") {
    if (r.samples.size() != 1 || !r.samples[0].labels.empty()) {
      return "scalar is not one unlabelled sample";
    }
  } else if (r.result_type != "vector") {
    return "success with result type " + Quote(r.result_type);
  }
  return {};
}

std::string RoundTripQuery(const prom::QueryResult& r) {
  using nlohmann::json;
  auto point = [](const prom::QuerySample& s) {
    return json::array({s.timestamp, FormatValue(s.value)});
  };
  for (const auto& s : r.samples) {
    if (!std::isfinite(s.timestamp)) return {};  // JSON cannot say it back
  }
  json doc = {{"status", "success"}};
  if (r.result_type == "scalar") {
    doc["data"] = {{"resultType", "scalar"}, {"result", point(r.samples[0])}};
  } else {
    json result = json::array();
    for (const auto& s : r.samples) result.push_back({{"metric", s.labels}, {"value", point(s)}});
    doc["data"] = {{"resultType", "vector"}, {"result", std::move(result)}};
  }
  if (!r.warnings.empty()) doc["warnings"] = r.warnings;
  std::string text = doc.dump();
  prom::QueryLimits limits;
  limits.max_bytes = kUnlimited;
  limits.max_samples = kUnlimited;
  prom::QueryResult again = prom::ParseQueryResponse(text, limits);
  if (!again.ok()) return "written response does not parse: " + again.error;
  if (again.result_type != r.result_type) return "round trip changed the result type";
  if (again.warnings != r.warnings) return "round trip changed the warnings";
  if (again.samples.size() != r.samples.size()) return "round trip changed the sample count";
  for (std::size_t i = 0; i < r.samples.size(); ++i) {
    const auto& a = r.samples[i];
    const auto& b = again.samples[i];
    if (a.labels != b.labels) return "round trip changed labels";
    if (!SameDouble(a.value, b.value)) {
      return "round trip changed value " + FormatValue(a.value) + " to " + FormatValue(b.value);
    }
    if (!SameDouble(a.timestamp, b.timestamp)) return "round trip changed a timestamp";
  }
  return {};
}

std::string ParseAndCheckQuery(std::string_view text, const prom::QueryLimits& limits,
                               const char* which) {
  prom::QueryResult r = prom::ParseQueryResponse(text, limits);
  std::string where = std::string(" (") + which + " limits)";
  if (auto err = CheckQuery(r, limits); !err.empty()) return err + where;
  if (r.ok()) {
    if (auto err = RoundTripQuery(r); !err.empty()) return err + where;
  }
  return {};
}

// ---- msgpack reading against msgpack-c ----

// str, bin and ext point into the input, as the codec's did.
bool ReferenceAll(msgpack::type::object_type, std::size_t, void*) { return true; }

// Reads the tree `o` msgpack-c built from the cursor, item by item.
std::string SameTree(const msgpack::object& o, mp::Cursor& cursor) {
  const mp::Item it = cursor.Next();
  auto same_bytes = [&](mp::Kind kind, std::uint32_t size, const char* ptr) {
    return it.kind == kind && it.size == size && (size == 0 || it.ptr == ptr);
  };
  bool same = false;
  switch (o.type) {
    case msgpack::type::POSITIVE_INTEGER:
      same = it.kind == mp::Kind::kPositive && it.u == o.via.u64;
      break;
    case msgpack::type::NEGATIVE_INTEGER:
      same = it.kind == mp::Kind::kNegative && it.i == o.via.i64;
      break;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      same = it.kind == (o.type == msgpack::type::FLOAT32 ? mp::Kind::kFloat32
                                                          : mp::Kind::kFloat64) &&
             std::memcmp(&it.f, &o.via.f64, sizeof it.f) == 0;
      break;
    case msgpack::type::NIL: same = it.kind == mp::Kind::kNil; break;
    case msgpack::type::BOOLEAN:
      same = it.kind == mp::Kind::kBool && it.u == (o.via.boolean ? 1u : 0u);
      break;
    case msgpack::type::STR: same = same_bytes(mp::Kind::kStr, o.via.str.size, o.via.str.ptr); break;
    case msgpack::type::BIN: same = same_bytes(mp::Kind::kBin, o.via.bin.size, o.via.bin.ptr); break;
    case msgpack::type::EXT: same = same_bytes(mp::Kind::kExt, o.via.ext.size, o.via.ext.ptr); break;
    case msgpack::type::ARRAY:
      if (it.kind != mp::Kind::kArray || it.size != o.via.array.size) break;
      for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
        if (auto err = SameTree(o.via.array.ptr[i], cursor); !err.empty()) return err;
      }
      return {};
    case msgpack::type::MAP:
      if (it.kind != mp::Kind::kMap || it.size != o.via.map.size) break;
      for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
        if (auto err = SameTree(o.via.map.ptr[i].key, cursor); !err.empty()) return err;
        if (auto err = SameTree(o.via.map.ptr[i].val, cursor); !err.empty()) return err;
      }
      return {};
  }
  if (same) return {};
  return "the cursor read kind " + std::to_string(static_cast<int>(it.kind)) +
         " where msgpack-c has type " + std::to_string(static_cast<int>(o.type));
}

}  // namespace

mp::ReadLimits TightReadLimits() {
  mp::ReadLimits l;
  l.max_array = 3;
  l.max_map = 2;
  l.max_str = 6;
  l.max_bin = 5;
  l.max_ext = 4;
  l.max_depth = 3;
  l.max_children = 8;
  return l;
}

std::string CheckMsgpackRead(const std::uint8_t* data, std::size_t size,
                             const mp::ReadLimits& limits) {
  std::size_t end = 0;
  proto::ErrorCode code = proto::ErrorCode::kOk;
  std::string why;
  const bool ok = mp::Validate(data, size, limits, &end, &code, &why);
  if (!ok && (code == proto::ErrorCode::kOk || why.empty())) {
    return "Validate refused without a code or a reason";
  }
  static const std::string kLimitPrefix = "msgpack limit exceeded: ";
  const bool limit_error = !ok && why.rfind(kLimitPrefix, 0) == 0;
  if (limit_error && code != proto::ErrorCode::kTooLarge) return "a limit reported as " + why;
  const msgpack::unpack_limit reference_limits(
      limits.max_array, limits.max_map, limits.max_str, limits.max_bin, limits.max_ext,
      std::min(limits.max_depth, mp::ReadLimits::kMaxDepth));
  msgpack::zone zone;
  std::size_t reference_end = 0;
  const char* bytes = reinterpret_cast<const char*>(data);
  try {
    const msgpack::object root = msgpack::unpack(zone, bytes, size, reference_end, ReferenceAll,
                                                 nullptr, reference_limits);
    if (!ok) return "Validate refused what msgpack-c unpacked: " + why;
    if (end != reference_end) {
      return "Validate ends at " + std::to_string(end) + ", msgpack-c at " +
             std::to_string(reference_end);
    }
    mp::Cursor cursor(data);
    if (auto err = SameTree(root, cursor); !err.empty()) return err;
    if (cursor.position() != data + end) return "the cursor did not end where the object does";
    mp::Cursor skipping(data);
    const mp::Item first = skipping.Next();
    if (first.container()) skipping.SkipElements(first);
    if (skipping.position() != data + end) return "SkipElements did not end where the object does";
  } catch (const msgpack::size_overflow& e) {
    if (ok) return std::string("Validate accepted what msgpack-c refused: ") + e.what();
    // A structural fault further on takes precedence (msgpack_read.h).
    if (limit_error && why != kLimitPrefix + e.what()) {
      return "Validate reported \"" + why + "\", msgpack-c \"" + e.what() + "\"";
    }
  } catch (const msgpack::unpack_error& e) {  // truncated, or the byte 0xc1
    if (ok) return std::string("Validate accepted what msgpack-c refused: ") + e.what();
    if (code != proto::ErrorCode::kMalformed) {
      return "Validate reported \"" + why + "\" where msgpack-c found " + e.what();
    }
  }
  return {};
}

std::string FuzzProtocol(const std::uint8_t* data, std::size_t size) {
  // Each set is looser than the one before, so what one accepts the next
  // must accept and decode to the same message.
  const std::pair<const char*, proto::Limits> sets[] = {
      {"tight", TightLimits()}, {"default", proto::Limits()}, {"broker", BrokerLimits()}};
  // The reader under tight limits, and under the codec's.
  for (const mp::ReadLimits& read : {TightReadLimits(), proto::ReadLimitsFor(TightLimits()),
                                     proto::ReadLimitsFor(BrokerLimits())}) {
    if (auto err = CheckMsgpackRead(data, size, read); !err.empty()) return err;
  }
  std::string previous;
  for (const auto& [which, limits] : sets) {
    std::string encoded;
    if (auto err = DecodeAndCheck(data, size, limits, which, &encoded); !err.empty()) return err;
    if (!previous.empty() && encoded != previous) {
      return std::string("accepted under tighter limits but not the same under ") + which;
    }
    previous = std::move(encoded);
  }
  return {};
}

std::string FuzzPromText(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto err = ParseAndCheckText(text, TightTextLimits(), "tight"); !err.empty()) return err;
  return ParseAndCheckText(text, prom::ParseLimits(), "default");
}

std::string FuzzPromApi(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  prom::QueryLimits tight;
  tight.max_bytes = 4096;
  tight.max_samples = 2;
  tight.max_depth = 4;
  if (auto err = ParseAndCheckQuery(text, tight, "tight"); !err.empty()) return err;
  return ParseAndCheckQuery(text, prom::QueryLimits(), "default");
}

}  // namespace fleet::fuzz

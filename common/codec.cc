#include "common/codec.h"

#include <msgpack.hpp>

#include <cmath>
#include <cstring>
#include <new>
#include <type_traits>

#include "common/msgpack_read.h"
#include "common/msgpack_write.h"

namespace fleet::proto {
namespace {

// ---- encoding ----

using mp::PackBin;
using mp::Packer;
using mp::PackStr;
using mp::StringSink;

// msgpack-c's pack_double writes an integral value as an integer, testing
// that with a cast to uint64_t that is undefined behaviour for exactly 2^64
// (UBSan, found by fuzz_protocol). That one value goes out as a float64 here.
void PackDouble(Packer& p, std::string* out, double d) {
  if (d != 18446744073709551616.0) {
    p.pack_double(d);
    return;
  }
  std::uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  out->push_back(static_cast<char>(0xcb));
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(bits >> shift));
}

void PackHeader(Packer& p, Command command, std::uint32_t fields) {
  p.pack_array(2 + fields);
  p.pack_uint32(kVersion);
  p.pack_uint8(static_cast<std::uint8_t>(command));
}

void PackStrList(Packer& p, const std::vector<std::string_view>& items) {
  p.pack_array(static_cast<std::uint32_t>(items.size()));
  for (auto s : items) PackStr(p, s);
}

struct EncodeVisitor {
  Packer& p;
  std::string* out;  // p's sink: PackDouble appends to it directly

  void operator()(const Submit& m) {
    PackHeader(p, Command::kSubmit, 1);
    p.pack_array(static_cast<std::uint32_t>(m.batches.size()));
    for (const auto& b : m.batches) {
      p.pack_array(3);
      PackStr(p, b.id);
      PackStr(p, b.queue);
      PackBin(p, b.payload);
    }
  }
  void operator()(const Ack& m) {
    PackHeader(p, Command::kAck, 2);
    PackStrList(p, m.accepted);
    p.pack_array(static_cast<std::uint32_t>(m.rejected.size()));
    for (const auto& r : m.rejected) {
      p.pack_array(3);
      PackStr(p, r.id);
      p.pack_uint32(static_cast<std::uint32_t>(r.code));
      PackStr(p, r.message);
    }
  }
  void operator()(const Result& m) {
    PackHeader(p, Command::kResult, 1);
    p.pack_array(static_cast<std::uint32_t>(m.results.size()));
    for (const auto& r : m.results) {
      p.pack_array(5);
      PackStr(p, r.id);
      p.pack_uint32(static_cast<std::uint32_t>(r.outcome));
      p.pack_uint32(r.attempts);
      PackBin(p, r.result);
      PackStr(p, r.error);
    }
  }
  void operator()(const Fetch& m) {
    PackHeader(p, Command::kFetch, 1);
    PackStrList(p, m.ids);
  }
  void operator()(const Hello& m) {
    // The optional fields only when they say something, so a HELLO without
    // them is the 4-field HELLO of the first protocol revision.
    const std::uint32_t fields = !m.incarnation.empty() ? 6 : m.slots != 0 ? 5 : 4;
    PackHeader(p, Command::kHello, fields);
    PackStr(p, m.worker_id);
    p.pack_uint32(m.concurrency);
    p.pack_uint32(m.credit);
    PackStrList(p, m.queues);
    if (fields >= 5) p.pack_uint32(m.slots);
    if (fields == 6) PackStr(p, m.incarnation);
  }
  void operator()(const Welcome& m) {
    PackHeader(p, Command::kWelcome, 2);
    p.pack_uint32(m.heartbeat_ms);
    p.pack_uint32(m.liveness);
  }
  void operator()(const Dispatch& m) {
    PackHeader(p, Command::kDispatch, 1);
    p.pack_array(static_cast<std::uint32_t>(m.batches.size()));
    for (const auto& b : m.batches) {
      p.pack_array(4);
      PackStr(p, b.id);
      PackStr(p, b.queue);
      p.pack_uint32(b.attempt);
      PackBin(p, b.payload);
    }
  }
  void operator()(const Done& m) {
    PackHeader(p, Command::kDone, 2);
    p.pack_uint32(m.credit);
    p.pack_array(static_cast<std::uint32_t>(m.results.size()));
    for (const auto& r : m.results) {
      p.pack_array(5);
      PackStr(p, r.id);
      p.pack_uint32(r.attempt);
      p.pack_uint32(static_cast<std::uint32_t>(r.outcome));
      PackBin(p, r.result);
      PackStr(p, r.error);
    }
  }
  void operator()(const Drain&) { PackHeader(p, Command::kDrain, 0); }
  void operator()(const Bye&) { PackHeader(p, Command::kBye, 0); }
  void operator()(const Heartbeat&) { PackHeader(p, Command::kHeartbeat, 0); }
  void operator()(const Stop& m) {
    PackHeader(p, Command::kStop, 1);
    PackStr(p, m.reason);
  }
  void operator()(const Reset& m) {
    PackHeader(p, Command::kReset, 1);
    PackStr(p, m.reason);
  }
  void operator()(const Control& m) {
    PackHeader(p, Command::kControl, 3);
    p.pack_uint64(m.request_id);
    PackStr(p, m.op);
    PackStrList(p, m.args);
  }
  void operator()(const ControlReply& m) {
    PackHeader(p, Command::kControlReply, 3);
    p.pack_uint64(m.request_id);
    p.pack_uint32(static_cast<std::uint32_t>(m.code));
    PackStr(p, m.message);
  }
  void operator()(const WorkersReply& m) {
    PackHeader(p, Command::kWorkersReply, 2);
    p.pack_uint64(m.request_id);
    p.pack_array(static_cast<std::uint32_t>(m.workers.size()));
    for (const auto& w : m.workers) {
      p.pack_array(8);
      PackStr(p, w.id);
      PackStr(p, w.state);
      p.pack_uint32(w.concurrency);
      p.pack_uint32(w.held);
      PackDouble(p, out, w.idle_seconds);
      p.pack_uint64(w.processed);
      p.pack_uint64(w.failed);
      p.pack_uint32(w.slots);
    }
  }
  void operator()(const StatsReply& m) {
    PackHeader(p, Command::kStatsReply, 3);
    p.pack_uint64(m.request_id);
    p.pack_map(static_cast<std::uint32_t>(m.queues.size()));
    for (const auto& [name, depth] : m.queues) {
      PackStr(p, name);
      p.pack_uint64(depth);
    }
    p.pack_map(static_cast<std::uint32_t>(m.values.size()));
    for (const auto& [name, value] : m.values) {
      PackStr(p, name);
      PackDouble(p, out, value);
    }
  }
  void operator()(const Error& m) {
    PackHeader(p, Command::kError, 2);
    p.pack_uint32(static_cast<std::uint32_t>(m.code));
    PackStr(p, m.message);
  }
  void operator()(const ObjectRequest& m) {
    PackHeader(p, Command::kObjectRequest, 5);
    p.pack_uint64(m.token);
    PackStr(p, m.batch_id);
    PackBin(p, m.digest);
    p.pack_uint64(m.offset);
    p.pack_uint32(m.length);
  }
  void operator()(const ObjectReply& m) {
    PackHeader(p, Command::kObjectReply, 5);
    p.pack_uint64(m.token);
    p.pack_uint32(m.status);
    p.pack_uint64(m.total);
    PackBin(p, m.data);
    PackStr(p, m.error);
  }
  void operator()(const ObjectGet& m) {
    PackHeader(p, Command::kObjectGet, 5);
    p.pack_uint64(m.tag);
    PackStr(p, m.batch_id);
    PackBin(p, m.digest);
    p.pack_uint64(m.offset);
    p.pack_uint32(m.length);
  }
  void operator()(const ObjectData& m) {
    PackHeader(p, Command::kObjectData, 6);
    p.pack_uint64(m.tag);
    p.pack_uint32(m.status);
    p.pack_uint64(m.total);
    p.pack_uint64(m.offset);
    PackBin(p, m.data);
    PackStr(p, m.error);
  }
};

// ---- decoding ----

// Thrown inside the decoder only; Decode turns it into a Decoded error.
struct Reject {
  ErrorCode code;
  std::string detail;
};

[[noreturn]] void Fail(ErrorCode code, std::string detail) {
  throw Reject{code, std::move(detail)};
}

// Reads one array's fields from a cursor positioned just after its header.
// A field that is itself a list is read by the caller, element by element
// from cursor(), right after the field's header.
class Reader {
 public:
  Reader(mp::Cursor& cursor, const mp::Item& array, const Limits& limits, const char* what)
      : cursor_(cursor), limits_(limits), what_(what) {
    if (array.kind != mp::Kind::kArray) Fail(ErrorCode::kMalformed,
                                             std::string(what) + ": not an array");
    size_ = array.size;
  }

  // Requires exactly n fields from the current position.
  void Expect(std::uint32_t n) const {
    if (size_ - pos_ != n) {
      Fail(ErrorCode::kMalformed, std::string(what_) + ": expected " +
                                      std::to_string(pos_ + n) + " fields, got " +
                                      std::to_string(size_));
    }
  }

  // Requires between lo and hi fields from the current position; returns
  // how many there are.
  std::uint32_t ExpectBetween(std::uint32_t lo, std::uint32_t hi) const {
    const std::uint32_t n = size_ - pos_;
    if (n < lo || n > hi) {
      Fail(ErrorCode::kMalformed, std::string(what_) + ": expected " + std::to_string(pos_ + lo) +
                                      " to " + std::to_string(pos_ + hi) + " fields, got " +
                                      std::to_string(size_));
    }
    return n;
  }

  // Marks `n` fields as read by someone else (the envelope's version and
  // command, read before the command was known).
  void Skipped(std::uint32_t n) { pos_ += n; }

  mp::Item Next() {
    if (pos_ >= size_) Fail(ErrorCode::kMalformed, std::string(what_) + ": too few fields");
    ++pos_;
    return cursor_.Next();
  }

  std::uint64_t Uint() { return UintOf(Next()); }

  std::uint32_t Uint32() {
    std::uint64_t v = Uint();
    if (v > 0xffffffffu) Fail(ErrorCode::kMalformed, std::string(what_) + ": integer out of range");
    return static_cast<std::uint32_t>(v);
  }

  double Float() {
    const mp::Item o = Next();
    switch (o.kind) {
      case mp::Kind::kFloat32:
      case mp::Kind::kFloat64: return o.f;
      case mp::Kind::kPositive: return static_cast<double>(o.u);
      case mp::Kind::kNegative: return static_cast<double>(o.i);
      default: Fail(ErrorCode::kMalformed, std::string(what_) + ": expected a number");
    }
  }

  std::string_view Str(std::size_t max) { return StrOf(Next(), max); }

  std::string_view Id() { return Str(limits_.max_id_bytes); }
  std::string_view Text() { return Str(limits_.max_text_bytes); }

  // bin; str accepted too, so that a hand-written producer that packs its
  // payload as str is not refused for it.
  std::string_view Bin() {
    const mp::Item o = Next();
    if (o.kind != mp::Kind::kBin && o.kind != mp::Kind::kStr) {
      Fail(ErrorCode::kMalformed, std::string(what_) + ": expected bin");
    }
    if (o.size > limits_.max_payload_bytes) TooLarge("payload");
    return {o.ptr, o.size};
  }

  // An array field: its header, with the item count checked against
  // max_items. Its elements come next from cursor().
  std::uint32_t List() {
    const mp::Item o = Next();
    if (o.kind != mp::Kind::kArray) {
      Fail(ErrorCode::kMalformed, std::string(what_) + ": expected an array");
    }
    if (o.size > limits_.max_items) TooLarge("item count");
    return o.size;
  }

  // The next element of a list field, as an array of fields.
  Reader Element(const char* what) { return Reader(cursor_, cursor_.Next(), limits_, what); }

  std::vector<std::string_view> IdList() {
    const std::uint32_t n = List();
    std::vector<std::string_view> out;
    out.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      out.push_back(StrOf(cursor_.Next(), limits_.max_id_bytes));
    }
    return out;
  }

  // A map field: its header, with the pair count checked against max_items.
  // Its keys and values come next from cursor().
  std::uint32_t Map() {
    const mp::Item o = Next();
    if (o.kind != mp::Kind::kMap) {
      Fail(ErrorCode::kMalformed, std::string(what_) + ": expected a map");
    }
    if (o.size > limits_.max_items) TooLarge("item count");
    return o.size;
  }

  // The next pair of a map field. The key is not checked here: callers
  // check the value first, as the codec always has.
  std::pair<mp::Item, mp::Item> Pair() {
    const mp::Item key = cursor_.Next();
    if (key.container()) cursor_.SkipElements(key);
    return {key, cursor_.Next()};
  }

  std::uint64_t UintOf(const mp::Item& o) const {
    if (o.kind != mp::Kind::kPositive) {
      Fail(ErrorCode::kMalformed, std::string(what_) + ": expected an unsigned integer");
    }
    return o.u;
  }

  std::string_view StrOf(const mp::Item& o, std::size_t max) const {
    if (o.kind != mp::Kind::kStr) {
      Fail(ErrorCode::kMalformed, std::string(what_) + ": expected str");
    }
    if (o.size > max) TooLarge("string");
    return {o.ptr, o.size};
  }

  const Limits& limits() const { return limits_; }

 private:
  [[noreturn]] void TooLarge(const char* field) const {
    Fail(ErrorCode::kTooLarge, std::string(what_) + ": " + field + " over the limit");
  }

  mp::Cursor& cursor_;
  const Limits& limits_;
  const char* what_;
  std::uint32_t size_ = 0;
  std::uint32_t pos_ = 0;
};

Outcome ToOutcome(std::uint32_t v) {
  if (v > static_cast<std::uint32_t>(Outcome::kUnknown)) {
    Fail(ErrorCode::kMalformed, "unknown outcome " + std::to_string(v));
  }
  return static_cast<Outcome>(v);
}

// In a DONE: 0 ok, 3 retry, and any other value failed (the spec's rule
// since the first revision: a worker's non-zero outcome is a failure).
Outcome ToDoneOutcome(std::uint32_t v) {
  if (v == static_cast<std::uint32_t>(Outcome::kOk)) return Outcome::kOk;
  if (v == static_cast<std::uint32_t>(Outcome::kRetry)) return Outcome::kRetry;
  return Outcome::kFailed;
}

Message DecodeBody(Command command, Reader& r) {
  const Limits& lim = r.limits();
  switch (command) {
    case Command::kSubmit: {
      r.Expect(1);
      const std::uint32_t count = r.List();
      Submit m;
      m.batches.reserve(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        Reader b = r.Element("submit batch");
        b.Expect(3);
        SubmitItem item;
        item.id = b.Id();
        item.queue = b.Id();
        item.payload = b.Bin();
        m.batches.push_back(item);
      }
      return m;
    }
    case Command::kAck: {
      r.Expect(2);
      Ack m;
      m.accepted = r.IdList();
      const std::uint32_t count = r.List();
      for (std::uint32_t i = 0; i < count; ++i) {
        Reader b = r.Element("ack rejection");
        b.Expect(3);
        Rejection rej;
        rej.id = b.Id();
        rej.code = static_cast<ErrorCode>(b.Uint32());
        rej.message = b.Text();
        m.rejected.push_back(rej);
      }
      return m;
    }
    case Command::kResult: {
      r.Expect(1);
      const std::uint32_t count = r.List();
      Result m;
      m.results.reserve(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        Reader b = r.Element("result");
        b.Expect(5);
        ResultItem item;
        item.id = b.Id();
        item.outcome = ToOutcome(b.Uint32());
        item.attempts = b.Uint32();
        item.result = b.Bin();
        item.error = b.Text();
        m.results.push_back(item);
      }
      return m;
    }
    case Command::kFetch: {
      r.Expect(1);
      return Fetch{r.IdList()};
    }
    case Command::kHello: {
      // 4 fields, then optionally slots, then incarnation (spec section 5).
      const std::uint32_t n = r.ExpectBetween(4, 6);
      Hello m;
      m.worker_id = r.Id();
      m.concurrency = r.Uint32();
      m.credit = r.Uint32();
      m.queues = r.IdList();
      if (n >= 5) m.slots = r.Uint32();
      if (n == 6) m.incarnation = r.Id();
      return m;
    }
    case Command::kWelcome: {
      r.Expect(2);
      Welcome m;
      m.heartbeat_ms = r.Uint32();
      m.liveness = r.Uint32();
      return m;
    }
    case Command::kDispatch: {
      r.Expect(1);
      const std::uint32_t count = r.List();
      Dispatch m;
      m.batches.reserve(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        Reader b = r.Element("dispatch batch");
        b.Expect(4);
        DispatchItem item;
        item.id = b.Id();
        item.queue = b.Id();
        item.attempt = b.Uint32();
        item.payload = b.Bin();
        m.batches.push_back(item);
      }
      return m;
    }
    case Command::kDone: {
      r.Expect(2);
      Done m;
      m.credit = r.Uint32();
      const std::uint32_t count = r.List();
      m.results.reserve(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        Reader b = r.Element("done result");
        b.Expect(5);
        DoneItem item;
        item.id = b.Id();
        item.attempt = b.Uint32();
        item.outcome = ToDoneOutcome(b.Uint32());
        item.result = b.Bin();
        item.error = b.Text();
        m.results.push_back(item);
      }
      return m;
    }
    case Command::kDrain: r.Expect(0); return Drain{};
    case Command::kBye: r.Expect(0); return Bye{};
    case Command::kHeartbeat: r.Expect(0); return Heartbeat{};
    case Command::kStop: r.Expect(1); return Stop{r.Text()};
    case Command::kReset: r.Expect(1); return Reset{r.Text()};
    case Command::kControl: {
      r.Expect(3);
      Control m;
      m.request_id = r.Uint();
      m.op = r.Id();
      m.args = r.IdList();
      return m;
    }
    case Command::kControlReply: {
      r.Expect(3);
      ControlReply m;
      m.request_id = r.Uint();
      m.code = static_cast<ErrorCode>(r.Uint32());
      m.message = r.Text();
      return m;
    }
    case Command::kWorkersReply: {
      r.Expect(2);
      WorkersReply m;
      m.request_id = r.Uint();
      const std::uint32_t count = r.List();
      for (std::uint32_t i = 0; i < count; ++i) {
        Reader b = r.Element("worker info");
        const std::uint32_t n = b.ExpectBetween(7, 8);
        WorkerInfo w;
        w.id = b.Id();
        w.state = b.Id();
        w.concurrency = b.Uint32();
        w.held = b.Uint32();
        w.idle_seconds = b.Float();
        w.processed = b.Uint();
        w.failed = b.Uint();
        if (n == 8) w.slots = b.Uint32();
        m.workers.push_back(w);
      }
      return m;
    }
    case Command::kStatsReply: {
      r.Expect(3);
      StatsReply m;
      m.request_id = r.Uint();
      const std::uint32_t queue_count = r.Map();
      for (std::uint32_t i = 0; i < queue_count; ++i) {
        const auto [key, val] = r.Pair();
        if (val.kind != mp::Kind::kPositive) {
          Fail(ErrorCode::kMalformed, "stats: queue depth not an unsigned integer");
        }
        m.queues.emplace_back(r.StrOf(key, lim.max_id_bytes), val.u);
      }
      const std::uint32_t value_count = r.Map();
      for (std::uint32_t i = 0; i < value_count; ++i) {
        const auto [key, val] = r.Pair();
        double v = 0;
        if (val.kind == mp::Kind::kFloat32 || val.kind == mp::Kind::kFloat64) {
          v = val.f;
        } else if (val.kind == mp::Kind::kPositive) {
          v = static_cast<double>(val.u);
        } else if (val.kind == mp::Kind::kNegative) {
          v = static_cast<double>(val.i);
        } else {
          Fail(ErrorCode::kMalformed, "stats: value not a number");
        }
        m.values.emplace_back(r.StrOf(key, lim.max_id_bytes), v);
      }
      return m;
    }
    case Command::kError: {
      r.Expect(2);
      Error m;
      m.code = static_cast<ErrorCode>(r.Uint32());
      m.message = r.Text();
      return m;
    }
    case Command::kObjectRequest: {
      r.Expect(5);
      ObjectRequest m;
      m.token = r.Uint();
      m.batch_id = r.Id();
      m.digest = r.Bin();
      m.offset = r.Uint();
      m.length = r.Uint32();
      return m;
    }
    case Command::kObjectReply: {
      r.Expect(5);
      ObjectReply m;
      m.token = r.Uint();
      m.status = r.Uint32();
      m.total = r.Uint();
      m.data = r.Bin();
      m.error = r.Text();
      return m;
    }
    case Command::kObjectGet: {
      r.Expect(5);
      ObjectGet m;
      m.tag = r.Uint();
      m.batch_id = r.Id();
      m.digest = r.Bin();
      m.offset = r.Uint();
      m.length = r.Uint32();
      return m;
    }
    case Command::kObjectData: {
      r.Expect(6);
      ObjectData m;
      m.tag = r.Uint();
      m.status = r.Uint32();
      m.total = r.Uint();
      m.offset = r.Uint();
      m.data = r.Bin();
      m.error = r.Text();
      return m;
    }
  }
  Fail(ErrorCode::kUnknownCommand,
       "unknown command " + std::to_string(static_cast<unsigned>(command)));
}

bool KnownCommand(std::uint64_t c) {
  return (c >= 1 && c <= 6) || (c >= 10 && c <= 20) || (c >= 30 && c <= 33) ||
         c == 40;
}

}  // namespace

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kMalformed: return "malformed";
    case ErrorCode::kUnsupportedVersion: return "unsupported_version";
    case ErrorCode::kUnknownCommand: return "unknown_command";
    case ErrorCode::kTooLarge: return "too_large";
    case ErrorCode::kQueueFull: return "queue_full";
    case ErrorCode::kUnknownWorker: return "unknown_worker";
    case ErrorCode::kBusy: return "busy";
    case ErrorCode::kBlacklisted: return "blacklisted";
    case ErrorCode::kDuplicateWorker: return "duplicate_worker";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kFrames: return "frames";
    case ErrorCode::kNotRetiring: return "not_retiring";
    case ErrorCode::kDiskFull: return "disk_full";
  }
  return "unknown_error";
}

const char* ObjectStatusName(ObjectStatus status) {
  switch (status) {
    case ObjectStatus::kOk: return "ok";
    case ObjectStatus::kUnknownObject: return "unknown_object";
    case ObjectStatus::kProducerGone: return "producer_gone";
    case ObjectStatus::kUnknownBatch: return "unknown_batch";
    case ObjectStatus::kBusy: return "busy";
    case ObjectStatus::kTimeout: return "timeout";
    case ObjectStatus::kBadRequest: return "bad_request";
    case ObjectStatus::kUnavailable: return "unavailable";
  }
  return "invalid";
}

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk: return "ok";
    case Outcome::kFailed: return "failed";
    case Outcome::kUnknown: return "unknown";
    case Outcome::kRetry: return "retry";
  }
  return "invalid";
}

Command CommandOf(const Message& message) {
  static constexpr Command kByIndex[] = {
      Command::kSubmit,   Command::kAck,          Command::kResult,
      Command::kFetch,    Command::kHello,        Command::kWelcome,
      Command::kDispatch, Command::kDone,         Command::kDrain,
      Command::kBye,      Command::kHeartbeat,    Command::kStop,
      Command::kReset,    Command::kControl,      Command::kControlReply,
      Command::kWorkersReply, Command::kStatsReply, Command::kError,
      Command::kObjectRequest, Command::kObjectReply, Command::kObjectGet,
      Command::kObjectData};
  static_assert(sizeof(kByIndex) / sizeof(kByIndex[0]) ==
                std::variant_size_v<Message>);
  return kByIndex[message.index()];
}

void EncodeTo(const Message& message, std::string* out) {
  out->clear();
  StringSink sink{out};
  Packer packer(sink);
  std::visit(EncodeVisitor{packer, out}, message);
}

// Every limit is explicit (msgpack-c's defaults, 0xffffffff, let a 5-byte
// array header ask for ~96 GB before any element arrived): the ones the
// codec gave msgpack-c's unpack when it decoded with it.
mp::ReadLimits ReadLimitsFor(const Limits& limits) {
  mp::ReadLimits r;
  r.max_array = limits.max_items + 8;
  r.max_map = limits.max_items;
  r.max_str = std::max(limits.max_text_bytes, limits.max_payload_bytes);
  r.max_bin = limits.max_payload_bytes;
  r.max_ext = 0;
  r.max_depth = 8;
  r.max_children = 2 * (limits.max_items + 8);
  return r;
}

Decoded Decode(const void* data, std::size_t size, const Limits& limits) {
  Decoded d;
  if (size > limits.max_message_bytes) {
    d.error = ErrorCode::kTooLarge;
    d.detail = "frame of " + std::to_string(size) + " bytes over the limit of " +
               std::to_string(limits.max_message_bytes);
    return d;
  }
  if (size == 0) {
    d.error = ErrorCode::kMalformed;
    d.detail = "empty frame";
    return d;
  }
  std::size_t end = 0;
  if (!mp::Validate(data, size, ReadLimitsFor(limits), &end, &d.error, &d.detail)) return d;
  if (end != size) {
    d.error = ErrorCode::kMalformed;
    d.detail = std::to_string(size - end) + " trailing bytes after the message";
    return d;
  }
  d.error = ErrorCode::kOk;
  try {
    mp::Cursor cursor(data);
    const mp::Item root = cursor.Next();
    if (root.kind != mp::Kind::kArray || root.size < 2) {
      d.error = ErrorCode::kMalformed;
      d.detail = "message is not an array of [version, command, ...]";
      return d;
    }
    const mp::Item version = cursor.Next();
    const mp::Item command =
        version.kind == mp::Kind::kPositive ? cursor.Next() : mp::Item{};
    if (version.kind != mp::Kind::kPositive || command.kind != mp::Kind::kPositive) {
      d.error = ErrorCode::kMalformed;
      d.detail = "version and command must be unsigned integers";
      return d;
    }
    if (version.u != kVersion) {
      d.error = ErrorCode::kUnsupportedVersion;
      d.detail = "protocol version " + std::to_string(version.u) +
                 " not supported (this broker speaks " + std::to_string(kVersion) + ")";
      return d;
    }
    if (!KnownCommand(command.u)) {
      d.error = ErrorCode::kUnknownCommand;
      d.detail = "unknown command " + std::to_string(command.u);
      return d;
    }
    // A CONTROL's request id, read before the rest is checked, so that even
    // a CONTROL refused as a whole is answered under the id its sender waits
    // for (and a late answer is never taken for another call's).
    if (command.u == static_cast<std::uint64_t>(Command::kControl) && root.size >= 3) {
      const mp::Item request_id = cursor.Peek();
      if (request_id.kind == mp::Kind::kPositive) d.request_id = request_id.u;
    }
    Reader reader(cursor, root, limits, "message");
    reader.Skipped(2);
    d.message = DecodeBody(static_cast<Command>(command.u), reader);
  } catch (const Reject& r) {
    d.message.reset();
    d.error = r.code;
    d.detail = r.detail;
  } catch (const std::bad_alloc&) {
    d.error = ErrorCode::kTooLarge;
    d.detail = "message needs more memory than allowed";
  }
  return d;
}

}  // namespace fleet::proto

// The fleet wire protocol: commands, message structs and the version.
//
// Every message is one ZeroMQ frame (a DEALER peer sends one frame; the
// broker's ROUTER sees [routing id, frame]) holding one msgpack array:
//   [version, command, field...]
// docs/protocol.md is the normative description; keep the two in step.
//
// Byte fields are std::string_view. A decoded message borrows from the frame
// it was decoded from and must not outlive it; a message being encoded
// borrows from whatever the caller points it at. No msgpack here: only the
// codec includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace fleet::proto {

inline constexpr std::uint32_t kVersion = 1;

enum class Command : std::uint8_t {
  // Frontend: producer <-> broker.
  kSubmit = 1,  // P->B batches to run
  kAck = 2,     // B->P which batches of a SUBMIT were accepted / rejected
  kResult = 3,  // B->P results
  kFetch = 4,   // P->B results (or re-ownership) of batches by id
  kObjectRequest = 5,  // B->P a chunk of an object, for a worker
  kObjectReply = 6,    // P->B the chunk, or why not
  // Backend: worker <-> broker.
  kHello = 10,      // W->B register (or re-register) with id and credit
  kWelcome = 11,    // B->W registered; carries the heartbeat interval
  kDispatch = 12,   // B->W batches to run, never more than the credit
  kDone = 13,       // W->B results plus new credit
  kDrain = 14,      // W->B take nothing new from me (SIGTERM)
  kBye = 15,        // W->B leaving now
  kStop = 16,       // B->W drain what you hold, say BYE, exit
  kHeartbeat = 17,  // both ways
  kReset = 18,      // B->W unknown to me: send HELLO again
  kObjectGet = 19,   // W->B a chunk of an object, from a held batch's producer
  kObjectData = 20,  // B->W the chunk, or why not
  // Control: fleet-ctl / autoscaler <-> broker.
  kControl = 30,       // C->B request
  kControlReply = 31,  // B->C status reply
  kWorkersReply = 32,  // B->C reply to "workers"
  kStatsReply = 33,    // B->C reply to "stats"
  // Any direction from the broker.
  kError = 40,
};

// Error codes carried by ACK rejections, CONTROL_REPLY and ERROR.
enum class ErrorCode : std::uint32_t {
  kOk = 0,
  kMalformed = 1,           // not msgpack, wrong types, trailing bytes
  kUnsupportedVersion = 2,  // version != kVersion
  kUnknownCommand = 3,      // command not known, or not valid on this socket
  kTooLarge = 4,            // frame, payload, id or item count over a limit
  kQueueFull = 5,           // --max-queue reached; retry later
  kUnknownWorker = 6,       // no such worker id
  kBusy = 7,                // retire-if-idle refused: the worker holds work
  kBlacklisted = 8,         // worker id is on the blacklist
  kDuplicateWorker = 9,     // worker id is in use by a live connection
  kInvalidArgument = 10,    // bad id, bad control op or arguments
  kFrames = 11,             // wrong number of frames
  kNotRetiring = 12,        // unretire of a worker that is not retiring
  kDiskFull = 13,           // the journal cannot be written now; retry later
};

const char* ErrorCodeName(ErrorCode code);

enum class Outcome : std::uint32_t {
  kOk = 0,
  kFailed = 1,   // the handler failed, or the batch was dead-lettered
  kUnknown = 2,  // FETCH of an id the broker does not know
  // DONE only: the worker could not finish the batch (its handler process
  // died, was killed or broke the handler protocol) and asks for another
  // try, which the broker gives while --max-attempts allows. Never in a
  // RESULT.
  kRetry = 3,
};

const char* OutcomeName(Outcome outcome);

// Statuses of OBJECT_REPLY, OBJECT_DATA and the handler's `object` answers
// (spec section 7). Carried as a plain u32 on the wire: a peer may send a
// value outside this list, which the receiver must check.
enum class ObjectStatus : std::uint32_t {
  kOk = 0,
  kUnknownObject = 1,  // the producer does not hold this digest
  kProducerGone = 2,   // the batch's owner is not connected
  kUnknownBatch = 3,   // the asker does not hold this batch
  kBusy = 4,           // too many requests pending; ask again later
  kTimeout = 5,        // the producer did not answer in time
  kBadRequest = 6,     // bad digest, length 0, offset past the end, long reply
  kUnavailable = 7,    // fleet-worker to its handler: no broker now
};
inline constexpr std::uint32_t kMaxObjectStatus = 7;

const char* ObjectStatusName(ObjectStatus status);

// Digest sizes the spec allows (1..64 bytes); others are bad_request.
inline constexpr std::size_t kMaxDigestBytes = 64;

// ---- frontend ----

struct SubmitItem {
  std::string_view id;       // chosen by the producer, unique per batch
  std::string_view queue;    // "" means "default"
  std::string_view payload;  // msgpack bin
};
struct Submit {
  std::vector<SubmitItem> batches;
};

struct Rejection {
  std::string_view id;
  ErrorCode code = ErrorCode::kOk;
  std::string_view message;
};
struct Ack {
  std::vector<std::string_view> accepted;
  std::vector<Rejection> rejected;
};

struct ResultItem {
  std::string_view id;
  Outcome outcome = Outcome::kOk;
  std::uint32_t attempts = 0;  // how many times it was dispatched
  std::string_view result;     // msgpack bin: the handler's output
  std::string_view error;      // why it failed; "" when ok
};
struct Result {
  std::vector<ResultItem> results;
};

struct Fetch {
  std::vector<std::string_view> ids;
};

// Objects (spec section 5a). `digest` is opaque bytes, checked for its size
// by the broker (not the codec), so a bad one is answered, not refused.
struct ObjectRequest {
  std::uint64_t token = 0;  // the broker's name for the request
  std::string_view batch_id;
  std::string_view digest;
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};
struct ObjectReply {
  std::uint64_t token = 0;
  std::uint32_t status = 0;  // ObjectStatus; any u32 on the wire
  std::uint64_t total = 0;
  std::string_view data;
  std::string_view error;
};

// ---- backend ----

struct Hello {
  std::string_view worker_id;
  std::uint32_t concurrency = 1;  // batches it may hold: slots + prefetch
  std::uint32_t credit = 1;       // of those, free right now
  std::vector<std::string_view> queues;  // empty: every queue
  // Optional trailing fields (a HELLO of 4 fields has neither):
  std::uint32_t slots = 0;  // batches it runs at once (<= concurrency); 0: concurrency
  std::string_view incarnation = {};  // one value per process run; "" when not sent
};

struct Welcome {
  std::uint32_t heartbeat_ms = 1000;
  std::uint32_t liveness = 3;  // missed heartbeats before a peer is dead
};

struct DispatchItem {
  std::string_view id;
  std::string_view queue;
  std::uint32_t attempt = 1;  // 1 on the first run
  std::string_view payload;
};
struct Dispatch {
  std::vector<DispatchItem> batches;
};

struct DoneItem {
  std::string_view id;
  std::uint32_t attempt = 1;
  Outcome outcome = Outcome::kOk;
  std::string_view result;
  std::string_view error;
};
struct Done {
  std::uint32_t credit = 0;  // slots granted on top of what the broker holds
  std::vector<DoneItem> results;
};

struct Drain {};
struct Bye {};
struct Heartbeat {};
struct Stop {
  std::string_view reason;
};
struct Reset {
  std::string_view reason;
};

struct ObjectGet {
  std::uint64_t tag = 0;  // the worker's own, echoed in OBJECT_DATA
  std::string_view batch_id;
  std::string_view digest;
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};
struct ObjectData {
  std::uint64_t tag = 0;
  std::uint32_t status = 0;  // ObjectStatus
  std::uint64_t total = 0;
  std::uint64_t offset = 0;  // the request's
  std::string_view data;
  std::string_view error;
};

// ---- control ----

struct Control {
  std::uint64_t request_id = 0;
  std::string_view op;  // workers, stats, retire, retire-if-idle, unretire, wait-demand
  std::vector<std::string_view> args;
};

struct ControlReply {
  std::uint64_t request_id = 0;
  ErrorCode code = ErrorCode::kOk;
  std::string_view message;
};

struct WorkerInfo {
  std::string_view id;
  std::string_view state;  // idle, busy, retiring
  std::uint32_t concurrency = 0;  // slots + prefetch
  std::uint32_t held = 0;
  double idle_seconds = 0;  // 0 while it holds a batch
  std::uint64_t processed = 0;
  std::uint64_t failed = 0;
  std::uint32_t slots = 0;  // optional 8th field; 0 when a 7-field entry
};
struct WorkersReply {
  std::uint64_t request_id = 0;
  std::vector<WorkerInfo> workers;
};

struct StatsReply {
  std::uint64_t request_id = 0;
  std::vector<std::pair<std::string_view, std::uint64_t>> queues;  // depth
  std::vector<std::pair<std::string_view, double>> values;  // counters, gauges
};

struct Error {
  ErrorCode code = ErrorCode::kOk;
  std::string_view message;
};

using Message =
    std::variant<Submit, Ack, Result, Fetch, Hello, Welcome, Dispatch, Done,
                 Drain, Bye, Heartbeat, Stop, Reset, Control, ControlReply,
                 WorkersReply, StatsReply, Error, ObjectRequest, ObjectReply,
                 ObjectGet, ObjectData>;

Command CommandOf(const Message& message);

}  // namespace fleet::proto

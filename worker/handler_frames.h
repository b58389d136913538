// The frames of the handler protocol (docs/handler-protocol.md) that a
// worker exchanges with a persistent handler process over its stdin and
// stdout: a 4-byte big-endian length, then one MessagePack array.
//
// Pure functions: no I/O. The decoder never trusts a length before the
// bytes are there, and bounds every string by the frame it came in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fleet::worker::frames {

inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 4;
// The most batches a handler may take at once (ready's `depth`); a larger
// depth is taken as this.
inline constexpr std::uint32_t kMaxDepth = 64;

// Appends the frame ["batch", id, payload, attempt, queue] to `out`.
void AppendBatch(std::string* out, std::string_view id, std::string_view payload,
                 std::uint32_t attempt, std::string_view queue);

// Appends the frame ["object", tag, status, total, offset, data, error].
void AppendObject(std::string* out, std::uint64_t tag, std::uint32_t status, std::uint64_t total,
                  std::uint64_t offset, std::string_view data, std::string_view error);

// Where a frame is in a buffer of bytes read so far.
enum class Scan {
  kNeedMore,  // not a whole frame yet
  kFrame,     // *body_size bytes of body follow the header
  kTooLarge,  // the header announces more than max_body bytes
};
Scan ScanFrame(std::string_view buffer, std::size_t max_body, std::size_t* body_size);

// One message from a handler.
struct HandlerMessage {
  enum class Kind { kReady, kOk, kError, kGet };
  Kind kind = Kind::kReady;
  std::uint32_t version = 0;  // ready
  std::uint32_t depth = 1;    // ready: batches it takes at once, 1..kMaxDepth
  std::string_view id;        // ok, error
  std::string_view data;      // ok: the result; error: the message; get: the digest
  std::uint64_t tag = 0;      // get: the handler's own, echoed in `object`
  std::uint64_t offset = 0;   // get
  std::uint64_t length = 0;   // get (not checked here: 0 is answered bad_request)
};

// Decodes one frame's body. On failure returns false with `why` saying
// what was wrong (for the batch's "protocol error: ..." text). The views
// point into `body`.
bool DecodeHandlerMessage(std::string_view body, HandlerMessage* out, std::string* why);

// Reads a batch frame's body (id and payload only), as a handler would:
// for the test handler and C++ handlers built in this tree.
bool DecodeBatchForTests(std::string_view body, std::string* id, std::string* payload);

// Appends a handler's messages (for tests and example handlers in C++).
// `depth` 0 leaves it out (a version-1 ready of two elements).
void AppendReady(std::string* out, std::uint32_t version = kVersion, std::uint32_t depth = 0);
void AppendOk(std::string* out, std::string_view id, std::string_view result);
void AppendError(std::string* out, std::string_view id, std::string_view message);
void AppendGet(std::string* out, std::uint64_t tag, std::string_view digest, std::uint64_t offset,
               std::uint64_t length);
// Reads an `object` frame's body, as a handler would (tests).
bool DecodeObjectForTests(std::string_view body, std::uint64_t* tag, std::uint32_t* status,
                          std::uint64_t* total, std::uint64_t* offset, std::string* data,
                          std::string* error);

}  // namespace fleet::worker::frames

// Encodes and decodes protocol messages (protocol.h) as msgpack, enforcing
// limits on everything a peer controls. Encoding uses msgpack-c's packer;
// decoding reads the frame in place (msgpack_read.h), refusing exactly what
// msgpack-c's unpack did under the same limits.
//
// Thread-safe: free functions without shared state.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "common/msgpack_read.h"
#include "common/protocol.h"

namespace fleet::proto {

// Bounds on one message; a peer can never make us allocate past these.
struct Limits {
  std::size_t max_message_bytes = 64u << 20;  // one frame; 1 KiB..1 GiB
  std::size_t max_payload_bytes = 16u << 20;  // a batch payload or result
  std::size_t max_items = 65536;              // batches / ids per message
  std::size_t max_id_bytes = 256;             // batch, worker, queue ids
  std::size_t max_text_bytes = 64u << 10;     // error messages, reasons
};

// A decoded message, or why the frame was rejected. `message` borrows from
// the frame passed to Decode.
struct Decoded {
  std::optional<Message> message;
  ErrorCode error = ErrorCode::kOk;
  std::string detail;  // human-readable reason when message is empty
  // For a CONTROL, its request id whenever the frame got as far as a
  // well-formed one, even if the rest was refused: the broker answers a
  // refused CONTROL with a CONTROL_REPLY under this id.
  std::optional<std::uint64_t> request_id;

  bool ok() const { return message.has_value(); }
};

// The msgpack limits Decode reads a frame under (msgpack_read.h): the ones
// in section 8 of docs/protocol.md, derived from `limits`.
mp::ReadLimits ReadLimitsFor(const Limits& limits);

// Decodes one frame. Never throws: malformed, truncated, oversized, trailing
// bytes, a wrong version or an unknown command come back as an error.
Decoded Decode(const void* data, std::size_t size,
               const Limits& limits = Limits());

// Encodes `message` into `out`, replacing its contents (capacity is reused,
// so a loop that keeps one string allocates only when a message grows).
void EncodeTo(const Message& message, std::string* out);

inline std::string Encode(const Message& message) {
  std::string out;
  EncodeTo(message, &out);
  return out;
}

}  // namespace fleet::proto

// The journal's record format: what each record the broker appends to its
// journal holds (broker/journal.h frames every record with its length, type
// and checksum) and how it is read back at start.
//
//   kAccepted   (1)  u32 id length | id | u32 queue length | queue | payload
//                    a batch the broker accepted (fdatasynced before the ACK)
//   kFinished   (2)  id
//                    the batch has its result (not synced on its own: lost
//                    in a crash, the batch only runs again). Read, no longer
//                    written: kFinishedIds took its place
//   kDispatched (3)  u32 attempts | id
//                    the batch's attempt count after a dispatch (or after
//                    an attempt was given back: a dispatch that never
//                    left), so a restart does not give it a fresh set of
//                    attempts; on replay the last one wins. Not synced on
//                    its own. A broker writing off its loop (as it runs)
//                    appends it when its next write starts, with the count
//                    the batch has then, and not at all for a batch that
//                    finished before (its finished record says more)
//   kFinishedIds (4) (u32 id length | id), one or more
//                    the batches have their results, as kFinished for each
//                    id in turn. Batches that finish one after the other
//                    share one record (Journal::AppendItem): one header and
//                    checksum for many ids
//
// Integers are little-endian. A queue of "" means "default". Pure functions;
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fleet::broker::records {

inline constexpr std::uint8_t kAccepted = 1;
inline constexpr std::uint8_t kFinished = 2;
inline constexpr std::uint8_t kDispatched = 3;
inline constexpr std::uint8_t kFinishedIds = 4;

struct Accepted {
  std::string_view id;  // not empty
  std::string_view queue;
  std::string_view payload;
};

struct Dispatched {
  std::uint32_t attempts = 0;
  std::string_view id;  // not empty
};

// Replace `out` with the body of the record (capacity is reused).
void EncodeAccepted(std::string* out, std::string_view id, std::string_view queue,
                    std::string_view payload);
void EncodeDispatched(std::string* out, std::uint32_t attempts, std::string_view id);
// The dispatched record's body is these 4 bytes followed by the id.
void StoreAttempts(char out[4], std::uint32_t attempts);
// The accepted record's body up to its payload: the body is this followed
// by the payload (Journal::Append with two parts, so the payload is copied
// once, into the journal's buffer).
void EncodeAcceptedHead(std::string* out, std::string_view id, std::string_view queue);

// The fields of a record body (views into `body`); empty when the body is
// too short, a length runs past its end, or the id is empty.
std::optional<Accepted> DecodeAccepted(std::string_view body);
std::optional<Dispatched> DecodeDispatched(std::string_view body);

// The size of an accepted-batch record's body.
std::size_t AcceptedBytes(std::string_view id, std::string_view queue, std::string_view payload);
// The batch a record is about (a view into `body`); empty for a record it
// cannot read (which compaction then keeps) and for kFinishedIds, whose
// items are the ids (JournalOptions::item_types).
std::string_view BatchId(std::uint8_t type, std::string_view body);

}  // namespace fleet::broker::records

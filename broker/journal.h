// Journal: the broker's append-only log for --data-dir, so an accepted batch
// survives a crash of the broker.
//
// Files: DIR/journal-NNNNNNNNNNNNNNNN.log segments, numbered in write order.
// A record is
//   u32 body length (little endian) | u32 CRC-32C of type+body | u8 type | body
// and the journal does not interpret type or body (the broker does).
//
// Durability: Append only buffers; Commit writes the buffer and fdatasync()s
// it, once for everything appended since the last Commit (group commit: the
// broker commits once per loop turn, before it answers the producers whose
// batches that turn accepted).
//
// Replay (Open): every record of every segment, in order. A torn tail -- the
// last record of the last segment cut short or failing its checksum, as a
// power cut leaves it -- is truncated away with a log line. Anything else that
// does not check out (a bad record followed by more data, or in an older
// segment) stops the start with JournalError: silently skipping records
// could drop accepted batches.
//
// Compaction: when the active segment passes segment_bytes, NeedsCompaction()
// turns true; the broker then calls Compact() with the records of everything
// still live (its snapshot). Compact writes them to a fresh segment, syncs it,
// and only then deletes every older segment.
//
// Not thread-safe; the broker loop owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fleet::broker {

class JournalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JournalOptions {
  std::string dir;
  // A segment past this size asks for compaction. 1 MiB .. 16 GiB.
  std::uint64_t segment_bytes = 256ull << 20;
  // fdatasync on Commit. Off only for tests and benchmarks of the format.
  bool sync = true;
};

struct JournalStats {
  std::uint64_t records_replayed = 0;
  std::uint64_t segments_replayed = 0;
  std::uint64_t torn_bytes_truncated = 0;
  std::uint64_t commits = 0;
  std::uint64_t syncs = 0;
  std::uint64_t records_appended = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t compactions = 0;
};

// Little-endian u32 as the record format writes them (also for the fields
// the broker puts in its record bodies).
void PutLe32(std::string& out, std::uint32_t v);
std::uint32_t ReadLe32(const char* p);

// CRC-32C (Castagnoli), as used by the record format.
std::uint32_t Crc32c(std::string_view data, std::uint32_t crc = 0);

class Journal {
 public:
  using Visitor = std::function<void(std::uint8_t type, std::string_view body)>;
  static constexpr std::uint32_t kMaxRecordBytes = 256u << 20;

  // Creates DIR if needed, replays it through `visit` and opens a new
  // active segment. Throws JournalError (corruption, I/O, an unusable dir).
  static std::unique_ptr<Journal> Open(const JournalOptions& options, const Visitor& visit);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Buffers one record. Requires: body.size() <= kMaxRecordBytes.
  // `must_sync`: the next Commit syncs (an acknowledgement waits for this
  // record). Records without it are written by Commit but synced only with
  // the next one that must be (or by the OS): losing them in a crash must be
  // harmless (the broker's "finished" records: the batch runs again).
  void Append(std::uint8_t type, std::string_view body, bool must_sync = true);
  // Writes what was appended, and fdatasyncs when a must_sync record is
  // among it; true when there was something. Throws JournalError when the
  // disk refuses (the broker must not acknowledge then).
  bool Commit();
  bool pending() const { return !buffer_.empty(); }

  // Past segment_bytes, and at least twice what the last compaction kept, so
  // a large live set is not rewritten on every tick.
  bool NeedsCompaction() const {
    return active_bytes_ >= std::max(options_.segment_bytes, 2 * snapshot_bytes_);
  }
  // `snapshot` appends (through the journal passed to it) every record still
  // needed; then the older segments go. Commits first.
  void Compact(const std::function<void(Journal&)>& snapshot);

  const JournalStats& stats() const { return stats_; }
  std::uint64_t active_segment() const { return active_number_; }
  std::uint64_t active_bytes() const { return active_bytes_; }
  std::size_t segment_count() const { return segments_.size(); }

 private:
  explicit Journal(JournalOptions options);
  void Replay(const Visitor& visit);
  void OpenSegment(std::uint64_t number);
  std::string SegmentPath(std::uint64_t number) const;
  void SyncDir();

  JournalOptions options_;
  std::vector<std::uint64_t> segments_;  // numbers on disk, ascending
  int fd_ = -1;                          // the active segment
  std::uint64_t active_number_ = 0;
  std::uint64_t active_bytes_ = 0;
  std::string buffer_;
  bool sync_due_ = false;
  bool failed_ = false;  // a write or sync failed: no more writes
  std::uint64_t snapshot_bytes_ = 0;  // the active segment's size after the last compaction
  JournalStats stats_;
};

}  // namespace fleet::broker

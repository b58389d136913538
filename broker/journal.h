// Journal: the broker's append-only log for --data-dir, so an accepted batch
// survives a crash of the broker, and a full disk or a damaged file costs
// no acknowledged batch.
//
// Files: DIR/journal-NNNNNNNNNNNNNNNN.log segments, replayed in number
// order. A segment starts with a 16-byte header
//   "fleetj2\n" | u64 first  (the lowest segment number it stands for)
// and holds records
//   u32 body length | u32 check of the length | u32 CRC-32C | u8 type | body
// where the CRC covers the length, the type and the body, and the check is
// the CRC-32C of the four length bytes (masked): a damaged length is told
// apart from a record cut short. Integers are little-endian. The journal
// does not interpret types or bodies (the broker does: journal_records.h),
// except that AppendItem builds a body of items, each "u32 length | item",
// so that many small records made in a row (a finished batch each) share
// one header and checksum.
// Segments written before this format (no header; u32 length | u32 CRC of
// type+body | u8 type | body) are still read.
//
// Durability: Append only buffers; Commit writes what was appended since
// the last one and fdatasyncs when a record that must be synced is among it.
// The broker uses StartWrite/FinishWrite instead: the same write and sync on
// a writer thread, so the loop goes on serving while the disk syncs, and
// everything appended meanwhile goes to disk together with the next sync
// (group commit). Either way the broker acknowledges a batch, or gives it
// to a worker, only after the write holding its record has been synced.
//
// Replay (Open) visits every record in order. A torn tail -- a last record
// cut short, or zeros, at the end of the newest segment, as a crash leaves
// it -- is cut off with a log line. A complete record that fails its
// checksum, or damage anywhere else, stops the start with JournalError
// naming the file and offset, unless JournalOptions::recover is set: then
// every record that checks out is kept, the damaged bytes are dropped and
// logged, and the damaged segment is rewritten so the next start is clean.
//
// Space: the broker tells the journal which segment holds each unfinished
// batch's accepted record (AddLive/RemoveLive). Maintain(), called from the
// loop's housekeeping tick, deletes segments from the oldest while nothing
// in them is live, and compacts when old segments hold more garbage than
// max(segment_bytes, their live bytes): a background thread copies the
// records of the batches still live in segments F..K (of a record of
// items, JournalOptions::item_types, the live items) into a new file that
// replaces K atomically (its header says it stands for F..K, so the
// replaced files are ignored even if a crash leaves them behind), then
// removes F..K-1. The loop never waits for a compaction. On disk: the
// unfinished batches' records plus the active segment when batches finish
// roughly in order; at most about twice that plus two segments otherwise.
//
// Full disk: a write that fails leaves nothing half-written (the partial
// record is cut off), Commit reports kRefused and drops the must-sync
// records of that turn (the broker refuses their batches), and the journal
// turns unavailable: state() kNoSpace (ENOSPC, EDQUOT) or kFailed (any other
// write or sync error). Records that need no sync are kept and written
// later. Maintain() retries, and the journal accepts again by itself once
// the write succeeds and, after a full disk, resume_free_bytes are free.
// Open never fails because the disk is full.
//
// Not thread-safe; the broker loop owns it (the compaction thread shares
// only its job, and the writer thread only the write that is out, each
// under a mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "broker/journal_io.h"

namespace fleet::broker {

class JournalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JournalOptions {
  std::string dir;
  // The active segment is closed and a new one started past this size.
  // 64 KiB .. 16 GiB; the disk bound above grows with it.
  std::uint64_t segment_bytes = 64ull << 20;
  // fdatasync on Commit. Off only for tests and benchmarks of the format.
  bool sync = true;
  // Start past damaged records instead of refusing (--journal-recover).
  bool recover = false;
  // Null: the real file system. Must outlive the journal.
  JournalIo* io = nullptr;
  // The batch a record belongs to (compaction keeps the records of live
  // batches). Null, or an empty answer: the record is always kept.
  std::function<std::string_view(std::uint8_t type, std::string_view body)> record_key;
  // Types of records whose body is items (AppendItem), each item the id of
  // a batch: compaction keeps the items of live batches, in a record of
  // their own while any is left (record_key is not asked).
  std::vector<std::uint8_t> item_types;
};

enum class JournalState {
  kOk,       // accepting
  kNoSpace,  // the disk (or a quota) is full: waiting for space
  kFailed,   // a write or sync failed otherwise: retrying
};
const char* JournalStateName(JournalState s);

struct JournalStats {
  std::uint64_t records_replayed = 0;
  std::uint64_t segments_replayed = 0;
  std::uint64_t torn_bytes_truncated = 0;
  std::uint64_t recovered_bytes_dropped = 0;  // --journal-recover
  std::uint64_t recovered_ranges = 0;
  std::uint64_t commits = 0;
  std::uint64_t syncs = 0;
  std::uint64_t records_appended = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t refused_commits = 0;  // writes that failed (their batches refused)
  std::uint64_t large_refused = 0;    // batches refused alone: larger than the room left
  std::uint64_t unavailable_episodes = 0;
  std::uint64_t compactions = 0;
  std::uint64_t compaction_failures = 0;
  std::uint64_t segments_deleted = 0;
  // Gauges.
  std::uint64_t bytes_on_disk = 0;  // every segment, the active one included
  std::uint64_t live_bytes = 0;     // accepted records of unfinished batches
  std::uint64_t segments = 0;
};

// Little-endian u32 as the record format writes them (also for the fields
// the broker puts in its record bodies).
void PutLe32(std::string& out, std::uint32_t v);
std::uint32_t ReadLe32(const char* p);
// "u32 length | bytes": an item of Journal::AppendItem, and a field of the
// broker's record bodies. TakeItem takes the one at the front of `*in`;
// false, `*in` unchanged, when fewer than 4 bytes are left or the length
// runs past the end.
void PutItem(std::string& out, std::string_view item);
bool TakeItem(std::string_view* in, std::string_view* item);

// CRC-32C (Castagnoli), as used by the record format.
// With SSE 4.2 where the CPU has it; Crc32cPortable is the table version
// (the same values, for tests and other CPUs).
std::uint32_t Crc32c(std::string_view data, std::uint32_t crc = 0);
std::uint32_t Crc32cPortable(std::string_view data, std::uint32_t crc = 0);

class Journal {
 public:
  using Visitor =
      std::function<void(std::uint64_t segment, std::uint8_t type, std::string_view body)>;
  // Ids of the unfinished batches whose accepted record is in a segment
  // numbered <= `upto`.
  using LiveIds = std::function<std::vector<std::string>(std::uint64_t upto)>;
  static constexpr std::uint32_t kMaxRecordBytes = 256u << 20;
  static constexpr std::size_t kRecordHeader = 13;
  static constexpr std::size_t kSegmentHeader = 16;
  static constexpr std::uint64_t RecordBytes(std::size_t body) { return kRecordHeader + body; }

  // Creates DIR if needed, replays it through `visit` (with the number of
  // the segment each record is in) and opens a new active segment. Throws
  // JournalError on damage (see above) or an unusable directory; never
  // because the disk is full.
  static std::unique_ptr<Journal> Open(const JournalOptions& options, const Visitor& visit);
  // Writes what is buffered; waits for a running compaction to stop.
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Buffers one record. Requires: body.size() <= kMaxRecordBytes.
  // `must_sync`: an acknowledgement waits for it; the next Commit syncs,
  // and if that Commit fails the record is dropped. Records without it are
  // written by the next Commit that can, synced with the next one that
  // must (or by the OS): losing them in a crash must be harmless.
  void Append(std::uint8_t type, std::string_view body, bool must_sync = true);
  // The same, with a body made of `parts` one after the other (no copy of
  // them is made to join them).
  void Append(std::uint8_t type, std::initializer_list<std::string_view> parts,
              bool must_sync = true);
  // Buffers `item` as one more item of a record of `type` whose body is
  // items, each "u32 length | item" (ForEachItem reads them), not synced on
  // its own (as Append with must_sync false). Items appended one after the
  // other go in one record; an item of another type, another Append that
  // needs no sync, a write, or kMaxItemsBytes of items start the next one.
  // Throws JournalError for an item over kMaxItemsBytes - 4 bytes; if an
  // allocation throws, nothing was appended.
  void AppendItem(std::uint8_t type, std::string_view item);
  static constexpr std::size_t kMaxItemsBytes = 1u << 20;
  // Calls `f(item)` for each item of a body made by AppendItem; false when
  // the body is not one (a length runs past its end), after the items
  // before that.
  template <class F>
  static bool ForEachItem(std::string_view body, F&& f) {
    std::string_view item;
    while (!body.empty()) {
      if (!TakeItem(&body, &item)) return false;
      f(item);
    }
    return true;
  }

  enum class CommitResult {
    kNothing,  // nothing to write
    kWritten,  // on disk (synced if a must-sync record was among it)
    kRefused,  // the write failed: this turn's must-sync records were dropped
  };
  CommitResult Commit();
  bool pending() const { return !sync_buffer_.empty() || !lazy_buffer_.empty(); }
  // Whether a must-sync record waits for the next write.
  bool has_sync_records() const { return !sync_buffer_.empty(); }
  std::size_t buffered_bytes() const { return sync_buffer_.size() + lazy_buffer_.size(); }

  // Commit off the loop (how the broker runs it). StartWrite hands what is
  // buffered to the journal's writer thread and returns at once; wake_fd()
  // turns readable when that write, and its fdatasync when a must-sync
  // record is among it, is done; FinishWrite, on the loop, collects the
  // result as Commit would have returned it. One write at a time: what is
  // appended meanwhile goes with the next (group commit). While a write is
  // out, the records it carries are in active_segment(). Commit() waits for
  // a write that is out and drops its result: use one way or the other.
  enum class StartResult {
    kNothing,  // nothing to write (or only records that wait while unavailable)
    kStarted,  // writing; FinishWrite when wake_fd() is readable
    kRefused,  // no file to write to: this turn's must-sync records were dropped
  };
  StartResult StartWrite();
  bool writing() const { return writing_; }
  // Starts the writer thread on first use. Readable (an eventfd) while a
  // finished write waits for FinishWrite.
  int wake_fd();
  // Requires writing(); waits for the write if it is still going.
  CommitResult FinishWrite();

  JournalState state() const { return state_; }
  bool accepting() const { return state_ == JournalState::kOk; }
  // Whether a new batch's accepted record of `bytes` may be appended now:
  // the journal accepts, and the free space last seen on the disk, less
  // what was written and buffered since and a reserve for the records of
  // finishing batches, holds it. When it does not, the journal turns
  // kNoSpace (at once, before any write fails: a burst larger than the
  // disk would otherwise be accepted whole and refused whole, again and
  // again) and accepts again once resume_free_bytes are free -- unless the
  // batch alone is larger than that while at least that much is free: then
  // only that batch is refused (counted in large_refused).
  bool Admit(std::uint64_t bytes);
  // Why it is not accepting ("" while it is).
  const std::string& problem() const { return problem_; }
  int problem_errno() const { return problem_errno_; }

  // The segment the next records go to.
  std::uint64_t active_segment() const { return active_number_; }
  // A batch whose accepted record (of `bytes`) is in `segment` is unfinished
  // / has finished (AddLive: `batches` of them, `bytes` together). Segments merged by a compaction count as the one that
  // replaced them.
  void AddLive(std::uint64_t segment, std::uint64_t bytes, std::uint64_t batches = 1);
  void RemoveLive(std::uint64_t segment, std::uint64_t bytes);

  // Housekeeping (the loop's tick): collects a finished compaction, retries
  // writing while unavailable, deletes dead segments, starts a compaction
  // when one is due. True when the journal turned accepting again.
  bool Maintain(const LiveIds& live_ids);
  bool compacting() const { return job_ != nullptr; }
  // Blocks until a running compaction has finished and is collected.
  void WaitForCompaction();

  const JournalStats& stats() const { return stats_; }
  std::uint64_t active_bytes() const { return active_bytes_; }
  std::size_t segment_count() const { return segments_.size(); }
  // Free bytes needed again before accepting after a full disk.
  std::uint64_t resume_free_bytes() const;

 private:
  struct Segment {
    std::uint64_t bytes = 0;       // on disk
    std::uint64_t live_count = 0;  // unfinished batches accepted in it
    std::uint64_t live_bytes = 0;
  };
  struct Job;
  struct Writer;

  explicit Journal(JournalOptions options);
  void Replay(const Visitor& visit);
  std::string SegmentPath(std::uint64_t number) const;
  // Starts segment `number` (its header goes out with its first write).
  // False (and the journal unavailable) when the file cannot be created.
  bool OpenSegment(std::uint64_t number);
  // Writes the buffers; 0 or the errno (the journal is then unavailable).
  int WriteBuffers(bool include_sync_records, bool force_sync = false);
  void BecomeUnavailable(int error, const std::string& what);
  void DeleteDeadSegments();
  void MaybeStartCompaction(const LiveIds& live_ids);
  void CollectCompaction(bool wait);
  void RefreshGauges();
  Segment& SegmentFor(std::uint64_t number);
  // Accounts `bytes` written to the active segment.
  void Wrote(std::uint64_t bytes);
  // Completes the record AppendItem has open, if any (its header).
  void CloseItems();

  JournalOptions options_;
  JournalIo& io_;
  std::map<std::uint64_t, Segment> segments_;  // on disk, by number
  std::unique_ptr<JournalFile> file_;          // the active segment
  std::uint64_t active_number_ = 0;
  std::uint64_t active_bytes_ = 0;
  std::string sync_buffer_;  // must-sync records since the last Commit
  std::string lazy_buffer_;  // the others, kept until written
  // AppendItem's open record: where its header is in lazy_buffer_ (npos:
  // none) and its type.
  std::size_t items_at_ = std::string::npos;
  std::uint8_t items_type_ = 0;
  bool unsynced_ = false;    // the active segment has records written but not synced
  JournalState state_ = JournalState::kOk;
  std::string problem_;
  int problem_errno_ = 0;
  std::unique_ptr<Job> job_;
  std::unique_ptr<Writer> writer_;  // StartWrite's thread, once used
  bool writing_ = false;
  std::uint64_t writing_bytes_ = 0;  // of the write that is out
  std::thread job_thread_;
  int compaction_backoff_ = 0;  // ticks to wait after a failed compaction
  // Free bytes on the disk at the last look, less what was written since;
  // empty when the file system cannot tell.
  std::optional<std::uint64_t> space_;
  // Segments a compaction replaced but could not remove (retried by
  // Maintain; no segment is deleted while any is left).
  std::vector<std::uint64_t> leftovers_;
  JournalStats stats_;
};

}  // namespace fleet::broker

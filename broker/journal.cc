#include "broker/journal.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <system_error>

#include <sys/eventfd.h>
#include <unistd.h>

#include "common/string_map.h"

namespace fleet::broker {

namespace {

constexpr std::string_view kMagic = "fleetj2\n";
constexpr std::size_t kLegacyHeader = 9;  // length, crc, type
constexpr std::uint32_t kLengthMask = 0xa282ead8u;
// Written to the file system in pieces of about this size by compaction.
constexpr std::size_t kCopyChunk = 1u << 20;
// Housekeeping ticks to wait after a compaction failed before the next.
constexpr int kCompactionBackoffTicks = 20;
// Room kept on the disk for the records of finishing batches (finished,
// dispatched, also the dispatched ones a broker writing off its loop
// appends only when its next write starts): new batches are refused before
// it is used.
constexpr std::uint64_t kReserveBytes = 64u << 10;

std::array<std::uint32_t, 256> MakeCrcTable() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

std::uint64_t ReadLe64(const char* p) {
  return std::uint64_t(ReadLe32(p)) | std::uint64_t(ReadLe32(p + 4)) << 32;
}

void PutLe64(std::string& out, std::uint64_t v) {
  PutLe32(out, static_cast<std::uint32_t>(v));
  PutLe32(out, static_cast<std::uint32_t>(v >> 32));
}

std::string SegmentFile(const std::string& dir, std::uint64_t number) {
  char name[64];
  std::snprintf(name, sizeof name, "/journal-%016llu.log",
                static_cast<unsigned long long>(number));
  return dir + name;
}

bool AllZero(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == 0; });
}

std::uint32_t LengthCheck(const char* len_bytes) {
  return Crc32c(std::string_view(len_bytes, 4)) ^ kLengthMask;
}

std::string SegmentHeader(std::uint64_t first) {
  std::string h(kMagic);
  PutLe64(h, first);
  return h;
}

void StoreLe32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Fills in the header of the record at `at` in `out`, whose body runs to
// the end of `out`. The CRC runs over the length, then over the type and
// body as they lie in `out`: two runs, not one per field, since short
// records are most of what the broker appends (a dispatched record is a
// count and an id). The length check is the CRC of the same four length
// bytes, so it is computed once.
void FinishRecord(std::string& out, std::size_t at, std::uint8_t type) {
  const std::size_t size = out.size() - at - Journal::kRecordHeader;
  char* head = out.data() + at;
  StoreLe32(head, static_cast<std::uint32_t>(size));
  const std::uint32_t length_crc = Crc32c(std::string_view(head, 4));
  StoreLe32(head + 4, length_crc ^ kLengthMask);
  head[12] = static_cast<char>(type);
  StoreLe32(head + 8, Crc32c(std::string_view(head + 12, 1 + size), length_crc));
}

constexpr char kZeroHeader[Journal::kRecordHeader] = {};

// One record whose body is the `n` parts one after the other.
void EncodeRecord(std::string& out, std::uint8_t type, const std::string_view* parts,
                  std::size_t n) {
  std::size_t size = 0;
  for (std::size_t i = 0; i < n; ++i) size += parts[i].size();
  const std::size_t at = out.size();
  out.reserve(at + sizeof kZeroHeader + size);
  out.append(kZeroHeader, sizeof kZeroHeader);
  for (std::size_t i = 0; i < n; ++i) out.append(parts[i]);
  FinishRecord(out, at, type);
}

void EncodeRecord(std::string& out, std::uint8_t type, std::string_view body) {
  EncodeRecord(out, type, &body, 1);
}

// What a segment's first bytes say about it.
struct SegmentFormat {
  enum Kind { kV2, kLegacy, kTornHeader, kUnknown } kind = kUnknown;
  std::uint64_t first = 0;  // kV2: the lowest segment number it stands for
  std::size_t records_at = 0;
};

SegmentFormat ReadFormat(std::string_view data) {
  SegmentFormat f;
  if (data.size() >= Journal::kSegmentHeader && data.substr(0, kMagic.size()) == kMagic) {
    f.kind = SegmentFormat::kV2;
    f.first = ReadLe64(data.data() + kMagic.size());
    f.records_at = Journal::kSegmentHeader;
  } else if (data.size() < Journal::kSegmentHeader &&
             (data.size() < kMagic.size() ? kMagic.substr(0, data.size()) == data
                                          : data.substr(0, kMagic.size()) == kMagic)) {
    f.kind = SegmentFormat::kTornHeader;
  } else if (data.size() >= 4 && ReadLe32(data.data()) <= Journal::kMaxRecordBytes) {
    f.kind = SegmentFormat::kLegacy;
  }
  return f;
}

enum class Check { kOk, kTorn, kCorrupt };

struct RecordCheck {
  Check check = Check::kOk;
  std::size_t size = 0;  // kOk: the whole record
  std::uint8_t type = 0;
  std::string_view body;
  const char* problem = "";
};

RecordCheck CheckV2(std::string_view data, std::size_t pos) {
  RecordCheck r;
  const std::size_t rem = data.size() - pos;
  const char* p = data.data() + pos;
  if (rem < Journal::kRecordHeader) {
    r.check = Check::kTorn;
    r.problem = "a record header cut short";
    return r;
  }
  const std::uint32_t len = ReadLe32(p);
  if (ReadLe32(p + 4) != LengthCheck(p)) {
    const bool zeros = AllZero(data.substr(pos));
    r.check = zeros ? Check::kTorn : Check::kCorrupt;
    r.problem = zeros ? "zeros" : "a record whose length field is damaged";
    return r;
  }
  if (len > Journal::kMaxRecordBytes) {
    r.check = Check::kCorrupt;
    r.problem = "a record longer than the format allows";
    return r;
  }
  if (rem - Journal::kRecordHeader < len) {
    r.check = Check::kTorn;
    r.problem = "a record running past the end of the file";
    return r;
  }
  std::uint32_t crc = Crc32c(std::string_view(p, 4));
  crc = Crc32c(std::string_view(p + 12, 1 + len), crc);
  if (crc != ReadLe32(p + 8)) {
    r.check = Check::kCorrupt;
    r.problem = "a complete record failing its checksum";
    return r;
  }
  r.size = Journal::kRecordHeader + len;
  r.type = static_cast<std::uint8_t>(p[12]);
  r.body = std::string_view(p + 13, len);
  return r;
}

RecordCheck CheckLegacy(std::string_view data, std::size_t pos) {
  RecordCheck r;
  const std::size_t rem = data.size() - pos;
  const char* p = data.data() + pos;
  if (rem < kLegacyHeader) {
    r.check = Check::kTorn;
    r.problem = "a record header cut short";
    return r;
  }
  const std::uint32_t len = ReadLe32(p);
  if (len > Journal::kMaxRecordBytes || rem - kLegacyHeader < len) {
    r.check = Check::kTorn;
    r.problem = "a record running past the end of the file";
    return r;
  }
  if (Crc32c(std::string_view(p + 8, 1 + len)) != ReadLe32(p + 4)) {
    // The old format cannot tell a damaged length from a torn write: only
    // a bad record with data after it is certainly damage.
    const bool more = kLegacyHeader + len < rem && !AllZero(data.substr(pos));
    r.check = more ? Check::kCorrupt : Check::kTorn;
    r.problem = "a record failing its checksum";
    return r;
  }
  r.size = kLegacyHeader + len;
  r.type = static_cast<std::uint8_t>(p[8]);
  r.body = std::string_view(p + 9, len);
  return r;
}

RecordCheck CheckAt(std::string_view data, std::size_t pos, bool legacy) {
  return legacy ? CheckLegacy(data, pos) : CheckV2(data, pos);
}

}  // namespace

const char* JournalStateName(JournalState s) {
  switch (s) {
    case JournalState::kOk: return "ok";
    case JournalState::kNoSpace: return "disk_full";
    case JournalState::kFailed: return "failed";
  }
  return "?";
}

std::uint32_t ReadLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return std::uint32_t(u[0]) | std::uint32_t(u[1]) << 8 | std::uint32_t(u[2]) << 16 |
         std::uint32_t(u[3]) << 24;
}

void PutLe32(std::string& out, std::uint32_t v) {
  char b[4];
  StoreLe32(b, v);
  out.append(b, 4);
}

void PutItem(std::string& out, std::string_view item) {
  PutLe32(out, static_cast<std::uint32_t>(item.size()));
  out.append(item);
}

bool TakeItem(std::string_view* in, std::string_view* item) {
  if (in->size() < 4) return false;
  const std::uint32_t n = ReadLe32(in->data());
  if (in->size() - 4 < n) return false;
  *item = in->substr(4, n);
  in->remove_prefix(4 + std::size_t{n});
  return true;
}

std::uint32_t Crc32cPortable(std::string_view data, std::uint32_t crc) {
  static const std::array<std::uint32_t, 256> table = MakeCrcTable();
  crc = ~crc;
  for (unsigned char c : data) crc = table[(crc ^ c) & 0xff] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)
namespace {
// SSE 4.2's crc32 instruction computes CRC-32C (same reflected polynomial),
// 8 bytes at a time: the journal checks every byte it writes and reads.
__attribute__((target("sse4.2"))) std::uint32_t Crc32cSse42(std::string_view data,
                                                            std::uint32_t crc) {
  const char* p = data.data();
  std::size_t n = data.size();
  std::uint64_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  // The tail in at most three steps, not one per byte.
  if (n >= 4) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    c32 = __builtin_ia32_crc32si(c32, v);
    p += 4;
    n -= 4;
  }
  if (n >= 2) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    c32 = __builtin_ia32_crc32hi(c32, v);
    p += 2;
    n -= 2;
  }
  if (n > 0) c32 = __builtin_ia32_crc32qi(c32, static_cast<unsigned char>(*p));
  return ~c32;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
}  // namespace

std::uint32_t Crc32c(std::string_view data, std::uint32_t crc) {
  return kHaveSse42 ? Crc32cSse42(data, crc) : Crc32cPortable(data, crc);
}
#else
std::uint32_t Crc32c(std::string_view data, std::uint32_t crc) {
  return Crc32cPortable(data, crc);
}
#endif

// ---- compaction job (runs on its own thread) ----

struct Journal::Job {
  JournalIo* io = nullptr;
  std::string dir;
  std::vector<std::uint64_t> inputs;  // ascending; the last one is replaced
  StringSet live;
  std::function<std::string_view(std::uint8_t, std::string_view)> record_key;
  std::vector<std::uint8_t> item_types;
  std::atomic<bool> cancel{false};
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;     // guarded by mu
  bool renamed = false;  // the new file replaced the last input
  std::string error;     // "" when it went through
  std::uint64_t bytes_before = 0;
  std::uint64_t bytes_after = 0;
  std::uint64_t records_kept = 0;

  std::string Path(std::uint64_t n) const { return SegmentFile(dir, n); }

  void Run() {
    const std::string target = Path(inputs.back());
    const std::string tmp = target + ".compact";
    std::string failure = Copy(tmp, target);
    if (!failure.empty()) io->Remove(tmp);
    std::lock_guard<std::mutex> lock(mu);
    error = std::move(failure);
    done = true;
    cv.notify_all();
  }

  // Writes the live records of every input to `tmp`, and moves it over
  // `target`; then the other inputs go. "" or what failed.
  std::string Copy(const std::string& tmp, const std::string& target) {
    io->Remove(tmp);
    std::unique_ptr<JournalFile> out;
    if (int e = io->OpenAppend(tmp, &out)) return "create " + tmp + ": " + ErrnoText(e);
    std::string buffer = SegmentHeader(inputs.front());
    std::uint64_t written = 0;
    auto flush = [&]() -> int {
      const std::string_view part = buffer;
      const int e = out->Append(&part, 1);
      written += buffer.size();
      buffer.clear();
      return e;
    };
    std::string data;
    std::string items;  // the live items of a record of items
    for (std::uint64_t n : inputs) {
      if (cancel) return "cancelled";
      const std::string path = Path(n);
      if (int e = io->ReadFile(path, UINT64_MAX, &data)) return "read " + path + ": " + ErrnoText(e);
      bytes_before += data.size();
      const SegmentFormat f = ReadFormat(data);
      if (f.kind != SegmentFormat::kV2 && f.kind != SegmentFormat::kLegacy) {
        if (data.empty()) continue;
        return "unreadable segment header in " + path;
      }
      const bool legacy = f.kind == SegmentFormat::kLegacy;
      for (std::size_t pos = f.records_at; pos < data.size();) {
        const RecordCheck r = CheckAt(data, pos, legacy);
        if (r.check != Check::kOk) {
          return std::string(r.problem) + " at offset " + std::to_string(pos) + " of " + path;
        }
        if (std::find(item_types.begin(), item_types.end(), r.type) != item_types.end()) {
          items.clear();
          const bool readable = Journal::ForEachItem(r.body, [&](std::string_view id) {
            if (live.find(id) != live.end()) PutItem(items, id);
          });
          if (!readable || !items.empty()) {
            EncodeRecord(buffer, r.type, readable ? std::string_view(items) : r.body);
            ++records_kept;
          }
        } else if (const std::string_view key =
                       record_key ? record_key(r.type, r.body) : std::string_view();
                   key.empty() || live.find(key) != live.end()) {
          EncodeRecord(buffer, r.type, r.body);
          ++records_kept;
        }
        if (buffer.size() >= kCopyChunk) {
          if (int e = flush()) return "write " + tmp + ": " + ErrnoText(e);
        }
        pos += r.size;
      }
    }
    if (int e = flush()) return "write " + tmp + ": " + ErrnoText(e);
    if (int e = out->Sync()) return "fdatasync " + tmp + ": " + ErrnoText(e);
    out.reset();
    bytes_after = written;
    if (int e = io->Rename(tmp, target)) return "rename " + tmp + ": " + ErrnoText(e);
    renamed = true;
    // From here the new file stands for every input (its header says so),
    // even if the removals below do not happen.
    if (int e = io->SyncDir(dir)) return "fsync " + dir + ": " + ErrnoText(e);
    for (std::size_t i = 0; i + 1 < inputs.size(); ++i) {
      const int e = io->Remove(Path(inputs[i]));
      if (e != 0 && e != ENOENT) return "remove " + Path(inputs[i]) + ": " + ErrnoText(e);
    }
    if (int e = io->SyncDir(dir)) return "fsync " + dir + ": " + ErrnoText(e);
    return "";
  }
};

// ---- writer (StartWrite's thread) ----

// The loop fills `header`, `sync_part` and `lazy_part` and sets `job`; the
// thread writes them to `file`, syncs when `syncing`, cuts a failed write
// off at `truncate_to`, sets `error` and `done` and writes to the eventfd.
// The loop touches the parts and the file only while no job is out.
struct Journal::Writer {
  std::mutex mu;
  std::condition_variable cv;
  bool job = false;
  bool done = false;
  bool stop = false;
  JournalFile* file = nullptr;
  std::string header, sync_part, lazy_part;
  bool syncing = false;  // fdatasync after the write
  std::uint64_t truncate_to = 0;
  int error = 0;
  bool synced = false;
  int wake_fd = -1;
  std::thread thread;

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return job || stop; });
      if (!job) return;
      lock.unlock();
      // The records that need no sync first. Each is of a batch accepted in
      // an earlier write (a batch is dispatched only once its write is
      // done), or put back from a failed write, so they come before the
      // accepted records of this one -- also when an id finished, lost its
      // result and was sent again since: its finished record must not
      // follow the new accepted one.
      std::string_view parts[3] = {header, lazy_part, sync_part};
      int e = file->Append(parts, 3);
      bool did_sync = false;
      if (e == 0 && syncing) {
        e = file->Sync();
        did_sync = e == 0;
      }
      if (e != 0) {
        if (const int t = file->Truncate(truncate_to)) {
          spdlog::error("journal: cannot cut a failed write off the active segment: {}",
                        ErrnoText(t));
        }
      }
      lock.lock();
      error = e;
      synced = did_sync;
      job = false;
      done = true;
      cv.notify_all();
      const std::uint64_t one = 1;
      // Cannot fail short of a counter at 2^64 - 1 (it is read after each).
      [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
    }
  }
};

// ---- journal ----

Journal::Journal(JournalOptions options)
    : options_(std::move(options)),
      io_(options_.io != nullptr ? *options_.io : JournalIo::Default()) {}

Journal::~Journal() {
  if (writing_) FinishWrite();
  if (writer_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(writer_->mu);
      writer_->stop = true;
    }
    writer_->cv.notify_all();
    writer_->thread.join();
    ::close(writer_->wake_fd);
  }
  if (job_ != nullptr) {
    job_->cancel = true;
    CollectCompaction(/*wait=*/true);
  }
  if (file_ != nullptr && pending()) {
    if (int e = WriteBuffers(/*include_sync_records=*/true, /*force_sync=*/true)) {
      spdlog::error("journal: could not write its last records to {}: {}",
                    SegmentPath(active_number_), ErrnoText(e));
    }
  }
}

std::string Journal::SegmentPath(std::uint64_t number) const {
  return SegmentFile(options_.dir, number);
}

std::uint64_t Journal::resume_free_bytes() const {
  return std::max<std::uint64_t>(64u << 10,
                                 std::min<std::uint64_t>(1u << 20, options_.segment_bytes / 4));
}

std::unique_ptr<Journal> Journal::Open(const JournalOptions& options, const Visitor& visit) {
  if (options.dir.empty()) throw JournalError("journal: no directory given");
  std::unique_ptr<Journal> j(new Journal(options));
  JournalIo& io = j->io_;
  if (int e = io.MakeDir(options.dir)) {
    throw JournalError("journal: cannot create " + options.dir + ": " + ErrnoText(e));
  }
  std::vector<std::string> names;
  if (int e = io.List(options.dir, &names)) {
    throw JournalError("journal: cannot read " + options.dir + ": " + ErrnoText(e));
  }
  for (const std::string& name : names) {
    unsigned long long n = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "journal-%16llu.lo%c", &n, &tail) == 2 && tail == 'g') {
      if (name.size() == 28) {
        j->segments_[n] = Segment{};
      } else if (name.size() > 28 &&
                 (name.compare(28, std::string::npos, ".compact") == 0 ||
                  name.compare(28, std::string::npos, ".recover") == 0)) {
        // A compaction or recovery that a crash cut short: its source files
        // are all still there. (Other names, an operator's copies, stay.)
        io.Remove(options.dir + "/" + name);
      }
    }
  }
  j->Replay(visit);
  // What a killed broker left in the page cache (records written but not
  // synced) goes to disk now: once a newer segment exists, a torn tail in
  // these would stop the start instead of being cut off.
  if (options.sync) {
    for (const auto& [n, seg] : j->segments_) {
      if (int e = io.SyncFile(j->SegmentPath(n))) {
        throw JournalError("journal: sync " + j->SegmentPath(n) + ": " + ErrnoText(e));
      }
    }
  }
  const std::uint64_t next = j->segments_.empty() ? 1 : j->segments_.rbegin()->first + 1;
  j->active_number_ = next;  // also where Maintain retries when it cannot be created now
  if (!j->OpenSegment(next) && j->state_ == JournalState::kFailed) {
    throw JournalError(j->problem_);
  }
  j->space_ = io.FreeBytes(options.dir);
  j->RefreshGauges();
  return j;
}

void Journal::Replay(const Visitor& visit) {
  // A compacted segment stands for every segment from its header's `first`
  // up to itself: those still here are left over from a crash between the
  // compaction's rename and its removals, and are not read.
  std::string head;
  std::vector<std::uint64_t> stale;
  for (const auto& [n, seg] : segments_) {
    if (io_.ReadFile(SegmentPath(n), kSegmentHeader, &head) != 0) continue;
    const SegmentFormat f = ReadFormat(head);
    if (f.kind != SegmentFormat::kV2 || f.first >= n) continue;
    for (auto it = segments_.lower_bound(f.first); it != segments_.end() && it->first < n; ++it) {
      stale.push_back(it->first);
    }
  }
  for (std::uint64_t n : stale) {
    if (segments_.erase(n) == 0) continue;
    spdlog::info("journal: removing {}, replaced by a compaction", SegmentPath(n));
    if (int e = io_.Remove(SegmentPath(n)); e != 0 && e != ENOENT) {
      throw JournalError("journal: remove " + SegmentPath(n) + ": " + ErrnoText(e));
    }
  }

  // The newest segment with data is where a crash can leave a torn tail (a
  // crash right after a restart leaves an empty segment after it).
  std::uint64_t newest_with_data = 0;
  for (const auto& [n, seg] : segments_) {
    std::uint64_t size = 0;
    if (io_.Size(SegmentPath(n), &size) == 0 && size > 0) newest_with_data = n;
  }

  std::string data;
  for (auto it = segments_.begin(); it != segments_.end();) {
    const std::uint64_t n = it->first;
    const bool newest = n >= newest_with_data;
    const std::string path = SegmentPath(n);
    if (int e = io_.ReadFile(path, UINT64_MAX, &data)) {
      throw JournalError("journal: read " + path + ": " + ErrnoText(e));
    }
    const SegmentFormat f = ReadFormat(data);
    std::size_t pos = f.records_at;
    // With --journal-recover, the records kept from a damaged segment
    // (views into `data`), for rewriting it.
    std::vector<std::pair<std::uint8_t, std::string_view>> kept;
    bool damaged = false;
    auto refuse = [&](std::size_t at, const std::string& problem) {
      throw JournalError(fmt::format(
          "journal: {} at offset {} of {} ({} bytes from there to the end of the segment): "
          "refusing to start, since acknowledged batches may be in it. Restore the directory "
          "from a backup, or start fleet-broker once with --journal-recover to keep every "
          "record that checks out and drop the damaged bytes (it logs what it drops)",
          problem, at, path, data.size() - at));
    };

    if (data.empty() || f.kind == SegmentFormat::kTornHeader) {
      if (!data.empty()) {
        if (!newest) refuse(0, "a segment header cut short");
        spdlog::warn("journal: {} holds only a torn header ({} bytes): removed", path,
                     data.size());
        stats_.torn_bytes_truncated += data.size();
      }
      // A run that wrote nothing: no records to keep.
      if (int e = io_.Remove(path)) {
        throw JournalError("journal: remove " + path + ": " + ErrnoText(e));
      }
      it = segments_.erase(it);
      continue;
    }
    if (f.kind == SegmentFormat::kUnknown) {
      if (!options_.recover) refuse(0, "not a journal segment (unknown header)");
      spdlog::error("journal: --journal-recover: {} is not a journal segment ({} bytes): "
                    "dropped whole",
                    path, data.size());
      stats_.recovered_bytes_dropped += data.size();
      ++stats_.recovered_ranges;
      pos = data.size();
      damaged = true;
    }
    const bool legacy = f.kind == SegmentFormat::kLegacy;
    while (pos < data.size()) {
      const RecordCheck r = CheckAt(data, pos, legacy);
      if (r.check == Check::kOk) {
        visit(n, r.type, r.body);
        ++stats_.records_replayed;
        if (options_.recover) kept.emplace_back(r.type, r.body);
        pos += r.size;
        continue;
      }
      const bool zeros = AllZero(std::string_view(data).substr(pos));
      if (r.check == Check::kTorn && (newest || zeros)) {
        // A torn tail: the end of the last write before a crash. Cut off.
        spdlog::warn("journal: truncating a torn tail of {} bytes at offset {} of {} ({}); "
                     "the records before it are intact",
                     data.size() - pos, pos, path, r.problem);
        stats_.torn_bytes_truncated += data.size() - pos;
        if (int e = io_.TruncateFile(path, pos)) {
          throw JournalError("journal: truncate " + path + ": " + ErrnoText(e));
        }
        data.resize(pos);
        break;
      }
      const std::string problem =
          r.check == Check::kTorn ? std::string(r.problem) + " in a segment that is not the newest"
                                  : std::string(r.problem);
      if (!options_.recover) refuse(pos, problem);
      // Skip to the next offset where a whole record checks out.
      std::size_t next = pos + 1;
      while (next < data.size() && CheckAt(data, next, legacy).check != Check::kOk) ++next;
      spdlog::error("journal: --journal-recover: dropped {} bytes at offset {} of {} ({}); "
                    "any batch accepted in them is lost, its producer is told 'unknown' "
                    "when it fetches it",
                    next - pos, pos, path, problem);
      stats_.recovered_bytes_dropped += next - pos;
      ++stats_.recovered_ranges;
      damaged = true;
      pos = next;
    }
    ++stats_.segments_replayed;
    if (damaged) {
      // Rewrite the segment with what checked out, so the next start is clean.
      std::string out = SegmentHeader(f.kind == SegmentFormat::kV2 ? f.first : n);
      for (const auto& [type, body] : kept) EncodeRecord(out, type, body);
      const std::string tmp = path + ".recover";
      std::unique_ptr<JournalFile> file;
      io_.Remove(tmp);
      int e = io_.OpenAppend(tmp, &file);
      const std::string_view part = out;
      if (e == 0) e = file->Append(&part, 1);
      if (e == 0 && options_.sync) e = file->Sync();
      file.reset();
      if (e == 0) e = io_.Rename(tmp, path);
      if (e == 0 && options_.sync) e = io_.SyncDir(options_.dir);
      if (e != 0) {
        io_.Remove(tmp);
        throw JournalError("journal: --journal-recover could not rewrite " + path + ": " +
                           ErrnoText(e));
      }
      spdlog::warn("journal: --journal-recover: rewrote {} with its {} intact records", path,
                   kept.size());
      it->second.bytes = out.size();
    } else {
      it->second.bytes = data.size();
    }
    ++it;
  }
}

bool Journal::OpenSegment(std::uint64_t number) {
  // Records written without a sync to the segment being left go to disk
  // first: a later segment's synced records must never sit after a lost
  // tail of an earlier one (only the newest segment may have a torn tail).
  if (file_ != nullptr && unsynced_ && options_.sync) {
    if (const int e = file_->Sync()) {
      BecomeUnavailable(e, "fdatasync " + SegmentPath(active_number_));
      return false;
    }
    unsynced_ = false;
  }
  const std::string path = SegmentPath(number);
  std::unique_ptr<JournalFile> file;
  int e = io_.OpenAppend(path, &file);
  if (e == 0 && options_.sync) {
    e = io_.SyncDir(options_.dir);
    if (e != 0) io_.Remove(path);
  }
  if (e != 0) {
    BecomeUnavailable(e, "create " + path);
    return false;
  }
  file_ = std::move(file);
  active_number_ = number;
  active_bytes_ = 0;
  segments_[number] = Segment{};
  return true;
}

void Journal::Append(std::uint8_t type, std::string_view body, bool must_sync) {
  Append(type, {body}, must_sync);
}

void Journal::Append(std::uint8_t type, std::initializer_list<std::string_view> parts,
                     bool must_sync) {
  std::size_t size = 0;
  for (std::string_view p : parts) size += p.size();
  if (size > kMaxRecordBytes) throw JournalError("journal: record too large");
  if (!must_sync) CloseItems();  // the records keep their order
  EncodeRecord(must_sync ? sync_buffer_ : lazy_buffer_, type, parts.begin(), parts.size());
  ++stats_.records_appended;
}

void Journal::AppendItem(std::uint8_t type, std::string_view item) {
  if (item.size() > kMaxItemsBytes - 4) throw JournalError("journal: record item too large");
  if (items_at_ != std::string::npos &&
      (items_type_ != type ||
       lazy_buffer_.size() - items_at_ - kRecordHeader + 4 + item.size() > kMaxItemsBytes)) {
    CloseItems();
  }
  const bool open = items_at_ == std::string::npos;
  // The one allocation first: if it throws, no record is left half-made.
  lazy_buffer_.reserve(lazy_buffer_.size() + (open ? kRecordHeader : 0) + 4 + item.size());
  if (open) {
    items_at_ = lazy_buffer_.size();
    items_type_ = type;
    lazy_buffer_.append(kZeroHeader, sizeof kZeroHeader);  // CloseItems fills it in
    ++stats_.records_appended;
  }
  PutItem(lazy_buffer_, item);
}

void Journal::CloseItems() {
  if (items_at_ == std::string::npos) return;
  FinishRecord(lazy_buffer_, items_at_, items_type_);
  items_at_ = std::string::npos;
}

int Journal::WriteBuffers(bool include_sync_records, bool force_sync) {
  CloseItems();
  if (file_ == nullptr) return problem_errno_ != 0 ? problem_errno_ : EIO;
  std::string header;
  std::string_view parts[3];
  std::size_t n = 0;
  if (active_bytes_ == 0) {
    header = SegmentHeader(active_number_);
    parts[n++] = header;
  }
  const bool with_sync_records = include_sync_records && !sync_buffer_.empty();
  const bool syncing = with_sync_records || force_sync;
  // Which buffer goes first: see Writer::Run. Without the writer (Commit
  // once per turn), a batch accepted and finished in one turn needs its
  // accepted record first.
  const bool lazy_first = writer_ != nullptr;
  if (lazy_first) parts[n++] = lazy_buffer_;
  if (with_sync_records) parts[n++] = sync_buffer_;
  if (!lazy_first) parts[n++] = lazy_buffer_;
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) total += parts[i].size();
  if (total == header.size()) return 0;  // no records
  int e = file_->Append(parts, n);
  if (e == 0 && options_.sync && syncing) {
    e = file_->Sync();
    if (e == 0) ++stats_.syncs;
  }
  if (e == 0) unsynced_ = !syncing;
  if (e != 0) {
    // Nothing half-written stays before later records, and a batch whose
    // write failed is not on the file to come back at the next start.
    if (const int t = file_->Truncate(active_bytes_)) {
      spdlog::error("journal: cannot cut a failed write off {}: {}", SegmentPath(active_number_),
                    ErrnoText(t));
    }
    return e;
  }
  Wrote(total);
  if (with_sync_records) sync_buffer_.clear();
  lazy_buffer_.clear();
  if (active_bytes_ >= options_.segment_bytes) OpenSegment(active_number_ + 1);
  return 0;
}

void Journal::Wrote(std::uint64_t bytes) {
  active_bytes_ += bytes;
  if (space_) *space_ -= std::min<std::uint64_t>(*space_, bytes);
  segments_[active_number_].bytes = active_bytes_;
  stats_.bytes_written += bytes;
  stats_.bytes_on_disk += bytes;  // exact again at the next Maintain
}

bool Journal::Admit(std::uint64_t bytes) {
  if (state_ != JournalState::kOk) return false;
  if (!space_) return true;
  const std::uint64_t want = writing_bytes_ + sync_buffer_.size() + lazy_buffer_.size() + bytes +
                             kReserveBytes + kSegmentHeader;
  if (want <= *space_) return true;
  if (bytes + kReserveBytes > resume_free_bytes() && *space_ >= resume_free_bytes()) {
    // A batch larger than the space the journal resumes at: refused alone,
    // so that it does not hold every producer's small batches back.
    ++stats_.large_refused;
    return false;
  }
  BecomeUnavailable(ENOSPC, fmt::format("no room for a new batch of {} bytes in {} ({} bytes "
                                        "free, {} kept for finishing batches)",
                                        bytes, options_.dir, *space_, kReserveBytes));
  return false;
}

Journal::CommitResult Journal::Commit() {
  if (writing_) FinishWrite();
  if (!pending()) return CommitResult::kNothing;
  const bool had_sync = !sync_buffer_.empty();
  // While unavailable, records that need no sync wait for Maintain; new
  // batches accepted before the journal turned unavailable this turn (it
  // saw the disk fill) are still written.
  if (state_ != JournalState::kOk && !had_sync) return CommitResult::kNothing;
  if (const int e = WriteBuffers(/*include_sync_records=*/true)) {
    BecomeUnavailable(e, "write " + SegmentPath(active_number_));
    sync_buffer_.clear();
    if (!had_sync) return CommitResult::kNothing;
    ++stats_.refused_commits;
    return CommitResult::kRefused;
  }
  ++stats_.commits;
  return CommitResult::kWritten;
}

int Journal::wake_fd() {
  if (writer_ == nullptr) {
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) throw JournalError("journal: eventfd: " + ErrnoText(errno));
    auto writer = std::make_unique<Writer>();
    writer->wake_fd = fd;
    try {
      writer->thread = std::thread([w = writer.get()] { w->Run(); });
    } catch (const std::system_error& e) {
      ::close(fd);
      throw JournalError(std::string("journal: cannot start its writer thread: ") + e.what());
    }
    writer_ = std::move(writer);
  }
  return writer_->wake_fd;
}

Journal::StartResult Journal::StartWrite() {
  if (writing_ || !pending()) return StartResult::kNothing;
  const bool had_sync = !sync_buffer_.empty();
  // As Commit: while unavailable, records that need no sync wait for
  // Maintain, and new batches accepted before it turned so are written.
  if (state_ != JournalState::kOk && !had_sync) return StartResult::kNothing;
  if (file_ == nullptr) {
    BecomeUnavailable(problem_errno_ != 0 ? problem_errno_ : EIO,
                      "write " + SegmentPath(active_number_));
    sync_buffer_.clear();
    if (!had_sync) return StartResult::kNothing;
    ++stats_.refused_commits;
    return StartResult::kRefused;
  }
  wake_fd();
  Writer& w = *writer_;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    // The parts were cleared by the last FinishWrite: swapping keeps both
    // sides' capacity, so a steady stream allocates nothing here.
    w.header = active_bytes_ == 0 ? SegmentHeader(active_number_) : std::string();
    CloseItems();
    w.sync_part.swap(sync_buffer_);
    w.lazy_part.swap(lazy_buffer_);
    w.syncing = had_sync && options_.sync;
    w.file = file_.get();
    w.truncate_to = active_bytes_;
    w.error = 0;
    w.synced = false;
    w.done = false;
    w.job = true;
    writing_bytes_ = w.header.size() + w.sync_part.size() + w.lazy_part.size();
  }
  w.cv.notify_all();
  writing_ = true;
  return StartResult::kStarted;
}

Journal::CommitResult Journal::FinishWrite() {
  Writer& w = *writer_;
  {
    std::unique_lock<std::mutex> lock(w.mu);
    w.cv.wait(lock, [&] { return w.done; });
    w.done = false;
  }
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(w.wake_fd, &count, sizeof count);
  writing_ = false;
  const std::uint64_t total = writing_bytes_;
  writing_bytes_ = 0;
  const bool had_sync = !w.sync_part.empty();
  if (w.error != 0) {
    BecomeUnavailable(w.error, "write " + SegmentPath(active_number_));
    // The records that need no sync are written later, before those
    // appended since; the must-sync ones are dropped (their batches are
    // refused).
    CloseItems();  // its offset is about to change
    w.lazy_part.append(lazy_buffer_);
    lazy_buffer_.swap(w.lazy_part);
    w.lazy_part.clear();
    w.sync_part.clear();
    if (!had_sync) return CommitResult::kNothing;
    ++stats_.refused_commits;
    return CommitResult::kRefused;
  }
  if (w.synced) ++stats_.syncs;
  unsynced_ = !had_sync;
  Wrote(total);
  w.sync_part.clear();
  w.lazy_part.clear();
  ++stats_.commits;
  if (active_bytes_ >= options_.segment_bytes) OpenSegment(active_number_ + 1);
  return CommitResult::kWritten;
}

void Journal::BecomeUnavailable(int error, const std::string& what) {
  const JournalState next = IsNoSpace(error) ? JournalState::kNoSpace : JournalState::kFailed;
  problem_errno_ = error;
  problem_ = "journal: " + what + ": " + ErrnoText(error);
  if (state_ == next) return;
  const bool first = state_ == JournalState::kOk;
  state_ = next;
  if (first) ++stats_.unavailable_episodes;
  if (next == JournalState::kNoSpace) {
    spdlog::error("{}: the disk is full. Refusing new batches (disk_full) until space returns; "
                  "results, FETCH and workers are still served, and finished segments are "
                  "deleted as the queue drains",
                  problem_);
  } else {
    spdlog::error("{}. Refusing new batches (disk_full) until a write succeeds; results, FETCH "
                  "and workers are still served",
                  problem_);
  }
}

void Journal::AddLive(std::uint64_t segment, std::uint64_t bytes, std::uint64_t batches) {
  Segment& s = SegmentFor(segment);
  s.live_count += batches;
  s.live_bytes += bytes;
}

void Journal::RemoveLive(std::uint64_t segment, std::uint64_t bytes) {
  Segment& s = SegmentFor(segment);
  if (s.live_count > 0) --s.live_count;
  s.live_bytes -= std::min(s.live_bytes, bytes);
}

Journal::Segment& Journal::SegmentFor(std::uint64_t number) {
  // Segments merged by a compaction are counted as the one that replaced
  // them: the first one at or after the number.
  auto it = segments_.lower_bound(number);
  if (it == segments_.end()) return segments_[active_number_];
  return it->second;
}

bool Journal::Maintain(const LiveIds& live_ids) {
  CollectCompaction(/*wait=*/false);
  bool resumed = false;
  if (state_ != JournalState::kOk && !writing_) {
    // Leave an active segment that holds batches, or is the oldest, so that
    // it can go once they finish (on a full disk nothing else frees
    // space). Not one that holds only other segments' finished records:
    // a new file per tick would fill a small disk with headers.
    const auto active = segments_.find(active_number_);
    if (file_ == nullptr) {
      OpenSegment(active_number_);
    } else if (active_bytes_ > 0 && active != segments_.end() &&
               (active->second.live_count > 0 || active == segments_.begin())) {
      OpenSegment(active_number_ + 1);
    }
    DeleteDeadSegments();
    int e = file_ == nullptr ? problem_errno_ : WriteBuffers(/*include_sync_records=*/false);
    std::optional<std::uint64_t> free;
    if (e == 0 && state_ == JournalState::kNoSpace) {
      free = io_.FreeBytes(options_.dir);
      if (free && *free < resume_free_bytes()) e = ENOSPC;
    }
    if (e == 0) {
      spdlog::info("journal: writing to {} again{}: accepting new batches",
                   SegmentPath(active_number_),
                   free ? fmt::format(" ({} bytes free)", *free) : std::string());
      state_ = JournalState::kOk;
      problem_.clear();
      problem_errno_ = 0;
      resumed = true;
    }
  } else if (state_ == JournalState::kOk) {
    DeleteDeadSegments();
    MaybeStartCompaction(live_ids);
  }
  // Not while a write is out: the disk may already show its bytes, which
  // Admit and FinishWrite count once more (too little room, needlessly).
  if (!writing_) space_ = io_.FreeBytes(options_.dir);
  RefreshGauges();
  return resumed;
}

void Journal::DeleteDeadSegments() {
  if (job_ != nullptr) return;  // the compaction reads them
  bool deleted = false;
  // Inputs of a compaction that took effect but could not remove them.
  while (!leftovers_.empty()) {
    const std::string path = SegmentPath(leftovers_.back());
    if (int e = io_.Remove(path); e != 0 && e != ENOENT) {
      spdlog::warn("journal: cannot remove {}, replaced by a compaction: {}", path, ErrnoText(e));
      return;  // nothing else goes while it is there
    }
    leftovers_.pop_back();
    deleted = true;
  }
  while (!segments_.empty()) {
    auto oldest = segments_.begin();
    if (oldest->first == active_number_ || oldest->second.live_count > 0) break;
    const std::string path = SegmentPath(oldest->first);
    if (int e = io_.Remove(path); e != 0 && e != ENOENT) {
      spdlog::warn("journal: cannot remove finished segment {}: {}", path, ErrnoText(e));
      break;
    }
    segments_.erase(oldest);
    ++stats_.segments_deleted;
    deleted = true;
  }
  if (deleted && options_.sync) {
    if (int e = io_.SyncDir(options_.dir)) {
      spdlog::warn("journal: fsync {}: {}", options_.dir, ErrnoText(e));
    }
  }
}

void Journal::MaybeStartCompaction(const LiveIds& live_ids) {
  if (job_ != nullptr) return;
  if (compaction_backoff_ > 0) {
    --compaction_backoff_;
    return;
  }
  std::uint64_t bytes = 0;
  std::uint64_t live = 0;
  std::vector<std::uint64_t> inputs;
  for (const auto& [n, s] : segments_) {
    if (n == active_number_) continue;
    bytes += s.bytes;
    live += std::min(s.live_bytes, s.bytes);
    inputs.push_back(n);
  }
  if (inputs.empty() || bytes - live < std::max(options_.segment_bytes, live)) return;
  auto job = std::make_unique<Job>();
  job->io = &io_;
  job->dir = options_.dir;
  job->inputs = inputs;
  job->record_key = options_.record_key;
  job->item_types = options_.item_types;
  for (std::string& id : live_ids(inputs.back())) job->live.insert(std::move(id));
  job_ = std::move(job);
  spdlog::info("journal: compacting segments {}..{} ({} bytes, {} of them live) off the loop",
               inputs.front(), inputs.back(), bytes, live);
  job_thread_ = std::thread([j = job_.get()] { j->Run(); });
}

void Journal::WaitForCompaction() { CollectCompaction(/*wait=*/true); }

void Journal::CollectCompaction(bool wait) {
  if (job_ == nullptr) return;
  {
    std::unique_lock<std::mutex> lock(job_->mu);
    if (!job_->done && !wait) return;
    job_->cv.wait(lock, [&] { return job_->done; });
  }
  job_thread_.join();
  Job& j = *job_;
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - j.started)
                        .count();
  if (j.renamed) {
    // The new file stands for all the inputs: their counts move into it.
    Segment merged;
    for (std::uint64_t n : j.inputs) {
      auto it = segments_.find(n);
      if (it == segments_.end()) continue;
      merged.live_count += it->second.live_count;
      merged.live_bytes += it->second.live_bytes;
      segments_.erase(it);
    }
    merged.bytes = j.bytes_after;
    segments_[j.inputs.back()] = merged;
    if (!j.error.empty()) {
      // The new file took effect but some inputs may still be on disk: they
      // must go before the new file may (its header is what tells a start
      // to skip them).
      leftovers_.assign(j.inputs.begin(), j.inputs.end() - 1);
    }
    ++stats_.compactions;
    spdlog::info("journal: compacted segments {}..{}: {} bytes became {} ({} records kept) in "
                 "{:.0f} ms",
                 j.inputs.front(), j.inputs.back(), j.bytes_before, j.bytes_after,
                 j.records_kept, ms);
  }
  RefreshGauges();
  if (!j.error.empty()) {
    ++stats_.compaction_failures;
    compaction_backoff_ = kCompactionBackoffTicks;
    spdlog::warn("journal: compaction of segments {}..{} failed: {}{}", j.inputs.front(),
                 j.inputs.back(), j.error,
                 j.renamed ? " (after it took effect; the segments it replaced are removed "
                             "later, and no segment is deleted before they are)"
                           : "; the segments are unchanged, it is tried again later");
  }
  job_.reset();
}

void Journal::RefreshGauges() {
  std::uint64_t bytes = 0;
  std::uint64_t live = 0;
  for (const auto& [n, s] : segments_) {
    bytes += s.bytes;
    live += s.live_bytes;
  }
  stats_.bytes_on_disk = bytes;
  stats_.live_bytes = live;
  stats_.segments = segments_.size();
}

}  // namespace fleet::broker

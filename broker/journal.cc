#include "broker/journal.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace fleet::broker {

namespace {

constexpr std::size_t kHeader = 9;  // length, crc, type

std::array<std::uint32_t, 256> MakeCrcTable() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string ReadWhole(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw JournalError(Errno("journal: open " + path));
  std::string data;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw JournalError(Errno("journal: read " + path));
    }
    if (n == 0) break;
    data.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return data;
}

bool AllZero(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == 0; });
}

}  // namespace

std::uint32_t ReadLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return std::uint32_t(u[0]) | std::uint32_t(u[1]) << 8 | std::uint32_t(u[2]) << 16 |
         std::uint32_t(u[3]) << 24;
}

void PutLe32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint32_t Crc32c(std::string_view data, std::uint32_t crc) {
  static const std::array<std::uint32_t, 256> table = MakeCrcTable();
  crc = ~crc;
  for (unsigned char c : data) crc = table[(crc ^ c) & 0xff] ^ (crc >> 8);
  return ~crc;
}

Journal::Journal(JournalOptions options) : options_(std::move(options)) {}

Journal::~Journal() {
  if (fd_ >= 0) {
    try {
      sync_due_ = true;
      if (!failed_) Commit();
    } catch (const JournalError& e) {
      spdlog::error("{}", e.what());
    }
    ::close(fd_);
  }
}

std::string Journal::SegmentPath(std::uint64_t number) const {
  char name[64];
  std::snprintf(name, sizeof name, "/journal-%016llu.log",
                static_cast<unsigned long long>(number));
  return options_.dir + name;
}

void Journal::SyncDir() {
  if (!options_.sync) return;
  int dfd = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw JournalError(Errno("journal: open dir " + options_.dir));
  int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) throw JournalError(Errno("journal: fsync dir " + options_.dir));
}

std::unique_ptr<Journal> Journal::Open(const JournalOptions& options, const Visitor& visit) {
  if (options.dir.empty()) throw JournalError("journal: no directory given");
  if (::mkdir(options.dir.c_str(), 0750) != 0 && errno != EEXIST) {
    throw JournalError(Errno("journal: cannot create " + options.dir));
  }
  std::unique_ptr<Journal> j(new Journal(options));
  DIR* d = ::opendir(options.dir.c_str());
  if (d == nullptr) throw JournalError(Errno("journal: cannot read " + options.dir));
  while (dirent* e = ::readdir(d)) {
    unsigned long long n = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "journal-%16llu.lo%c", &n, &tail) == 2 && tail == 'g' &&
        std::strlen(e->d_name) == 28) {
      j->segments_.push_back(n);
    }
  }
  ::closedir(d);
  std::sort(j->segments_.begin(), j->segments_.end());
  j->Replay(visit);
  std::erase_if(j->segments_, [&](std::uint64_t n) {
    struct stat st {};
    return ::stat(j->SegmentPath(n).c_str(), &st) != 0;
  });
  // What a killed broker left in the page cache (records written but not
  // synced) goes to disk now: once a newer segment exists, a torn tail in
  // these would stop the start instead of being cut off.
  if (options.sync) {
    for (std::uint64_t n : j->segments_) {
      int fd = ::open(j->SegmentPath(n).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::fdatasync(fd) != 0) {
        if (fd >= 0) ::close(fd);
        throw JournalError(Errno("journal: sync " + j->SegmentPath(n)));
      }
      ::close(fd);
    }
  }
  j->OpenSegment(j->segments_.empty() ? 1 : j->segments_.back() + 1);
  return j;
}

void Journal::Replay(const Visitor& visit) {
  // The newest segment with data is where a crash can leave a torn tail (a
  // crash right after a restart leaves an empty segment after it).
  std::size_t newest_with_data = 0;
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    struct stat st {};
    if (::stat(SegmentPath(segments_[s]).c_str(), &st) == 0 && st.st_size > 0) {
      newest_with_data = s;
    }
  }
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    const bool last = s >= newest_with_data;
    const std::string path = SegmentPath(segments_[s]);
    const std::string data = ReadWhole(path);
    if (data.empty()) {
      // A run that wrote nothing: no records to keep.
      if (::unlink(path.c_str()) != 0) throw JournalError(Errno("journal: remove " + path));
      continue;
    }
    std::size_t pos = 0;
    std::string problem;
    while (pos < data.size()) {
      if (data.size() - pos < kHeader) {
        problem = "a record header cut short";
        break;
      }
      const std::uint32_t len = ReadLe32(data.data() + pos);
      const std::uint32_t crc = ReadLe32(data.data() + pos + 4);
      if (len > kMaxRecordBytes || data.size() - pos - kHeader < len) {
        problem = "a record running past the end of the file";
        break;
      }
      std::string_view typed(data.data() + pos + 8, 1 + len);
      if (Crc32c(typed) != crc) {
        problem = "a record failing its checksum";
        if (pos + kHeader + len < data.size() && !AllZero(std::string_view(data).substr(pos))) {
          throw JournalError(fmt::format(
              "journal: corrupt record at offset {} of {} (checksum mismatch, with {} more "
              "bytes after it): refusing to start rather than lose the records after it; "
              "restore the directory from a backup, or move the segment away to accept "
              "the loss",
              pos, path, data.size() - pos - kHeader - len));
        }
        break;
      }
      visit(static_cast<std::uint8_t>(typed[0]), typed.substr(1));
      ++stats_.records_replayed;
      pos += kHeader + len;
    }
    ++stats_.segments_replayed;
    if (pos == data.size()) continue;
    if (!last && !AllZero(std::string_view(data).substr(pos))) {
      throw JournalError(fmt::format(
          "journal: {} at offset {} of {}, which is not the newest segment: refusing to "
          "start (restore the directory, or move the segment away to accept the loss)",
          problem, pos, path));
    }
    // A torn tail: the end of the last write before a crash. Cut it off.
    spdlog::warn("journal: truncating a torn tail of {} bytes at offset {} of {} ({}); the "
                 "records before it are intact",
                 data.size() - pos, pos, path, problem.empty() ? "zeros" : problem);
    stats_.torn_bytes_truncated += data.size() - pos;
    if (::truncate(path.c_str(), static_cast<off_t>(pos)) != 0) {
      throw JournalError(Errno("journal: truncate " + path));
    }
    if (options_.sync) {
      int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::fsync(fd) != 0) {
        if (fd >= 0) ::close(fd);
        throw JournalError(Errno("journal: sync " + path));
      }
      ::close(fd);
    }
  }
}

void Journal::OpenSegment(std::uint64_t number) {
  const std::string path = SegmentPath(number);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) throw JournalError(Errno("journal: create " + path));
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  active_number_ = number;
  struct stat st {};
  active_bytes_ = ::fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
  if (segments_.empty() || segments_.back() != number) segments_.push_back(number);
  SyncDir();
}

void Journal::Append(std::uint8_t type, std::string_view body, bool must_sync) {
  sync_due_ = sync_due_ || must_sync;
  if (body.size() > kMaxRecordBytes) throw JournalError("journal: record too large");
  const char t = static_cast<char>(type);
  PutLe32(buffer_, static_cast<std::uint32_t>(body.size()));
  PutLe32(buffer_, Crc32c(body, Crc32c(std::string_view(&t, 1))));
  buffer_.push_back(t);
  buffer_.append(body);
  ++stats_.records_appended;
}

bool Journal::Commit() {
  if (buffer_.empty()) return false;
  if (failed_) throw JournalError("journal: an earlier write failed; not writing more");
  std::size_t done = 0;
  while (done < buffer_.size()) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      // Cut off what part of the turn did reach the file (ENOSPC midway), so
      // no half record sits before later ones, and write nothing more.
      const std::string error = Errno("journal: write " + SegmentPath(active_number_));
      failed_ = true;
      if (::ftruncate(fd_, static_cast<off_t>(active_bytes_)) != 0) {
        spdlog::error("journal: cannot cut a partial write off {}: {}",
                      SegmentPath(active_number_), std::strerror(errno));
      }
      throw JournalError(error);
    }
    done += static_cast<std::size_t>(n);
  }
  if (options_.sync && sync_due_) {
    if (::fdatasync(fd_) != 0) {
      failed_ = true;
      throw JournalError(Errno("journal: fdatasync " + SegmentPath(active_number_)));
    }
    ++stats_.syncs;
  }
  sync_due_ = false;
  active_bytes_ += buffer_.size();
  stats_.bytes_written += buffer_.size();
  ++stats_.commits;
  buffer_.clear();
  return true;
}

void Journal::Compact(const std::function<void(Journal&)>& snapshot) {
  sync_due_ = true;
  Commit();
  std::vector<std::uint64_t> old = segments_;
  OpenSegment(active_number_ + 1);
  snapshot(*this);
  sync_due_ = true;  // even an empty snapshot: the deletions follow
  Commit();
  // Only now, with the snapshot on disk, may the old segments go.
  for (std::uint64_t n : old) {
    if (::unlink(SegmentPath(n).c_str()) != 0 && errno != ENOENT) {
      throw JournalError(Errno("journal: remove " + SegmentPath(n)));
    }
  }
  SyncDir();
  segments_ = {active_number_};
  snapshot_bytes_ = active_bytes_;
  ++stats_.compactions;
}

}  // namespace fleet::broker

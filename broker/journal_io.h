// JournalIo: the file system as the journal (broker/journal.h) sees it, so
// tests can put a full disk, a failing fdatasync or a slow disk under a
// real journal. Every call returns 0 or an errno value (ENOSPC, EIO, ...):
// the journal must know which error it got (a full disk is waited out, a
// corrupt file is not), and none of these failures is a programmer error.
//
// JournalIo::Default() is the real POSIX file system. Implementations must
// be safe to call from two threads at once (the broker loop writes the
// active segment while a compaction thread writes another file); a
// JournalFile is used by one thread at a time.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fleet::broker {

// A file open for appending.
class JournalFile {
 public:
  virtual ~JournalFile() = default;
  // Appends the `n` parts in order at the end of the file, retrying short
  // writes. On an error part of it may be on the file: the caller truncates.
  virtual int Append(const std::string_view* parts, std::size_t n) = 0;
  // fdatasync.
  virtual int Sync() = 0;
  // Cuts the file to `size` bytes (a partial write off its end).
  virtual int Truncate(std::uint64_t size) = 0;
};

class JournalIo {
 public:
  virtual ~JournalIo() = default;

  // The real file system (thread-safe, lives for the whole process).
  static JournalIo& Default();

  // Creates `dir` (mode 0750) unless it exists.
  virtual int MakeDir(const std::string& dir) = 0;
  // The names (not paths) of the entries of `dir`.
  virtual int List(const std::string& dir, std::vector<std::string>* names) = 0;
  // At most `max_bytes` from the start of `path`.
  virtual int ReadFile(const std::string& path, std::uint64_t max_bytes, std::string* out) = 0;
  virtual int Size(const std::string& path, std::uint64_t* size) = 0;
  // Opens `path` for appending, creating it (mode 0640) if needed.
  virtual int OpenAppend(const std::string& path, std::unique_ptr<JournalFile>* out) = 0;
  // Cuts `path` to `size` bytes and fsyncs it.
  virtual int TruncateFile(const std::string& path, std::uint64_t size) = 0;
  // fdatasync of a file that is not open.
  virtual int SyncFile(const std::string& path) = 0;
  virtual int Remove(const std::string& path) = 0;
  virtual int Rename(const std::string& from, const std::string& to) = 0;
  // fsync of a directory, so creations, renames and removals in it last.
  virtual int SyncDir(const std::string& dir) = 0;
  // Bytes an unprivileged writer may still put in `dir`'s file system;
  // empty when it cannot be told.
  virtual std::optional<std::uint64_t> FreeBytes(const std::string& dir) = 0;
};

// "ENOSPC: No space left on device" style text for an errno value.
std::string ErrnoText(int error);
// A full disk or an exhausted quota: waited out, not fatal.
inline bool IsNoSpace(int error) { return error == ENOSPC || error == EDQUOT; }

}  // namespace fleet::broker

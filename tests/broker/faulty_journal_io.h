// FaultyJournalIo: the real file system under a journal, with a disk of a
// set size (writes past it fail with ENOSPC after writing what fits, as a
// full disk does; removals and truncations give the space back), failing
// fdatasyncs, failing removals, and writes to some files held until the
// test lets them go (a slow disk). Thread-safe.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "broker/journal_io.h"

namespace fleet::broker {

class FaultyJournalIo final : public JournalIo {
 public:
  // Bytes that may still be written; empty: no limit.
  void SetFree(std::optional<std::uint64_t> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    free_ = bytes;
  }
  std::optional<std::uint64_t> free() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_;
  }
  // The next `n` fdatasyncs fail with EIO.
  void FailSyncs(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_syncs_ = n;
  }
  // Removals of files whose name ends with `suffix` fail with EIO.
  void FailRemovals(std::string suffix) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_removals_ = std::move(suffix);
  }
  // Writes to files whose name ends with `suffix` wait until Release().
  void HoldWrites(std::string suffix) {
    std::lock_guard<std::mutex> lock(mu_);
    held_suffix_ = std::move(suffix);
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    held_suffix_.clear();
    cv_.notify_all();
  }
  // Writers waiting in a held write now.
  int held_writers() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_writers_;
  }

  int MakeDir(const std::string& dir) override { return real_.MakeDir(dir); }
  int List(const std::string& dir, std::vector<std::string>* names) override {
    return real_.List(dir, names);
  }
  int ReadFile(const std::string& path, std::uint64_t max, std::string* out) override {
    return real_.ReadFile(path, max, out);
  }
  int Size(const std::string& path, std::uint64_t* size) override {
    return real_.Size(path, size);
  }
  int OpenAppend(const std::string& path, std::unique_ptr<JournalFile>* out) override {
    std::unique_ptr<JournalFile> file;
    if (int e = real_.OpenAppend(path, &file)) return e;
    *out = std::make_unique<File>(*this, path, std::move(file));
    return 0;
  }
  int TruncateFile(const std::string& path, std::uint64_t size) override {
    const std::uint64_t before = SizeOr0(path);
    const int e = real_.TruncateFile(path, size);
    if (e == 0 && before > size) GiveBack(before - size);
    return e;
  }
  int SyncFile(const std::string& path) override {
    if (TakeSyncFailure()) return EIO;
    return real_.SyncFile(path);
  }
  int Remove(const std::string& path) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failing_removals_.empty() && EndsWith(path, failing_removals_)) return EIO;
    }
    const std::uint64_t size = SizeOr0(path);
    const int e = real_.Remove(path);
    if (e == 0) GiveBack(size);
    return e;
  }
  int Rename(const std::string& from, const std::string& to) override {
    const std::uint64_t replaced = SizeOr0(to);
    const int e = real_.Rename(from, to);
    if (e == 0) GiveBack(replaced);
    return e;
  }
  int SyncDir(const std::string& dir) override { return real_.SyncDir(dir); }
  std::optional<std::uint64_t> FreeBytes(const std::string& dir) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_) return free_;
    }
    return real_.FreeBytes(dir);
  }

 private:
  class File final : public JournalFile {
   public:
    File(FaultyJournalIo& io, std::string path, std::unique_ptr<JournalFile> real)
        : io_(io), path_(std::move(path)), real_(std::move(real)) {}
    int Append(const std::string_view* parts, std::size_t n) override {
      io_.WaitIfHeld(path_);
      std::size_t total = 0;
      for (std::size_t i = 0; i < n; ++i) total += parts[i].size();
      const std::uint64_t fits = io_.Take(total);
      if (fits == total) return real_->Append(parts, n);
      // What fits goes to the file first, as on a real disk.
      std::string joined;
      for (std::size_t i = 0; i < n; ++i) joined.append(parts[i]);
      const std::string_view head(joined.data(), fits);
      if (fits > 0) real_->Append(&head, 1);
      return ENOSPC;
    }
    int Sync() override {
      if (io_.TakeSyncFailure()) return EIO;
      return real_->Sync();
    }
    int Truncate(std::uint64_t size) override {
      const std::uint64_t before = io_.SizeOr0(path_);
      const int e = real_->Truncate(size);
      if (e == 0 && before > size) io_.GiveBack(before - size);
      return e;
    }

   private:
    FaultyJournalIo& io_;
    std::string path_;
    std::unique_ptr<JournalFile> real_;
  };

  static bool EndsWith(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  std::uint64_t SizeOr0(const std::string& path) {
    std::uint64_t size = 0;
    return real_.Size(path, &size) == 0 ? size : 0;
  }
  // Reserves up to `want` bytes; returns how many fit.
  std::uint64_t Take(std::uint64_t want) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_) return want;
    const std::uint64_t got = std::min(want, *free_);
    *free_ -= got;
    return got;
  }
  void GiveBack(std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_) *free_ += bytes;
  }
  bool TakeSyncFailure() {
    std::lock_guard<std::mutex> lock(mu_);
    if (failing_syncs_ == 0) return false;
    --failing_syncs_;
    return true;
  }
  void WaitIfHeld(const std::string& path) {
    std::unique_lock<std::mutex> lock(mu_);
    if (held_suffix_.empty() || !EndsWith(path, held_suffix_)) return;
    ++held_writers_;
    cv_.wait(lock, [&] { return held_suffix_.empty(); });
    --held_writers_;
  }

  JournalIo& real_ = JournalIo::Default();
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::uint64_t> free_;
  int failing_syncs_ = 0;
  std::string failing_removals_;
  std::string held_suffix_;
  int held_writers_ = 0;
};

}  // namespace fleet::broker

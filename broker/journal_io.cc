#include "broker/journal_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace fleet::broker {
namespace {

// Runs `call` again while it fails with EINTR; 0 or the errno.
template <typename F>
int Retry(F call) {
  for (;;) {
    if (call() == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

class PosixFile final : public JournalFile {
 public:
  explicit PosixFile(int fd) : fd_(fd) {}
  ~PosixFile() override { ::close(fd_); }

  int Append(const std::string_view* parts, std::size_t count) override {
    iovec iov[8];
    int n = 0;
    for (std::size_t i = 0; i < count && n < 8; ++i) {
      if (!parts[i].empty()) iov[n++] = {const_cast<char*>(parts[i].data()), parts[i].size()};
    }
    iovec* v = iov;
    while (n > 0) {
      const ssize_t w = ::writev(fd_, v, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      std::size_t left = static_cast<std::size_t>(w);
      while (n > 0 && left >= v->iov_len) {
        left -= v->iov_len;
        ++v;
        --n;
      }
      if (n > 0) {
        v->iov_base = static_cast<char*>(v->iov_base) + left;
        v->iov_len -= left;
      }
    }
    return 0;
  }
  int Sync() override { return Retry([&] { return ::fdatasync(fd_); }); }
  int Truncate(std::uint64_t size) override {
    return Retry([&] { return ::ftruncate(fd_, static_cast<off_t>(size)); });
  }

 private:
  int fd_;
};

class PosixIo final : public JournalIo {
 public:
  int MakeDir(const std::string& dir) override {
    if (::mkdir(dir.c_str(), 0750) == 0 || errno == EEXIST) return 0;
    return errno;
  }
  int List(const std::string& dir, std::vector<std::string>* names) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return errno;
    names->clear();
    while (dirent* e = ::readdir(d)) names->emplace_back(e->d_name);
    ::closedir(d);
    return 0;
  }
  int ReadFile(const std::string& path, std::uint64_t max_bytes, std::string* out) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    out->clear();
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      out->reserve(static_cast<std::size_t>(
          std::min<std::uint64_t>(max_bytes, static_cast<std::uint64_t>(st.st_size))));
    }
    char buf[1 << 16];
    while (out->size() < max_bytes) {
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(sizeof buf, max_bytes - out->size()));
      const ssize_t n = ::read(fd, buf, want);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        return e;
      }
      if (n == 0) break;
      out->append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return 0;
  }
  int Size(const std::string& path, std::uint64_t* size) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno;
    *size = static_cast<std::uint64_t>(st.st_size);
    return 0;
  }
  int OpenAppend(const std::string& path, std::unique_ptr<JournalFile>* out) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) return errno;
    *out = std::make_unique<PosixFile>(fd);
    return 0;
  }
  int TruncateFile(const std::string& path, std::uint64_t size) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    int e = Retry([&] { return ::ftruncate(fd, static_cast<off_t>(size)); });
    if (e == 0) e = Retry([&] { return ::fsync(fd); });
    ::close(fd);
    return e;
  }
  int SyncFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    const int e = Retry([&] { return ::fdatasync(fd); });
    ::close(fd);
    return e;
  }
  int Remove(const std::string& path) override {
    return ::unlink(path.c_str()) == 0 ? 0 : errno;
  }
  int Rename(const std::string& from, const std::string& to) override {
    return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
  }
  int SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    const int e = Retry([&] { return ::fsync(fd); });
    ::close(fd);
    return e;
  }
  std::optional<std::uint64_t> FreeBytes(const std::string& dir) override {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) return std::nullopt;
    return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
  }
};

}  // namespace

JournalIo& JournalIo::Default() {
  static PosixIo io;
  return io;
}

std::string ErrnoText(int error) {
  const char* name = error == ENOSPC   ? "ENOSPC"
                     : error == EDQUOT ? "EDQUOT"
                     : error == EIO    ? "EIO"
                     : error == EACCES ? "EACCES"
                     : error == EROFS  ? "EROFS"
                     : error == ENOENT ? "ENOENT"
                                       : nullptr;
  std::string text = std::strerror(error);
  return name != nullptr ? std::string(name) + ": " + text : text;
}

}  // namespace fleet::broker

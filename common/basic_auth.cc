#include "common/basic_auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

// The mode is read with fstat on the descriptor we read from, not with stat
// on the path, so the file checked is the file read. Symlinks are followed
// on purpose: Docker and Kubernetes secrets are often links to the real
// file, whose mode is what counts.
//
// Rejected: trimming spaces around the password (Prometheus trims its
// password_file). A password may end in a space; only the line end goes.

namespace fleet {
namespace {

constexpr std::size_t kMaxFileBytes = 4096;

[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("basic auth file " + path + ": " + what);
}

std::string ReadOwnerOnlyFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) Fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) Fail(path, "not a regular file");
  const unsigned perms = st.st_mode & 07777;
  if (perms != 0600 && perms != 0400) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", perms);
    Fail(path, std::string("mode ") + mode +
                   ": it must be readable by its owner only (0600 or 0400); fix it with "
                   "chmod 600 " + path);
  }
  std::string text;
  char buf[1024];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail(path, std::string("cannot read: ") + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxFileBytes) Fail(path, "longer than 4096 bytes");
  }
  return text;
}

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited and folded into one
  // accumulator; no branch depends on the bytes.
  const std::size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

bool BasicAuth::Matches(std::string_view user, std::string_view pass) const {
  // Both comparisons run whatever the first says (& rather than &&), so a
  // right user name takes no longer to refuse than a wrong one.
  const bool user_ok = ConstantTimeEquals(user, username);
  const bool pass_ok = ConstantTimeEquals(pass, password);
  return user_ok & pass_ok;
}

BasicAuth ReadBasicAuthFile(const std::string& path) {
  if (path.empty()) throw std::runtime_error("basic auth file: empty path");
  std::string line = ReadOwnerOnlyFile(path);
  if (!line.empty() && line.back() == '\n') line.pop_back();
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const std::string format = " (want one line user:password)";
  if (line.empty()) Fail(path, "empty" + format);
  if (line.find_first_of("\r\n") != std::string::npos) Fail(path, "more than one line" + format);
  const auto colon = line.find(':');
  if (colon == std::string::npos) Fail(path, "no ':'" + format);
  BasicAuth auth{line.substr(0, colon), line.substr(colon + 1)};
  if (auth.username.empty()) Fail(path, "empty user" + format);
  if (auth.password.empty()) Fail(path, "empty password" + format);
  return auth;
}

}  // namespace fleet

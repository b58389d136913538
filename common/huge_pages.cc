#include "common/huge_pages.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

namespace fleet {
namespace {

constexpr const char* kTunable = "glibc.malloc.hugetlb";
// Set for the re-executed run: GLIBC_TUNABLES as it was before, or kUnset.
constexpr const char* kSaved = "FLEET_SAVED_GLIBC_TUNABLES";
constexpr const char* kUnset = "\x01unset";

}  // namespace

bool GlibcHasTunable() {
#if defined(__GLIBC__)
  int major = 0, minor = 0;
  if (std::sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) != 2) return false;
  return major > 2 || (major == 2 && minor >= 35);
#else
  return false;
#endif
}

std::string ThpMode() {
  // Closed on return, so never open across an exec (the stream's
  // descriptor is not close-on-exec).
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool SanitizerBuild() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

std::optional<std::string> HugePageTunables(const char* tunables, std::string_view thp_mode,
                                            const char* opt_out) {
  if (opt_out != nullptr && std::string_view(opt_out) == "0") return std::nullopt;
  const std::string_view current = tunables == nullptr ? "" : tunables;
  if (current.find(kTunable) != std::string_view::npos) return std::nullopt;
  // The mode file marks the active choice: "always [madvise] never".
  if (thp_mode.find("[madvise]") == std::string_view::npos) return std::nullopt;
  std::string value(current);
  if (!value.empty()) value += ':';
  value += kTunable;
  value += "=1";
  return value;
}

void UseHugePageMalloc(char** argv) {
  if (const char* saved = std::getenv(kSaved)) {
    const char* now = std::getenv("GLIBC_TUNABLES");
    if (now != nullptr && std::strstr(now, kTunable) != nullptr) {
      // The re-executed run: glibc has read the tunable; put the variable
      // back for whatever this process starts.
      if (std::strcmp(saved, kUnset) == 0) {
        unsetenv("GLIBC_TUNABLES");
      } else {
        setenv("GLIBC_TUNABLES", saved, 1);
      }
      unsetenv(kSaved);
      return;
    }
    unsetenv(kSaved);  // not ours: inherited from somewhere, ignore it
  }
  if (SanitizerBuild() || !GlibcHasTunable() || argv == nullptr || argv[0] == nullptr) return;
  const char* before = std::getenv("GLIBC_TUNABLES");
  const std::optional<std::string> value =
      HugePageTunables(before, ThpMode(), std::getenv("FLEET_MALLOC_HUGEPAGES"));
  if (!value) return;
  const std::string saved = before == nullptr ? kUnset : before;
  if (setenv(kSaved, saved.c_str(), 1) != 0) return;
  if (setenv("GLIBC_TUNABLES", value->c_str(), 1) != 0) {
    unsetenv(kSaved);
    return;
  }
  // The binary's own path, not /proc/self/exe: the kernel names a process
  // after the file it runs, and ps, pgrep and top should show fleet-broker.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  int err = ENOENT;
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);  // fails for a binary replaced since it started
    err = errno;
  }
  // No exec: run on as we are, environment as it was.
  if (before == nullptr) {
    unsetenv("GLIBC_TUNABLES");
  } else {
    setenv("GLIBC_TUNABLES", saved.c_str(), 1);
  }
  unsetenv(kSaved);
  std::fprintf(stderr, "%s: could not re-execute for huge-page malloc (%s); running without\n",
               argv[0], std::strerror(err));
}

}  // namespace fleet

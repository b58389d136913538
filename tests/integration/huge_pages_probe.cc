// huge_pages_probe: calls UseHugePageMalloc as the broker does, then prints
// what the rest of the program (and anything it starts) sees, and what it
// was exec'd with (/proc/self/environ, where glibc may have rewritten
// GLIBC_TUNABLES in place), for huge_pages_test.cc.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "common/huge_pages.h"

int main(int, char** argv) {
  fleet::UseHugePageMalloc(argv);
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const char* saved = std::getenv("FLEET_SAVED_GLIBC_TUNABLES");
  std::printf("now GLIBC_TUNABLES=%s\n", tunables ? tunables : "(unset)");
  std::printf("now FLEET_SAVED_GLIBC_TUNABLES=%s\n", saved ? saved : "(unset)");
  std::ifstream in("/proc/self/environ");
  std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t at = 0;
  while (at < env.size()) {
    std::size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    const std::string var = env.substr(at, end - at);
    if (var.rfind("GLIBC_TUNABLES=", 0) == 0 || var.rfind("FLEET_SAVED_GLIBC_TUNABLES=", 0) == 0) {
      std::printf("exec'd with %s\n", var.c_str());
    }
    at = end + 1;
  }
  return 0;
}

// libFuzzer target for prom::ParseQueryResponse, as the autoscaler's Prometheus source calls it.
// The checks live in fuzz/entry_points.cc, shared with the corpus regression
// test. Run it with fuzz/run.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/entry_points.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string broken = fleet::fuzz::FuzzPromApi(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "fuzz_prom_api: invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}

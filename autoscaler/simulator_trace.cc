// Built-in and CSV traces for the simulator.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "autoscaler/simulator.h"

namespace fleet::autoscaler {
namespace {

// splitmix64: tiny, well mixed, and defined by its arithmetic alone.
class SplitMix {
 public:
  explicit SplitMix(std::uint64_t seed) : s_(seed) {}
  // Uniform in (0, 1).
  double Next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (static_cast<double>(z >> 11) + 0.5) / 9007199254740992.0;  // 2^53
  }

 private:
  std::uint64_t s_;
};

}  // namespace

Trace BurstTrace(int count, double at, double processing) {
  Trace t{"burst", {}, {}};
  for (int i = 0; i < count; ++i) t.arrivals.push_back({at, processing});
  return t;
}

Trace SteadyTrace(double rate, double seconds, double processing, unsigned seed) {
  Trace t{"steady", {}, {}};
  SplitMix rng(seed);
  double at = 0;
  while (true) {
    at += -std::log(rng.Next()) / rate;
    if (at >= seconds) break;
    t.arrivals.push_back({at, processing});
  }
  return t;
}

Trace SawtoothTrace(int cycles, double peak_rate, double ramp_seconds, double gap_seconds,
                    double processing) {
  Trace t{"sawtooth", {}, {}};
  // Within a ramp, arrivals so far N(x) = peak x^2 / (2 ramp): the k-th is
  // at x = sqrt(2 ramp k / peak).
  const double period = ramp_seconds + gap_seconds;
  for (int c = 0; c < cycles; ++c) {
    for (int k = 1;; ++k) {
      const double x = std::sqrt(2 * ramp_seconds * k / peak_rate);
      if (x >= ramp_seconds) break;
      t.arrivals.push_back({c * period + x, processing});
    }
  }
  return t;
}

Trace BurstAfterScaleDownTrace(int count, double processing, double offset) {
  Trace t = BurstTrace(count, 5, processing);
  t.name = "burst-after-scale-down";
  for (int i = 0; i < count; ++i) t.after_first_retire.push_back({offset, processing});
  return t;
}

Trace EvenTrace(double workers, double seconds, double processing, double from) {
  Trace t{"even", {}, {}};
  if (!(workers > 0) || !(processing > 0) || !(seconds > 0)) return t;
  const double gap = processing / workers;
  // Counted, not accumulated: no drift over thousands of arrivals.
  for (long i = 0;; ++i) {
    const double at = static_cast<double>(i) * gap;
    if (at >= seconds) break;
    t.arrivals.push_back({from + at, processing});
  }
  return t;
}

Trace StepDownTrace(double high_workers, double low_workers, double high_seconds,
                    double low_seconds, double processing) {
  Trace t = EvenTrace(high_workers, high_seconds, processing);
  t.name = "step-down";
  const Trace low = EvenTrace(low_workers, low_seconds, processing, high_seconds);
  t.arrivals.insert(t.arrivals.end(), low.arrivals.begin(), low.arrivals.end());
  return t;
}

Trace BuiltinTrace(std::string_view name) {
  if (name == "burst") return BurstTrace();
  if (name == "steady") return SteadyTrace();
  if (name == "sawtooth") return SawtoothTrace();
  if (name == "burst-after-scale-down") return BurstAfterScaleDownTrace();
  if (name == "step-down") return StepDownTrace();
  throw std::invalid_argument("unknown trace '" + std::string(name) +
                              "' (burst, steady, sawtooth, burst-after-scale-down, step-down)");
}

Trace ParseCsvTrace(std::istream& in, double default_processing, std::string name) {
  Trace t{std::move(name), {}, {}};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string a;
    std::string p;
    std::getline(fields, a, ',');
    std::getline(fields, p);
    Arrival arrival{0, default_processing};
    try {
      std::size_t used = 0;
      arrival.at = std::stod(a, &used);
      if (p.find_first_not_of(" \t\r") != std::string::npos) arrival.processing = std::stod(p);
    } catch (const std::exception&) {
      if (t.arrivals.empty() && number == 1) continue;  // a header
      throw std::runtime_error("trace line " + std::to_string(number) +
                               ": expected "
                               "arrival_seconds[,processing_seconds], got '" +
                               line + "'");
    }
    if (!std::isfinite(arrival.at) || arrival.at < 0 || !std::isfinite(arrival.processing) ||
        arrival.processing < 0 || arrival.processing > 86400) {
      throw std::runtime_error("trace line " + std::to_string(number) +
                               ": times must be finite, >= 0 (processing <= 86400 s)");
    }
    t.arrivals.push_back(arrival);
  }
  std::stable_sort(t.arrivals.begin(), t.arrivals.end(),
                   [](const Arrival& x, const Arrival& y) { return x.at < y.at; });
  return t;
}

Trace LoadCsvTrace(const std::string& path, double default_processing) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open trace " + path);
  return ParseCsvTrace(in, default_processing, path);
}

}  // namespace fleet::autoscaler

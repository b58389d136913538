// fleet-bench-hostile: legitimate throughput with and without hostile
// clients (issue 5: "legitimate throughput stays within 10% of the
// baseline"). Measured here rather than asserted in a test, since tests do
// not assert on time.
//
// A CURVE broker on 127.0.0.1 with keyed echo workers; each round runs the
// same keyed fleet-submit load twice: alone, then while rounds of garbage
// TCP connections hit the frontend and producers with no key, a wrong
// server key, an unlisted key and a worker's key keep trying to submit.
// Prints each run and the medians: baseline and hostile batches/s, and
// their ratio. The hostile clients run on the same machine (the garbage
// from this process's thread), so on few cores part of any drop is their
// CPU, not the broker's.
#include <CLI/CLI.hpp>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/hostile_clients.h"
#include "tests/support/wait.h"

namespace {

using fleet::testing::Cluster;
using std::chrono::milliseconds;
using std::chrono::seconds;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Config {
  int rounds = 3;
  int count = 20000;
  int size = 100;
  int inflight = 1000;
  int workers = 2;
  int concurrency = 4;
  std::size_t connections = 1000;
  std::size_t batch = 50;
  int gap_ms = 100;
};

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"fleet-bench-hostile: keyed throughput alone and under hostile clients"};
  app.add_option("--rounds", cfg.rounds, "baseline/hostile pairs")->capture_default_str();
  app.add_option("--count", cfg.count, "batches per run")->capture_default_str();
  app.add_option("--size", cfg.size, "payload bytes")->capture_default_str();
  app.add_option("--inflight", cfg.inflight, "fleet-submit --inflight")->capture_default_str();
  app.add_option("--workers", cfg.workers, "echo workers")->capture_default_str();
  app.add_option("--concurrency", cfg.concurrency, "slots per worker")->capture_default_str();
  app.add_option("--connections", cfg.connections, "garbage connections per round")
      ->capture_default_str();
  app.add_option("--batch", cfg.batch, "garbage connections opened at once")
      ->capture_default_str();
  app.add_option("--gap-ms", cfg.gap_ms, "pause between garbage rounds")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    if (fleet::testing::RaiseOpenFileLimit(cfg.connections + 1024) < cfg.connections + 256) {
      std::fprintf(stderr, "fleet-bench-hostile: too few open files allowed (ulimit -Hn)\n");
      return 2;
    }
    fleet::testing::TempDir keydir;
    fleet::testing::CurveSetup keys(keydir);
    Cluster c;
    std::vector<std::string> flags = keys.BrokerFlags();
    c.StartBroker(flags);
    c.set_ctl_flags(keys.As("control"));
    for (int i = 1; i <= cfg.workers; ++i) {
      std::vector<std::string> wf = keys.As("worker");
      wf.insert(wf.end(), {"--handler", "echo", "--concurrency", std::to_string(cfg.concurrency)});
      c.StartWorker("bench-" + std::to_string(i), wf);
    }
    if (!fleet::testing::WaitFor([&] {
          return c.Workers().size() == static_cast<std::size_t>(cfg.workers);
        })) {
      throw std::runtime_error("workers did not register: " + c.BrokerLog());
    }
    std::vector<std::string> load = keys.As("producer");
    load.insert(load.end(), {"--count", std::to_string(cfg.count), "--size",
                             std::to_string(cfg.size), "--inflight",
                             std::to_string(cfg.inflight)});
    long expected = 0;
    auto run = [&](const char* what, int round) {
      Cluster::Submitted s = c.Submit(load, seconds(600));
      expected += cfg.count;
      if (s.run.exit_code != 0 || s.summary["ok"] != std::to_string(cfg.count)) {
        throw std::runtime_error(std::string(what) + " run failed: " + s.run.output);
      }
      double rate = std::atof(s.summary["batches_per_s"].c_str());
      std::printf("round=%d run=%s batches_per_s=%.0f seconds=%s\n", round, what, rate,
                  s.summary["seconds"].c_str());
      std::fflush(stdout);
      return rate;
    };
    run("warmup", 0);

    std::vector<double> base, hostile;
    fleet::testing::GarbageStats garbage;
    for (int round = 1; round <= cfg.rounds; ++round) {
      base.push_back(run("baseline", round));
      auto refused = fleet::testing::StartRefusedProducers(c.frontend(), keys, c.dir(),
                                                           seconds(600));
      fleet::testing::GarbageFlood flood(c.frontend(), cfg.connections, cfg.batch,
                                         milliseconds(cfg.gap_ms));
      // Hostile traffic is under way before the measured run starts.
      fleet::testing::WaitFor([&] { return flood.rounds() >= 1; }, seconds(60));
      hostile.push_back(run("hostile", round));
      auto g = flood.Stop();
      garbage.rounds += g.rounds;
      garbage.connected += g.connected;
      garbage.failed += g.failed;
      garbage.seconds += g.seconds;
      for (auto& p : refused) {
        p->Signal(SIGTERM);
        p->Wait(seconds(20));
      }
    }
    const double submitted = c.StatValue("submitted");
    const double b = Median(base), h = Median(hostile);
    std::printf(
        "baseline_batches_per_s=%.0f hostile_batches_per_s=%.0f ratio=%.3f "
        "garbage_rounds=%zu garbage_connections=%zu garbage_failed=%zu "
        "garbage_connections_per_s=%.0f broker_submitted=%.0f legitimate_submitted=%ld "
        "broker_alive=%d\n",
        b, h, b > 0 ? h / b : 0.0, garbage.rounds, garbage.connected, garbage.failed,
        garbage.seconds > 0 ? garbage.connected / garbage.seconds : 0.0, submitted, expected,
        c.broker().Running() ? 1 : 0);
    return submitted == static_cast<double>(expected) && c.broker().Running() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet-bench-hostile: %s\n", e.what());
    return 1;
  }
}

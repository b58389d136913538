// fleet-soak: the long mixed fault run behind `make soak`. A durable broker,
// the autoscaler with the process launcher (1..8 workers running a handler
// that logs every execution and echoes), bursty and trickling producers, and
// on a schedule: kill -9 of workers, SIGSTOP/SIGCONT of a worker, kill -9 of
// the broker (restarted on the same ports and data directory) and of the
// autoscaler (restarted). When the time is up the faults stop, every
// producer finishes, and the ledger of every batch is checked and printed.
// Exit 0 when the ledger passes, 1 when it does not, 2 on a setup error.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/ledger.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct Config {
  double minutes = 30;
  double seconds_override = 0;  // --seconds: short runs (the smoke test)
  double worker_kill_every = 20;
  double stop_every = 45;
  double broker_kill_every = 180;
  double autoscaler_kill_every = 240;
  unsigned seed = 0;
  int max_attempts = 5;
};

long RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  long value = -1;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  return -1;
}

class Soak {
 public:
  explicit Soak(const Config& config) : config_(config), rng_(config.seed) {}

  int Run() {
    const auto length = config_.seconds_override > 0
                            ? std::chrono::duration<double>(config_.seconds_override)
                            : std::chrono::duration<double>(config_.minutes * 60);
    StartBroker(true);
    WriteHandler();
    StartAutoscaler();
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration_cast<Clock::duration>(length);
    auto next = [&](double every) {
      std::uniform_real_distribution<double> jitter(0.5, 1.5);
      return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(every * jitter(rng_)));
    };
    auto worker_kill_at = next(config_.worker_kill_every);
    auto stop_at = next(config_.stop_every);
    auto broker_kill_at = next(config_.broker_kill_every);
    auto autoscaler_kill_at = next(config_.autoscaler_kill_every);
    auto quiet_until = Clock::now();
    auto last_report = Clock::now();
    Log("soak: %.0f s, seed %u, data in %s", length.count(), config_.seed,
        c_.dir().path().c_str());

    while (Clock::now() < end) {
      ReapProducers();
      const auto now = Clock::now();
      // Load: bursts with quiet gaps between them (the pool churns between
      // 1 and 8), plus one trickling producer all the time.
      if (trickle_ == nullptr) trickle_ = StartProducer(200, 1);
      if (burst_ == nullptr && now >= quiet_until) {
        std::uniform_int_distribution<int> size(100, 1000);
        burst_ = StartProducer(size(rng_), 2000);
        ++bursts_;
      }
      if (now >= worker_kill_at) {
        KillWorkers();
        worker_kill_at = next(config_.worker_kill_every);
      }
      if (now >= stop_at) {
        StopAndContinueWorker();
        stop_at = next(config_.stop_every);
      }
      if (now >= broker_kill_at) {
        KillBroker();
        broker_kill_at = next(config_.broker_kill_every);
      }
      if (now >= autoscaler_kill_at) {
        KillAutoscaler();
        autoscaler_kill_at = next(config_.autoscaler_kill_every);
      }
      if (burst_ != nullptr) quiet_until = now + seconds(4);
      long rss = RssKiB(c_.broker().pid());
      broker_rss_max_ = std::max(broker_rss_max_, rss);
      int pool = static_cast<int>(WorkerPids(prefix_).size());
      pool_max_ = std::max(pool_max_, pool);
      if (now - last_report >= seconds(30)) {
        last_report = now;
        Log("soak: t=%.0fs batches=%zu pool=%d broker_rss=%ldKiB worker_kills=%d stops=%d "
            "broker_kills=%d autoscaler_kills=%d",
            std::chrono::duration<double>(now - start).count(), submitted_, pool, rss,
            worker_kills_, stops_, broker_kills_, autoscaler_kills_);
      }
      usleep(200 * 1000);
    }
    Log("soak: faults stop; waiting for the producers to finish");
    bool finished = WaitFor([&] {
      ReapProducers();
      return trickle_ == nullptr && burst_ == nullptr;
    }, seconds(600));
    if (!finished) Log("soak: producers did not finish within 600 s");
    autoscaler_->Signal(SIGTERM);
    autoscaler_->Wait(seconds(120));
    const bool no_orphans = WaitFor([&] { return WorkerPids(prefix_).empty(); }, seconds(30));

    LedgerOptions options;
    // A broker restart replays batches with their attempts at 0.
    options.max_attempts = static_cast<std::uint32_t>(config_.max_attempts * (broker_kills_ + 1));
    LedgerReport r = CheckLedger(ledgers_, {executions_}, options);
    std::printf("\n=== soak ledger (%.1f min) ===\n%s\n",
                std::chrono::duration<double>(Clock::now() - start).count() / 60,
                r.Describe().c_str());
    std::printf("faults: worker_kills=%d (workers killed %d) stops=%d broker_kills=%d "
                "autoscaler_kills=%d bursts=%d producer_runs=%zu\n",
                worker_kills_, workers_killed_, stops_, broker_kills_, autoscaler_kills_,
                bursts_, ledgers_.size());
    std::printf("pool: max %d workers; broker RSS max %ld KiB; producers with a bad exit %d; "
                "orphans left %s\n",
                pool_max_, broker_rss_max_, bad_exits_, no_orphans ? "none" : "YES");
    const bool ok = r.passed && finished && no_orphans && bad_exits_ == 0;
    std::printf("soak: %s\n", ok ? "PASS" : "FAIL");
    if (!ok) std::printf("broker log tail:\n%s\n", Tail(c_.BrokerLog(), 4000).c_str());
    return ok ? 0 : 1;
  }

 private:
  __attribute__((format(printf, 1, 2))) static void Log(const char* format, ...) {
    va_list args;
    va_start(args, format);
    std::vfprintf(stdout, format, args);
    va_end(args);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  static std::string Tail(const std::string& s, std::size_t n) {
    return s.size() <= n ? s : s.substr(s.size() - n);
  }

  void StartBroker(bool first) {
    if (first) {
      // Fixed ports for every restart; the metrics port too: the autoscaler
      // scrapes it.
      broker_flags_ = FixedEndpointFlags(/*with_metrics=*/true);
      broker_flags_.insert(broker_flags_.end(),
                           {"--heartbeat-ms", "250", "--max-attempts",
                            std::to_string(config_.max_attempts), "--retire-linger-ms", "500",
                            "--data-dir", c_.dir().File("data"), "--max-queue-bytes",
                            std::to_string(256u << 20)});
    }
    c_.StartBroker(broker_flags_);
  }

  void WriteHandler() {
    handler_ = c_.dir().File("handler.sh");
    std::ofstream(handler_) << LoggingEchoCommand(executions_, 20) << "\n";
    prefix_ = "soak-" + std::to_string(getpid()) + "-";
  }

  void StartAutoscaler() {
    const std::string n = std::to_string(++autoscaler_runs_);
    autoscaler_ = std::make_unique<Process>(
        std::vector<std::string>{
            Bin("fleet-autoscaler"), "--control", c_.control(), "--metrics-source",
            c_.metrics(), "--worker-args",
            "--broker " + c_.backend() + " --handler exec --exec 'sh " + handler_ +
                "' --concurrency 2 --heartbeat-ms 250",
            "--min", "1", "--max", "8", "--poll-ms", "200", "--idle-seconds", "1",
            "--cooldown-seconds", "0", "--stabilization-seconds", "1", "--grace-seconds", "2",
            "--id-prefix", prefix_ + n + "-", "--metrics", ""},
        c_.dir().File("autoscaler-" + n + ".log"));
  }

  std::unique_ptr<Process> StartProducer(int count, int inflight) {
    const std::string n = std::to_string(ledgers_.size() + 1);
    ledgers_.push_back(c_.dir().File("ledger-" + n + ".txt"));
    submitted_ += static_cast<std::size_t>(count);
    return std::make_unique<Process>(
        std::vector<std::string>{Bin("fleet-submit"), "--broker", c_.frontend(), "--count",
                                 std::to_string(count), "--size", "64", "--inflight",
                                 std::to_string(inflight), "--resend-after-seconds", "2",
                                 "--ledger", ledgers_.back(), "--log-level", "warn"},
        c_.dir().File("submit-" + n + ".log"));
  }

  void ReapProducers() {
    for (auto* p : {&trickle_, &burst_}) {
      if (*p == nullptr) continue;
      auto code = (*p)->Wait(milliseconds(0));
      if (!code) continue;
      if (*code != 0) {
        ++bad_exits_;
        Log("soak: a producer exited %d: %s", *code, Tail((*p)->ReadLog(), 500).c_str());
      }
      p->reset();
    }
  }

  void KillWorkers() {
    auto pids = WorkerPids(prefix_);
    if (pids.empty()) return;
    std::shuffle(pids.begin(), pids.end(), rng_);
    std::uniform_int_distribution<std::size_t> how_many(1, std::min<std::size_t>(3, pids.size()));
    std::size_t n = how_many(rng_);
    for (std::size_t i = 0; i < n; ++i) kill(pids[i], SIGKILL);
    ++worker_kills_;
    workers_killed_ += static_cast<int>(n);
    Log("soak: kill -9 of %zu worker(s)", n);
  }

  void StopAndContinueWorker() {
    auto pids = WorkerPids(prefix_);
    if (pids.empty()) return;
    pid_t pid = pids[std::uniform_int_distribution<std::size_t>(0, pids.size() - 1)(rng_)];
    kill(pid, SIGSTOP);
    usleep(2500 * 1000);  // ten heartbeats: the broker declares it dead
    kill(pid, SIGCONT);
    ++stops_;
    Log("soak: SIGSTOP 2.5 s then SIGCONT of worker %d", pid);
  }

  void KillBroker() {
    c_.broker().Signal(SIGKILL);
    c_.broker().Wait(seconds(10));
    StartBroker(false);
    ++broker_kills_;
    Log("soak: kill -9 of the broker; restarted from its journal");
  }

  void KillAutoscaler() {
    autoscaler_->Signal(SIGKILL);
    autoscaler_->Wait(seconds(10));
    StartAutoscaler();
    ++autoscaler_kills_;
    Log("soak: kill -9 of the autoscaler; restarted");
  }

  Config config_;
  std::mt19937 rng_;
  Cluster c_;
  std::vector<std::string> broker_flags_;
  std::string handler_, prefix_;
  std::string executions_ = c_.dir().File("executions.log");
  std::unique_ptr<Process> autoscaler_, trickle_, burst_;
  std::vector<std::string> ledgers_;
  std::size_t submitted_ = 0;
  int autoscaler_runs_ = 0, worker_kills_ = 0, workers_killed_ = 0, stops_ = 0;
  int broker_kills_ = 0, autoscaler_kills_ = 0, bursts_ = 0, bad_exits_ = 0, pool_max_ = 0;
  long broker_rss_max_ = 0;
};

}  // namespace
}  // namespace fleet::testing

int main(int argc, char** argv) {
  fleet::testing::Config config;
  config.seed = static_cast<unsigned>(std::random_device{}());
  CLI::App app{"fleet-soak: the long mixed fault run (make soak); prints the ledger"};
  app.add_option("--minutes", config.minutes, "how long faults are injected")
      ->check(CLI::Range(0.1, 24 * 60.0))
      ->capture_default_str();
  app.add_option("--seconds", config.seconds_override, "the same in seconds (overrides --minutes)")
      ->check(CLI::Range(5.0, 86400.0));
  app.add_option("--seed", config.seed, "random seed (printed; default random)");
  app.add_option("--worker-kill-every", config.worker_kill_every, "mean seconds between worker kills")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--stop-every", config.stop_every, "mean seconds between SIGSTOPs")
      ->check(CLI::Range(5.0, 3600.0))
      ->capture_default_str();
  app.add_option("--broker-kill-every", config.broker_kill_every,
                 "mean seconds between broker kills")
      ->check(CLI::Range(5.0, 36000.0))
      ->capture_default_str();
  app.add_option("--autoscaler-kill-every", config.autoscaler_kill_every,
                 "mean seconds between autoscaler kills")
      ->check(CLI::Range(5.0, 36000.0))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  try {
    return fleet::testing::Soak(config).Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet-soak: %s\n", e.what());
    return 2;
  }
}

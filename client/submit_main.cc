// fleet-submit: submits batches to the broker's frontend, waits for their
// results and prints one summary line. Exit 0 when every batch got a result,
// 1 when some were lost, 2 on bad flags or a setup error, 3 when the broker
// refused the handshake ("authentication failed").
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include "client/submit_output.h"
#include "common/clock.h"
#include "common/curve.h"
#include "common/endpoint.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/signals.h"
#include "fleet/client.h"

namespace {

using fleet::client::ResultView;
using fleet::client::SubmitSummary;

struct Config {
  std::string broker = "tcp://127.0.0.1:5555";
  std::uint64_t count = 1000;
  std::size_t size = 100;
  std::optional<std::string> payload;
  std::string input;
  std::size_t inflight = 1000;
  std::string queue = "default";
  std::string output;
  std::string ledger;
  double timeout_seconds = 0;
  double resend_after_seconds = 10;
  std::string log_level = "info";
  std::string curve_server_key, curve_key;
};

// Where payloads come from: --input lines, or --count copies of --payload or
// of a generated one. Reads lazily, so a large input is never all in memory.
class PayloadSource {
 public:
  explicit PayloadSource(const Config& config) : config_(config) {
    if (config.input.empty()) return;
    if (config.input == "-") {
      in_ = &std::cin;
      return;
    }
    file_.open(config.input);
    if (!file_) throw std::runtime_error("cannot read --input " + config.input);
    in_ = &file_;
  }

  // Fills `payload` for batch `id`; false once there are no more.
  bool Next(const std::string& id, std::string* payload) {
    if (in_ != nullptr) {
      if (!std::getline(*in_, *payload)) return false;
      if (!payload->empty() && payload->back() == '\r') payload->pop_back();
      return true;
    }
    if (produced_ >= config_.count) return false;
    ++produced_;
    *payload = config_.payload ? *config_.payload
                               : fleet::client::GeneratePayload(id, config_.size);
    return true;
  }

 private:
  const Config& config_;
  std::ifstream file_;
  std::istream* in_ = nullptr;
  std::uint64_t produced_ = 0;
};

std::string RunPrefix() {
  std::random_device rd;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
  return buf;
}

int Run(const Config& config) {
  fleet::SetupLogging("fleet-submit", config.log_level);

  std::ofstream output_file;
  std::ostream* output = nullptr;
  if (config.output == "-") {
    output = &std::cout;
  } else if (!config.output.empty()) {
    output_file.open(config.output, std::ios::out | std::ios::trunc);
    if (!output_file) {
      throw std::runtime_error("cannot write --output " + config.output);
    }
    output = &output_file;
  }
  std::ofstream ledger;
  if (!config.ledger.empty()) {
    ledger.open(config.ledger, std::ios::out | std::ios::trunc);
    if (!ledger) throw std::runtime_error("cannot write --ledger " + config.ledger);
  }
  PayloadSource source(config);

  // Results arrive on the client's I/O thread; the output, the ledger and
  // the counts are shared with this one under `mu`. Once `over` is set
  // (done, timed out or stopped), later results are not counted: what has
  // none by then is lost.
  std::mutex mu;
  std::condition_variable results_cv;
  SubmitSummary summary;
  std::uint64_t answered = 0;
  bool over = false;
  std::string refused;  // why the broker refused our handshake, once it did
  auto record = [&](const fleet::Result& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (over) return;
    if (r.ok) {
      ++summary.ok;
    } else {
      ++summary.failed;
    }
    ResultView view;
    view.id = r.id;
    view.outcome = r.ok ? fleet::proto::Outcome::kOk : fleet::proto::Outcome::kFailed;
    view.attempts = r.attempts;
    view.result = r.result;
    view.error = r.error;
    if (output != nullptr) *output << fleet::client::ResultJsonLine(view) << '\n';
    if (ledger.is_open()) ledger << fleet::client::LedgerResultLine(view) << '\n';
    ++answered;
    results_cv.notify_one();
  };
  // Copied for every batch: a pointer, small enough for std::function's
  // buffer, so no allocation per batch.
  auto on_result = [record = &record](const fleet::Result& r) { (*record)(r); };

  // The SDK's client (include/fleet/client.h).
  fleet::ClientOptions options;
  options.endpoint = config.broker;
  options.queue = config.queue;
  options.max_in_flight = config.inflight;
  options.curve_server_key = config.curve_server_key;
  options.curve_key = config.curve_key;
  options.resend_after = std::chrono::milliseconds(
      std::llround(config.resend_after_seconds * 1000));
  // One line per reconnect, never per batch.
  options.on_reconnect = [](std::size_t resent) {
    spdlog::info("reconnected to broker; re-sending {} batches without a result", resent);
  };
  // Before the client fails every batch with the same text: from here on
  // nothing is counted, and what has no result is lost.
  options.on_failure = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (over) return;  // finished (or timed out) first: those stand
    over = true;
    refused = why;
    results_cv.notify_one();
  };
  fleet::Client client(options);
  fleet::InstallStopSignals();

  const std::string prefix = RunPrefix();
  fleet::SteadyClock clock;
  const fleet::TimePoint start = clock.Now();
  std::optional<fleet::TimePoint> deadline;
  if (config.timeout_seconds > 0) {
    deadline = start + std::chrono::duration_cast<fleet::Duration>(
                           std::chrono::duration<double>(config.timeout_seconds));
  }
  const bool progress = isatty(STDERR_FILENO) == 1;
  fleet::TimePoint last_progress = start;
  bool exhausted = false;
  std::string id;
  std::string payload;

  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    // Keep about one window of batches ready behind the in-flight ones.
    while (!exhausted && summary.submitted - answered < 2 * config.inflight) {
      id = prefix + "-" + std::to_string(summary.submitted + 1);
      if (!source.Next(id, &payload)) {
        exhausted = true;
        break;
      }
      if (ledger.is_open()) ledger << fleet::client::LedgerSubmitLine(id, payload) << '\n';
      ++summary.submitted;
      lock.unlock();
      client.SubmitWithId(id, payload, on_result);  // ids are unique
      lock.lock();
    }
    if (exhausted && answered == summary.submitted) break;
    if (fleet::StopRequested() || !refused.empty()) break;
    fleet::TimePoint now = clock.Now();
    if (deadline && now >= *deadline) break;

    auto wait = std::chrono::milliseconds(250);
    if (deadline) {
      wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(*deadline - now));
    }
    // Woken by each result; a signal is seen within the wait.
    const std::uint64_t seen = answered;
    results_cv.wait_for(lock, wait, [&] { return answered != seen || !refused.empty(); });

    if (progress && clock.Now() - last_progress >= std::chrono::milliseconds(250)) {
      last_progress = clock.Now();
      std::fprintf(stderr, "\rsubmitted=%llu ok=%llu failed=%llu waiting=%llu\033[K",
                   static_cast<unsigned long long>(summary.submitted),
                   static_cast<unsigned long long>(summary.ok),
                   static_cast<unsigned long long>(summary.failed),
                   static_cast<unsigned long long>(summary.submitted - answered));
      std::fflush(stderr);
    }
  }
  over = true;
  summary.seconds = fleet::SecondsBetween(start, clock.Now());
  lock.unlock();
  if (progress) std::fprintf(stderr, "\r\033[K");
  if (!refused.empty()) {
    std::fprintf(stderr, "fleet-submit: %s\n", refused.c_str());
  } else if (fleet::StopRequested()) {
    spdlog::warn("stopped by signal {}", fleet::StopSignal());
  } else if (summary.lost() > 0) {
    spdlog::warn("timed out after {} s waiting for {} results",
                 config.timeout_seconds, summary.lost());
  }
  const fleet::ClientCounters c = client.counters();
  spdlog::debug(
      "messages={} accepted={} queue_full_retries={} disk_full_retries={} duplicates_dropped={} "
      "fetches={} resends={} reconnects={} reconnect_resends={} errors={}",
      c.submit_messages, c.accepted, c.queue_full_retries, c.disk_full_retries,
      c.duplicates_dropped, c.fetches,
      c.resends, c.reconnects, c.reconnect_resends, c.errors);
  if (output != nullptr) output->flush();
  if (ledger.is_open()) ledger.flush();
  std::cout << fleet::client::SummaryLine(summary) << std::endl;
  if (!refused.empty()) return fleet::kAuthFailed;
  return summary.lost() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app{
      "fleet-submit: submit batches to a fleet broker and wait for their "
      "results.\nEnds with: submitted=N ok=N failed=N lost=N seconds=S "
      "batches_per_s=R; exits 1 if any batch got no result, 2 on bad flags, 3 when the "
      "broker refuses the handshake (authentication failed)."};
  app.add_option("--broker", config.broker, "broker frontend endpoint")
      ->capture_default_str();
  app.add_option("--count", config.count, "batches to submit")
      ->capture_default_str();
  app.add_option("--size", config.size,
                 "bytes of each generated payload (printable, from the id)")
      ->capture_default_str();
  app.add_option("--payload", config.payload,
                 "the same payload for every batch (overrides --size)");
  app.add_option("--input", config.input,
                 "one payload per line from FILE, or - for stdin (overrides "
                 "--count)");
  app.add_option("--inflight", config.inflight,
                 "batches sent and without a result, at most")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}))
      ->capture_default_str();
  app.add_option("--queue", config.queue, "queue to submit to")
      ->capture_default_str();
  app.add_option("--output", config.output,
                 "write one JSON line per result to FILE (- for stdout)");
  app.add_option("--ledger", config.ledger,
                 "write the fault-test ledger to FILE: a line per batch submitted "
                 "and per result received (see tests/support/ledger.h)");
  app.add_option("--timeout-seconds", config.timeout_seconds,
                 "stop waiting after S seconds (0: wait forever); batches "
                 "without a result count as lost")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--resend-after-seconds", config.resend_after_seconds,
                 "a batch without a result this long is fetched from the broker, and "
                 "sent again if the broker lost it (a reconnect to the broker "
                 "re-sends every batch without a result at once)")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  app.add_option("--log-level", config.log_level,
                 "trace, debug, info, warn, error, off")
      ->capture_default_str();
  fleet::AddCurveClientFlags(app, &config.curve_server_key, &config.curve_key);
  int rc = fleet::ParseFlags(app, argc, argv);
  if (rc >= 0) return rc == 0 ? 0 : 2;
  try {
    fleet::CheckEndpoint("--broker", config.broker, fleet::EndpointUse::kConnect);
    return Run(config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet-submit: %s\n", e.what());
    return 2;
  }
}

// fleet-bench: fleet's own figures for `make bench` (bench/run.py runs it
// and collects the JSON line each subcommand prints last).
//
//   throughput  batches/s through one real broker and K real workers, from
//               P in-process producers (the client library) with a large
//               window; --handler sleep for the K x 100/s ideal; --durable
//               puts the broker's journal in a temporary --data-dir.
//   latency     open loop at a fixed rate: batch i is due at start + i/rate,
//               its latency runs from that due time to its result.
//   memory      broker RSS with N queued batches (no workers), and with W
//               connected idle workers.
//   decision    the autoscaler's per-poll cost with W workers' series on
//               the broker's page: parse, observe, decide.
//
// Processes come from the test support library (real fleet-broker and
// fleet-worker on ephemeral ports of 127.0.0.1, killed on exit). Figures
// are printed, never judged: tests do not assert on time.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/prctl.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "autoscaler/metrics_source.h"
#include "autoscaler/policy.h"
#include "autoscaler/pool.h"
#include "bench/bench_util.h"
#include "client/producer.h"
#include "common/clock.h"
#include "common/prom_text.h"
#include "tests/support/cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/wait.h"

namespace {

using fleet::bench::Latencies;
using fleet::bench::NowNs;
using fleet::bench::OpenLoop;
using fleet::bench::PrintResult;
using fleet::testing::Cluster;
using nlohmann::json;

struct FleetOptions {
  int workers = 4;
  int concurrency = 1;
  int prefetch = 0;
  std::string handler = "echo";
  std::string exec;  // --handler exec or process: the command
  int sleep_ms = 10;
  std::size_t size = 100;
  bool durable = false;
};

struct ProducerOptions {
  int producers = 1;
  std::uint64_t count = 100000;
  std::size_t window = 10000;
  std::size_t per_message = 256;
};

void Log(const std::string& what) {
  std::fprintf(stderr, "fleet-bench: %s\n", what.c_str());
}

// A broker (journal in the cluster's directory when durable) and its
// workers, registered.
void StartFleet(Cluster& c, const FleetOptions& o, std::vector<std::string> broker_extra = {}) {
  broker_extra.insert(broker_extra.end(), {"--log-level", "warn", "--max-queue", "10000000"});
  if (o.durable) broker_extra.insert(broker_extra.end(), {"--data-dir", c.dir().File("data")});
  c.StartBroker(broker_extra);
  for (int i = 0; i < o.workers; ++i) {
    std::vector<std::string> args = {"--handler", o.handler, "--concurrency",
                                     std::to_string(o.concurrency), "--prefetch",
                                     std::to_string(o.prefetch), "--log-level", "warn"};
    if (!o.exec.empty()) args.insert(args.end(), {"--exec", o.exec});
    c.StartWorker("bench-" + std::to_string(i), args);
  }
  if (!fleet::testing::WaitFor(
          [&] { return c.Workers().size() == static_cast<std::size_t>(o.workers); },
          std::chrono::seconds(60))) {
    throw std::runtime_error("workers did not register: " + c.BrokerLog());
  }
}

std::string Payload(const FleetOptions& o) {
  if (o.handler == "sleep") return std::to_string(o.sleep_ms);
  return std::string(o.size, 'x');
}

fleet::client::Producer::Options ProducerOpts(const Cluster& c, const ProducerOptions& p) {
  fleet::client::Producer::Options po;
  po.endpoint = c.frontend();
  po.max_in_flight = p.window;
  po.max_batches_per_message = p.per_message;
  po.resend_after = std::chrono::seconds(600);
  return po;
}

// Submits `count` batches from one producer as fast as its window allows;
// returns the results that came back ok.
std::uint64_t Drive(const Cluster& c, const ProducerOptions& p, std::uint64_t count,
                    const std::string& payload, const std::string& prefix) {
  fleet::SteadyClock clock;
  zmq::context_t ctx(1);
  std::uint64_t ok = 0, failed = 0;
  fleet::client::Producer producer(
      ctx, ProducerOpts(c, p),
      [&](const fleet::client::ResultView& r) {
        ++(r.outcome == fleet::proto::Outcome::kOk ? ok : failed);
      },
      clock);
  std::string id = prefix;
  std::uint64_t next = 0;
  const std::int64_t deadline = NowNs() + 600'000'000'000;
  while (ok + failed < count) {
    // Keep a little more than the window pending, so a free slot is filled
    // at once without copying all `count` batches up front.
    while (next < count && producer.outstanding() < p.window + p.per_message) {
      id.resize(prefix.size());
      char buf[24];
      auto end = std::to_chars(buf, buf + sizeof buf, next).ptr;
      id.append(buf, end);
      producer.Submit(id, "", payload);
      ++next;
    }
    producer.Poll(std::chrono::milliseconds(100));
    if (NowNs() > deadline) throw std::runtime_error("results stopped coming");
  }
  if (failed) throw std::runtime_error(std::to_string(failed) + " batches failed");
  return ok;
}

int Throughput(const FleetOptions& o, const ProducerOptions& p) {
  Cluster c;
  StartFleet(c, o);
  const std::string payload = Payload(o);
  Drive(c, p, std::min<std::uint64_t>(p.count / 10 + 100, 5000), payload, "warm-");
  Log("warm; running " + std::to_string(p.count) + " batches");
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> ok{0};
  std::vector<std::string> errors(p.producers);
  // Each producer's own rate (its share over the time it took): with equal
  // shares, a producer the broker served less finishes later.
  std::vector<double> producer_seconds(p.producers, 0);
  // CPU time per batch of each side, steadier than batches/s on a noisy
  // machine: the broker, this process (the producers), the workers.
  auto workers_cpu = [&] {
    double sum = 0;
    for (int i = 0; i < o.workers; ++i) {
      sum += fleet::bench::CpuSeconds(c.worker("bench-" + std::to_string(i)).pid());
    }
    return sum;
  };
  const double broker_cpu0 = fleet::bench::CpuSeconds(c.broker().pid());
  const double producer_cpu0 = fleet::bench::CpuSeconds(getpid());
  const double workers_cpu0 = workers_cpu();
  const std::int64_t start = NowNs();
  for (int i = 0; i < p.producers; ++i) {
    std::uint64_t share = p.count / p.producers + (i < static_cast<int>(p.count % p.producers));
    threads.emplace_back([&, i, share] {
      try {
        ok += Drive(c, p, share, payload, "p" + std::to_string(i) + "-");
        producer_seconds[i] = static_cast<double>(NowNs() - start) / 1e9;
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = static_cast<double>(NowNs() - start) / 1e9;
  const double broker_cpu = fleet::bench::CpuSeconds(c.broker().pid()) - broker_cpu0;
  const double producer_cpu = fleet::bench::CpuSeconds(getpid()) - producer_cpu0;
  const double worker_cpu = workers_cpu() - workers_cpu0;
  auto per_batch_us = [&](double cpu) { return ok.load() ? cpu * 1e6 / ok.load() : 0.0; };
  for (const auto& e : errors) {
    if (!e.empty()) throw std::runtime_error(e);
  }
  json r = {{"system", o.durable ? "fleet-durable" : "fleet"},
            {"bench", o.handler == "sleep" ? "sleep" : "throughput"},
            {"handler", o.handler},
            {"size", payload.size()},
            {"workers", o.workers},
            {"concurrency", o.concurrency},
            {"prefetch", o.prefetch},
            {"producers", p.producers},
            {"window", p.window},
            {"per_message", p.per_message},
            {"count", ok.load()},
            {"seconds", seconds},
            {"batches_per_s", static_cast<double>(ok.load()) / seconds},
            {"broker_rss_bytes", fleet::bench::RssBytes(c.broker().pid())},
            // The broker's own cost, steady on a noisy machine: CPU time
            // (all its threads) per batch.
            {"broker_cpu_us_per_batch", per_batch_us(broker_cpu)},
            {"producer_cpu_us_per_batch", per_batch_us(producer_cpu)},
            {"worker_cpu_us_per_batch", per_batch_us(worker_cpu)}};
  if (p.producers > 1) {
    // Fairness: the slowest producer's rate over the fastest's (1 = even),
    // and Jain's index over all of them (1 = even, 1/N = one got it all).
    json rates = json::array();
    double lo = 0, hi = 0, sum = 0, sum_sq = 0;
    for (int i = 0; i < p.producers; ++i) {
      const double share =
          static_cast<double>(p.count / p.producers + (i < static_cast<int>(p.count % p.producers)));
      const double rate = producer_seconds[i] > 0 ? share / producer_seconds[i] : 0;
      rates.push_back(rate);
      lo = i == 0 ? rate : std::min(lo, rate);
      hi = std::max(hi, rate);
      sum += rate;
      sum_sq += rate * rate;
    }
    r["producer_rates"] = rates;
    r["producer_min_over_max"] = hi > 0 ? lo / hi : 0;
    r["producer_jain"] = sum_sq > 0 ? sum * sum / (p.producers * sum_sq) : 0;
  }
  if (o.handler == "sleep") {
    const double ideal = o.workers * o.concurrency * 1000.0 / o.sleep_ms;
    r["sleep_ms"] = o.sleep_ms;
    r["ideal_per_s"] = ideal;
    r["efficiency"] = r["batches_per_s"].get<double>() / ideal;
  }
  PrintResult(r);
  return 0;
}

// Where a batch's time went, from the broker's histograms on `page`: the
// bucket bound under which `q` of the batches fall (an upper bound, at the
// histogram's resolution), for the queue wait (accepted -> dispatched) and
// the processing (dispatched -> result, which includes the wait in the
// worker's prefetch line and the trip back).
json BrokerSplit(const std::string& page, double q) {
  json out = json::object();
  for (const char* family : {"fleet_batch_wait_seconds", "fleet_batch_processing_seconds"}) {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    const std::string prefix = std::string(family) + "_bucket{le=\"";
    for (std::size_t at = page.find(prefix); at != std::string::npos;
         at = page.find(prefix, at + 1)) {
      const std::size_t le_at = at + prefix.size();
      const std::string le = page.substr(le_at, page.find('"', le_at) - le_at);
      const double count = std::atof(page.c_str() + page.find(' ', le_at) + 1);
      buckets.emplace_back(le == "+Inf" ? 1e9 : std::atof(le.c_str()), count);
    }
    if (buckets.empty() || buckets.back().second <= 0) continue;
    const double total = buckets.back().second;
    double bound = buckets.back().first;
    for (const auto& [le, count] : buckets) {
      if (count >= q * total) {
        bound = le;
        break;
      }
    }
    out[std::string(family) == "fleet_batch_wait_seconds" ? "broker_wait_p99_le_ms"
                                                          : "processing_p99_le_ms"] =
        bound * 1000;
  }
  return out;
}

int Latency(const FleetOptions& o, double rate, double seconds, std::size_t per_message) {
  Cluster c;
  StartFleet(c, o);
  const std::string payload = Payload(o);
  ProducerOptions p;
  p.window = 1'000'000;
  p.per_message = per_message;
  Drive(c, p, 2000, payload, "warm-");

  // Short sleeps end on time (the default slack is 50 us), as in the
  // ceiling's driver.
  prctl(PR_SET_TIMERSLACK, 1000UL);
  fleet::SteadyClock clock;
  zmq::context_t ctx(1);
  const auto total = static_cast<std::uint64_t>(rate * seconds);
  Latencies lat;
  lat.Reserve(total);
  std::uint64_t failed = 0;
  const std::int64_t start = NowNs() + 1'000'000;
  OpenLoop loop(rate, start);
  fleet::client::Producer producer(
      ctx, ProducerOpts(c, p),
      [&](const fleet::client::ResultView& r) {
        std::uint64_t i = 0;
        std::from_chars(r.id.data(), r.id.data() + r.id.size(), i);
        lat.Add(NowNs() - loop.Due(i));
        if (r.outcome != fleet::proto::Outcome::kOk) ++failed;
      },
      clock);
  std::uint64_t next = 0;
  char buf[24];
  // The first ZeroMQ connect is not part of any batch's latency.
  producer.Poll(std::chrono::milliseconds(50));
  const std::int64_t give_up = start + static_cast<std::int64_t>((seconds + 30) * 1e9);
  while (lat.size() < total && NowNs() < give_up) {
    if (next < total) {
      const std::int64_t left = loop.Due(next) - NowNs();
      if (left <= 0) {
        // Everything due goes out now, in as few SUBMITs as the producer
        // makes of it; then what came back is handled, without waiting.
        for (int k = 0; k < 256 && next < total && loop.Due(next) <= NowNs(); ++k) {
          auto end = std::to_chars(buf, buf + sizeof buf, next).ptr;
          producer.Submit(std::string_view(buf, end - buf), "", payload);
          ++next;
        }
        producer.Poll(std::chrono::milliseconds(0));
        continue;
      }
      // Wait on the socket until a millisecond before the next send is
      // due (the poll timeout has millisecond steps); the last stretch in
      // short sleeps between looks at the socket, so a reply waits at most
      // one of them and the cores stay free for the broker and workers.
      if (left > 2'000'000) {
        producer.Poll(std::chrono::milliseconds(left / 1'000'000 - 1));
      } else {
        producer.Poll(std::chrono::milliseconds(0));
        std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::int64_t>(left, 50'000)));
      }
    } else {
      producer.Poll(std::chrono::milliseconds(10));
    }
  }
  const double elapsed = static_cast<double>(NowNs() - start) / 1e9;
  json r = lat.Summary();
  r.update({{"system", o.durable ? "fleet-durable" : "fleet"},
            {"bench", "latency"},
            {"size", payload.size()},
            {"workers", o.workers},
            {"concurrency", o.concurrency},
            {"prefetch", o.prefetch},
            {"rate", rate},
            {"achieved_rate", static_cast<double>(next) / std::max(seconds, elapsed - 0.0)},
            {"lost", total - lat.size()},
            {"failed", failed}});
  // The broker refreshes its histograms within 20 ms of activity.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  r.update(BrokerSplit(fleet::testing::HttpGet(c.metrics()), 0.99));
  PrintResult(r);
  return lat.size() == total && failed == 0 ? 0 : 1;
}

int Memory(std::uint64_t batches, std::size_t size, int idle_workers, double idle_seconds) {
  json r = {{"system", "fleet"}, {"bench", "memory"}, {"size", size}, {"batches", batches}};
  {
    Cluster c;
    FleetOptions o;
    o.workers = 0;
    StartFleet(c, o, {"--max-queue-bytes", std::to_string(std::max<std::uint64_t>(
                                               batches * (size + 64) * 2, 1u << 30))});
    // One batch queued and gone first, so the baseline has the queue, its
    // metrics series and the producer's connection.
    const std::uint64_t before = fleet::bench::RssBytes(c.broker().pid());
    fleet::SteadyClock clock;
    zmq::context_t ctx(1);
    ProducerOptions p;
    p.window = std::max<std::uint64_t>(batches, 1);
    fleet::client::Producer producer(ctx, ProducerOpts(c, p), [](const auto&) {}, clock);
    const std::string payload(size, 'x');
    char buf[24];
    for (std::uint64_t i = 0; i < batches; ++i) {
      auto end = std::to_chars(buf, buf + sizeof buf, i).ptr;
      producer.Submit(std::string_view(buf, end - buf), "", payload);
    }
    const std::int64_t give_up = NowNs() + 600'000'000'000;
    while (producer.counters().accepted < batches && NowNs() < give_up) {
      producer.Poll(std::chrono::milliseconds(100));
    }
    if (producer.counters().accepted < batches) {
      throw std::runtime_error("broker accepted only " +
                               std::to_string(producer.counters().accepted));
    }
    const double queued = c.StatValue("queued");
    // A broker that went quiet hands the memory it freed while receiving
    // back to the system at its next housekeeping tick (half a heartbeat):
    // measured after that, as it sits holding the queue.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const std::uint64_t after = fleet::bench::RssBytes(c.broker().pid());
    const double per = batches ? static_cast<double>(after - before) / batches : 0;
    r.update({{"queued", queued},
              {"rss_idle_bytes", before},
              {"rss_queued_bytes", after},
              {"bytes_per_batch", per},
              {"bytes_per_batch_beyond_payload", per - static_cast<double>(size)}});
  }
  if (idle_workers > 0) {
    Cluster c;
    FleetOptions o;
    o.workers = 0;
    StartFleet(c, o);
    const std::uint64_t before = fleet::bench::RssBytes(c.broker().pid());
    o.workers = idle_workers;
    for (int i = 0; i < idle_workers; ++i) {
      c.StartWorker("idle-" + std::to_string(i), {"--log-level", "warn"});
    }
    if (!fleet::testing::WaitFor(
            [&] { return c.Workers().size() == static_cast<std::size_t>(idle_workers); },
            std::chrono::seconds(120))) {
      throw std::runtime_error("idle workers did not all register");
    }
    const std::uint64_t after = fleet::bench::RssBytes(c.broker().pid());
    // What the idle fleet costs the broker: every worker heartbeats once
    // per --heartbeat-ms (1 s) and is answered; nothing else happens.
    const double cpu0 = fleet::bench::CpuSeconds(c.broker().pid());
    std::this_thread::sleep_for(std::chrono::duration<double>(idle_seconds));
    const double idle_cpu = fleet::bench::CpuSeconds(c.broker().pid()) - cpu0;
    r.update({{"workers", idle_workers},
              {"rss_no_workers_bytes", before},
              {"rss_workers_bytes", after},
              {"bytes_per_worker",
               static_cast<double>(after - before) / static_cast<double>(idle_workers)},
              {"idle_seconds", idle_seconds},
              {"broker_idle_cpu_percent", 100.0 * idle_cpu / idle_seconds},
              {"broker_cpu_us_per_worker_heartbeat",
               1e6 * idle_cpu / (idle_seconds * static_cast<double>(idle_workers))}});
  }
  PrintResult(r);
  return 0;
}

// The broker's real page with one worker, its per-worker series copied for
// `workers` ids of an autoscaler's pool; then parse + observe + decide.
int Decision(int workers, int rounds) {
  Cluster c;
  FleetOptions o;
  o.workers = 1;
  StartFleet(c, o);
  fleet::testing::WaitFor(
      [&] { return fleet::testing::HttpGet(c.metrics()).find("bench-0") != std::string::npos; });
  const std::string page1 = fleet::testing::HttpGet(c.metrics());

  fleet::FakeClock clock;
  fleet::autoscaler::PoolOptions pool_opts;
  fleet::autoscaler::PoolTracker pool(pool_opts, "bench");
  fleet::autoscaler::PolicyOptions policy_opts;
  policy_opts.max_workers = workers;
  policy_opts.min_workers = 0;
  policy_opts.max_step = workers;
  fleet::autoscaler::Policy policy(policy_opts);
  std::vector<std::string> ids;
  for (int i = 0; i < workers; ++i) ids.push_back(pool.Launch(clock.Now()));

  std::string page;
  std::size_t pos = 0;
  while (pos < page1.size()) {
    std::size_t end = page1.find('\n', pos);
    if (end == std::string::npos) end = page1.size();
    const std::string line = page1.substr(pos, end - pos);
    pos = end + 1;
    const auto at = line.find("\"bench-0\"");
    if (at == std::string::npos) {
      page += line + "\n";
      continue;
    }
    for (const auto& id : ids) {
      page += line.substr(0, at + 1) + id + line.substr(at + 8) + "\n";
    }
  }

  Latencies per_poll;
  std::size_t seen = 0;
  for (int i = 0; i < rounds; ++i) {
    clock.Advance(std::chrono::seconds(1));
    const std::int64_t t0 = NowNs();
    fleet::prom::ParseResult parsed = fleet::prom::ParsePromText(page);
    fleet::autoscaler::Observation obs =
        fleet::autoscaler::ObservationFromPage(parsed, 0, {}, nullptr);
    pool.Observe(obs, clock.Now());
    auto decision = policy.Decide(obs, pool, clock.Now());
    per_poll.Add(NowNs() - t0);
    seen = obs.workers.size();
    (void)decision;
  }
  json r = per_poll.Summary();
  r.update({{"system", "fleet"},
            {"bench", "decision"},
            {"workers", workers},
            {"workers_seen", seen},
            {"page_bytes", page.size()},
            {"rounds", rounds}});
  PrintResult(r);
  return seen == static_cast<std::size_t>(workers) ? 0 : 1;
}

void AddFleetOptions(CLI::App* cmd, FleetOptions& o) {
  cmd->add_option("--workers", o.workers, "fleet-worker processes")->capture_default_str();
  cmd->add_option("--concurrency", o.concurrency, "slots per worker")->capture_default_str();
  cmd->add_option("--prefetch", o.prefetch, "fleet-worker --prefetch")->capture_default_str();
  cmd->add_option("--handler", o.handler,
                  "echo, sleep, or exec/process with --exec (an echoing command)")
      ->check(CLI::IsMember({"echo", "sleep", "exec", "process"}))
      ->capture_default_str();
  cmd->add_option("--exec", o.exec, "fleet-worker --exec, for --handler exec or process");
  cmd->add_option("--sleep-ms", o.sleep_ms, "sleep handler: ms per batch")->capture_default_str();
  cmd->add_option("--size", o.size, "echo payload bytes")->capture_default_str();
  cmd->add_flag("--durable", o.durable, "broker with --data-dir (journal, group commit)");
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{"fleet-bench: fleet's throughput, latency, memory and autoscaler decision cost; "
               "prints one JSON line per run (see bench/run.py)"};
  app.require_subcommand(1);
  FleetOptions fo;
  ProducerOptions po;
  double rate = 1000, seconds = 5;
  std::uint64_t batches = 1'000'000;
  int idle_workers = 200, decision_workers = 1000, rounds = 200;
  double idle_seconds = 5;

  auto* tp = app.add_subcommand("throughput", "batches/s with a large window");
  AddFleetOptions(tp, fo);
  tp->add_option("--producers", po.producers, "producer threads")->capture_default_str();
  tp->add_option("--count", po.count, "batches (after a warm-up)")->capture_default_str();
  tp->add_option("--window", po.window, "in flight per producer")->capture_default_str();
  tp->add_option("--per-message", po.per_message, "most batches per SUBMIT (1: no coalescing)")
      ->capture_default_str();

  auto* lt = app.add_subcommand("latency", "open-loop latency at a fixed rate");
  AddFleetOptions(lt, fo);
  lt->add_option("--rate", rate, "batches per second offered")->capture_default_str();
  lt->add_option("--seconds", seconds, "how long to offer them")->capture_default_str();
  lt->add_option("--per-message", po.per_message, "most batches per SUBMIT")
      ->capture_default_str();

  auto* mem = app.add_subcommand("memory", "broker RSS: queued batches, connected workers");
  mem->add_option("--batches", batches, "batches queued with no worker")->capture_default_str();
  mem->add_option("--size", fo.size, "payload bytes")->capture_default_str();
  mem->add_option("--workers", idle_workers, "idle workers connected (0: skip)")
      ->capture_default_str();
  mem->add_option("--idle-seconds", idle_seconds,
                  "how long the broker's CPU is measured with the idle workers connected")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 600.0));

  auto* dec = app.add_subcommand("decision", "autoscaler cost per poll");
  dec->add_option("--workers", decision_workers, "workers' series on the page")
      ->capture_default_str();
  dec->add_option("--rounds", rounds, "polls timed")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (po.producers < 1 || po.window < 1 || po.per_message < 1 || rate <= 0 || seconds <= 0) {
      std::fprintf(stderr, "fleet-bench: --producers, --window, --per-message, --rate and "
                           "--seconds must be positive\n");
      return 2;
    }
    if (*tp) return Throughput(fo, po);
    if (*lt) return Latency(fo, rate, seconds, po.per_message);
    if (*mem) return Memory(batches, fo.size, idle_workers, idle_seconds);
    if (*dec) return Decision(decision_workers, rounds);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet-bench: %s\n", e.what());
    return 1;
  }
  return 2;
}

// fleet-bench-ceiling: what ZeroMQ on this machine allows for fleet's
// workload, so fleet's figures can be reported as a fraction of it (issue 6,
// item 3). A load-balancing broker with nothing but the dispatch: a ROUTER to
// producers, a ROUTER to workers, a credit window per worker, a FIFO of
// waiting tasks; no protocol, no bookkeeping, no metrics. Workers and
// producers are as bare.
//
//   broker      binds --frontend and --backend, runs until SIGTERM/SIGINT.
//   worker      connects to the backend, grants --credit, echoes each task
//               (after --sleep-ms when given).
//   throughput  starts a broker and K workers (this binary, exec'd), then P
//               forked producers, each keeping --window tasks in flight.
//   latency     the same broker and workers; one open-loop producer in this
//               process: task i is due at start + i/rate and its latency
//               runs from that due time to its reply.
// The two drivers print one JSON line last on stdout (bench/run.py reads
// it); progress goes to stderr. Every child is killed and reaped on the way
// out, on errors and on SIGINT/SIGTERM too; a child whose driver dies gets
// SIGKILL from the kernel (PR_SET_PDEATHSIG).
//
// Wire, all multipart:
//   producer -> broker  [tag: 8 bytes][payload]
//   broker -> worker    [producer id][tag][payload]   (ROUTER adds/strips
//   worker -> broker    [producer id][tag][payload]    the worker's id)
//   broker -> producer  [tag][payload]
//   worker -> broker    [credit: uint32, host order]  READY, once
// A reply gives its worker one credit back. The tag is the task's index.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench/bench_util.h"
#include "bench/ceiling/children.h"

namespace {

using fleet::bench::Latencies;
using fleet::bench::NowNs;
using fleet::bench::OpenLoop;
using fleet::bench::PrintResult;
using nlohmann::json;
using fleet::bench::ceiling::Children;
using fleet::bench::ceiling::CloseFd;
using fleet::bench::ceiling::InstallStopHandlers;
using fleet::bench::ceiling::Interrupted;
using fleet::bench::ceiling::Log;
using fleet::bench::ceiling::ReportReader;
using fleet::bench::ceiling::StopFd;
using fleet::bench::ceiling::StopRequested;
using fleet::bench::ceiling::WaitReadable;

// Unbounded high-water marks: nothing is ever dropped (every sender's window
// bounds the queues). No linger: a stopped process exits at once.
void Tune(zmq::socket_t& s) {
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
  s.set(zmq::sockopt::linger, 0);
}

// Receives one whole message into f[0..max); frames beyond `max` are read
// and dropped. Returns the number of frames (> max: f[] is incomplete), 0
// when nothing is waiting (or `wait` was interrupted by a signal).
int RecvFrames(zmq::socket_t& s, zmq::message_t* f, int max, bool wait = false) {
  try {
    if (!s.recv(f[0], wait ? zmq::recv_flags::none : zmq::recv_flags::dontwait)) return 0;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    throw;
  }
  int n = 1;
  bool more = f[0].more();
  zmq::message_t extra;
  while (more) {
    zmq::message_t& into = n < max ? f[n] : extra;
    (void)s.recv(into);  // the rest of a message is already here
    more = into.more();
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------- broker

struct BrokerArgs {
  std::string frontend = "tcp://127.0.0.1:0";
  std::string backend = "tcp://127.0.0.1:0";
  int report_fd = -1;
};

void Report(int fd, const std::string& line) {
  if (fd < 0) return;
  const std::string l = line + "\n";
  if (write(fd, l.data(), l.size()) < 0) {
    // The driver went away; the kernel's PDEATHSIG ends us shortly.
  }
}

struct Task {
  zmq::message_t producer, tag, payload;
};

// One thread, one zmq::poll over both ROUTERs. Invariants: `credit` holds
// one routing id per task a worker will take now, so a worker granting c
// appears c times and each reply appends it once more (workers interleave
// as their replies come back); `waiting` is non-empty only while `credit`
// is empty. Each wake-up drains up to kBurst messages per socket with
// DONTWAIT, replies first (they free credit), instead of one zmq::poll per
// message. Rejected: leaving tasks in the frontend's pipe while no credit
// is left (cheaper still, but fleet's broker reads and queues every batch,
// and so does this one).
int RunBroker(const BrokerArgs& a) {
  constexpr int kBurst = 256;
  zmq::context_t ctx(1);
  zmq::socket_t fe(ctx, zmq::socket_type::router);
  zmq::socket_t be(ctx, zmq::socket_type::router);
  Tune(fe);
  Tune(be);
  fe.bind(a.frontend);
  be.bind(a.backend);
  Report(a.report_fd, "endpoints " + fe.get(zmq::sockopt::last_endpoint) + " " +
                          be.get(zmq::sockopt::last_endpoint));
  Log("broker: frontend " + fe.get(zmq::sockopt::last_endpoint) + ", backend " +
      be.get(zmq::sockopt::last_endpoint));

  std::deque<std::string> credit;
  std::deque<Task> waiting;
  std::size_t ready = 0;
  zmq::message_t f[4];

  auto to_worker = [&](zmq::message_t& producer, zmq::message_t& tag, zmq::message_t& payload) {
    // A routing id of libzmq's own is 5 bytes: inline in both std::string
    // and zmq::message_t, no allocation.
    zmq::message_t id(credit.front().data(), credit.front().size());
    credit.pop_front();
    be.send(id, zmq::send_flags::sndmore);
    be.send(producer, zmq::send_flags::sndmore);
    be.send(tag, zmq::send_flags::sndmore);
    be.send(payload, zmq::send_flags::none);
  };
  auto dispatch_waiting = [&] {
    while (!credit.empty() && !waiting.empty()) {
      Task& t = waiting.front();
      to_worker(t.producer, t.tag, t.payload);
      waiting.pop_front();
    }
  };

  zmq::pollitem_t items[] = {{fe.handle(), 0, ZMQ_POLLIN, 0},
                             {be.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, StopFd(), ZMQ_POLLIN, 0}};
  while (!StopRequested()) {
    try {
      zmq::poll(items, 3, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    for (int i = 0; i < kBurst; ++i) {
      const int n = RecvFrames(be, f, 4);
      if (n == 0) break;
      if (n == 2 && f[1].size() == sizeof(std::uint32_t)) {  // READY
        std::uint32_t c;
        std::memcpy(&c, f[1].data(), sizeof c);
        for (std::uint32_t k = 0; k < c; ++k) credit.emplace_back(f[0].data<char>(), f[0].size());
        Report(a.report_fd, "ready " + std::to_string(++ready));
      } else if (n == 4) {
        fe.send(f[1], zmq::send_flags::sndmore);
        fe.send(f[2], zmq::send_flags::sndmore);
        fe.send(f[3], zmq::send_flags::none);
        credit.emplace_back(f[0].data<char>(), f[0].size());
      }  // anything else is not ours: dropped
      dispatch_waiting();
    }
    for (int i = 0; i < kBurst; ++i) {
      const int n = RecvFrames(fe, f, 3);
      if (n == 0) break;
      if (n != 3) continue;
      if (credit.empty()) {
        waiting.push_back({std::move(f[0]), std::move(f[1]), std::move(f[2])});
      } else {
        to_worker(f[0], f[1], f[2]);
      }
    }
  }
  Log("broker: stopped, " + std::to_string(waiting.size()) + " tasks waiting");
  return 0;
}

// ---------------------------------------------------------------- worker

// Credit defaults to 1 = a fleet worker's effective window at its default
// --concurrency 1 (its credit is its free slots, CreditLedger). Compare like
// with like: run the ceiling with --credit equal to fleet's --concurrency.
constexpr std::uint32_t kDefaultCredit = 1;

struct WorkerArgs {
  std::string connect;
  std::uint32_t credit = kDefaultCredit;
  int sleep_ms = 0;
};

int RunWorker(const WorkerArgs& a) {
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  Tune(s);
  s.connect(a.connect);
  s.send(zmq::buffer(&a.credit, sizeof a.credit));
  zmq::message_t f[3];
  zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, StopFd(), ZMQ_POLLIN, 0}};
  while (!StopRequested()) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    for (int n; !StopRequested() && (n = RecvFrames(s, f, 3)) > 0;) {
      if (n != 3) continue;
      if (a.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
      s.send(f[0], zmq::send_flags::sndmore);
      s.send(f[1], zmq::send_flags::sndmore);
      s.send(f[2], zmq::send_flags::none);
    }
  }
  return 0;
}

// ---------------------------------------------------------------- drivers

struct ClusterArgs {
  int workers = 4;
  std::uint32_t credit = kDefaultCredit;
  int sleep_ms = 0;
};

// Starts the broker and the workers; returns the frontend once every
// worker's READY has reached the broker.
std::string StartCluster(Children& kids, const ClusterArgs& c) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) throw std::runtime_error("pipe2 failed");
  kids.Spawn("broker", {"broker", "--report-fd", "3"}, p[1]);
  CloseFd(p[1]);
  ReportReader reports(p[0]);
  struct Guard {
    int& fd;
    ~Guard() { CloseFd(fd); }
  } guard{p[0]};

  const std::string first = reports.Line(kids, 10);
  char fe[256], be[256];
  if (std::sscanf(first.c_str(), "endpoints %255s %255s", fe, be) != 2) {
    throw std::runtime_error("broker reported: " + first);
  }
  const std::int64_t t0 = NowNs();
  for (int i = 0; i < c.workers; ++i) {
    std::vector<std::string> args = {"worker", "--connect", be, "--credit",
                                     std::to_string(c.credit)};
    if (c.sleep_ms > 0) args.insert(args.end(), {"--sleep-ms", std::to_string(c.sleep_ms)});
    kids.Spawn("worker " + std::to_string(i), args);
  }
  const std::string want = "ready " + std::to_string(c.workers);
  while (reports.Line(kids, 30) != want) {
  }
  Log(std::to_string(c.workers) + " workers ready in " +
      std::to_string((NowNs() - t0) / 1'000'000) + " ms");
  return fe;
}

// ---------------------------------------------------------------- producers

zmq::message_t Tag(std::uint64_t i) { return zmq::message_t(&i, sizeof i); }

// Sends `n` tasks keeping at most `window` in flight; returns when all
// replies are back. Throws when a reply takes over 30 s.
void ClosedLoop(zmq::socket_t& s, std::uint64_t n, std::size_t window, const std::string& payload) {
  std::uint64_t sent = 0, got = 0;
  zmq::message_t f[2];
  while (got < n) {
    while (sent < n && sent - got < window) {
      s.send(Tag(sent++), zmq::send_flags::sndmore);
      s.send(zmq::buffer(payload), zmq::send_flags::none);
    }
    if (RecvFrames(s, f, 2, /*wait=*/true) == 0) {
      if (StopRequested()) throw Interrupted();
      throw std::runtime_error("no reply for 30 s");
    }
    ++got;
  }
}

zmq::socket_t ProducerSocket(zmq::context_t& ctx, const std::string& frontend) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  Tune(s);
  s.set(zmq::sockopt::rcvtimeo, 30'000);
  s.connect(frontend);
  return s;
}

// What a throughput producer tells its driver, one write each (atomic:
// shorter than PIPE_BUF).
struct Record {
  enum Kind : std::int32_t { kWarm = 1, kDone = 2 } kind;
  std::int32_t producer;
  std::int64_t start_ns, end_ns;
};

void WriteRecord(int fd, const Record& r) {
  if (write(fd, &r, sizeof r) != sizeof r) throw std::runtime_error("report pipe broken");
}

Record ReadRecord(int fd, Children& kids, std::int64_t deadline_ns) {
  Record r{};
  if (!WaitReadable(fd, deadline_ns, [&] { kids.CheckServices(); })) {
    throw std::runtime_error("producers did not report in time");
  }
  const ssize_t n = read(fd, &r, sizeof r);
  if (n == 0) throw std::runtime_error("a producer failed (see above)");
  if (n != sizeof r) throw std::runtime_error("short read from the producers' pipe");
  return r;
}

struct ThroughputArgs {
  ClusterArgs cluster;
  int producers = 1;
  std::size_t size = 100;
  std::uint64_t count = 100'000;
  std::size_t window = 1000;
  long warmup = -1;  // tasks over all producers; -1: 2000 (echo), 2 rounds (sleep)
};

// Producers are forked after the workers are ready and before this process
// has a ZeroMQ context. Each warms up, says so, waits for the pipe `go` to
// close (all start together), runs its share and reports its start and end
// on the steady clock, which all processes share (CLOCK_MONOTONIC).
int RunThroughput(const ThroughputArgs& a) {
  Children kids;
  const std::string frontend = StartCluster(kids, a.cluster);
  const long warmup = a.warmup >= 0 ? a.warmup
                      : a.cluster.sleep_ms > 0
                          ? 2L * a.cluster.workers * static_cast<long>(a.cluster.credit)
                          : 2000L;
  int results[2], go[2];
  if (pipe2(results, O_CLOEXEC) < 0 || pipe2(go, O_CLOEXEC) < 0) {
    throw std::runtime_error("pipe2 failed");
  }
  const std::string payload(a.size, 'x');
  for (int i = 0; i < a.producers; ++i) {
    const std::uint64_t share = a.count / a.producers + (static_cast<std::uint64_t>(i) <
                                                         a.count % a.producers);
    const std::uint64_t warm = static_cast<std::uint64_t>(warmup) / a.producers;
    kids.Fork("producer " + std::to_string(i), [&, i, share, warm] {
      close(results[0]);
      close(go[1]);
      zmq::context_t ctx(1);
      zmq::socket_t s = ProducerSocket(ctx, frontend);
      ClosedLoop(s, warm, a.window, payload);
      WriteRecord(results[1], {Record::kWarm, i, 0, 0});
      char c;
      while (read(go[0], &c, 1) < 0 && errno == EINTR) {
      }
      const std::int64_t start = NowNs();
      ClosedLoop(s, share, a.window, payload);
      WriteRecord(results[1], {Record::kDone, i, start, NowNs()});
      return 0;
    });
  }
  CloseFd(results[1]);
  CloseFd(go[0]);
  for (int i = 0; i < a.producers; ++i) {
    if (ReadRecord(results[0], kids, NowNs() + 120'000'000'000).kind != Record::kWarm) {
      throw std::runtime_error("producer out of step");
    }
  }
  Log("warm (" + std::to_string(warmup) + " tasks); running " + std::to_string(a.count));
  CloseFd(go[1]);
  std::int64_t start = INT64_MAX, end = 0;
  for (int i = 0; i < a.producers; ++i) {
    const Record r = ReadRecord(results[0], kids, 0);
    start = std::min(start, r.start_ns);
    end = std::max(end, r.end_ns);
  }
  CloseFd(results[0]);
  const double seconds = static_cast<double>(end - start) / 1e9;
  PrintResult({{"system", "ceiling"},
               {"bench", "throughput"},
               {"handler", a.cluster.sleep_ms > 0 ? "sleep" : "echo"},
               {"size", a.size},
               {"workers", a.cluster.workers},
               {"producers", a.producers},
               {"count", a.count},
               {"seconds", seconds},
               {"batches_per_s", static_cast<double>(a.count) / seconds},
               {"credit", a.cluster.credit},
               {"window", a.window},
               {"sleep_ms", a.cluster.sleep_ms}});
  return 0;
}

struct LatencyArgs {
  ClusterArgs cluster;
  std::size_t size = 100;
  double rate = 1000;
  double seconds = 5;
};

// Open loop on one DEALER. Between sends the process blocks in ppoll on the
// socket's ZMQ_FD until the next due time, with nanosecond timeouts and a
// 1 us timer slack; zmq_poll's timeout has millisecond steps, which would
// mean spinning (a core taken from the broker and workers on 2 cores) or
// sending late. ZMQ_FD is edge-like: before blocking, ZMQ_EVENTS is checked,
// which also re-arms it, so no reply waits unseen. OpenLoop::WaitFor is not
// used for the same reason: it sleeps without watching the socket.
int RunLatency(const LatencyArgs& a) {
  Children kids;
  const std::string frontend = StartCluster(kids, a.cluster);
  prctl(PR_SET_TIMERSLACK, 1000UL);
  zmq::context_t ctx(1);
  zmq::socket_t s = ProducerSocket(ctx, frontend);
  const std::string payload(a.size, 'x');
  ClosedLoop(s, 2000, 64, payload);  // connections up, caches warm: not timed

  const auto total = static_cast<std::uint64_t>(a.rate * a.seconds + 0.5);
  const int fd = s.get(zmq::sockopt::fd);
  Latencies lat;
  lat.Reserve(total);
  const std::int64_t start = NowNs() + 1'000'000;
  OpenLoop loop(a.rate, start);
  std::int64_t drain_until = 0, last_reply = start;
  std::uint64_t next = 0;
  zmq::message_t f[2];
  for (;;) {
    if (StopRequested()) throw Interrupted();
    while (RecvFrames(s, f, 2) > 0) {
      std::uint64_t i;
      if (f[0].size() != sizeof i) continue;
      std::memcpy(&i, f[0].data(), sizeof i);
      last_reply = NowNs();
      lat.Add(last_reply - loop.Due(i));
    }
    const std::int64_t now = NowNs();
    if (next < total && now >= loop.Due(next)) {
      s.send(Tag(next++), zmq::send_flags::sndmore);
      s.send(zmq::buffer(payload), zmq::send_flags::none);
      continue;
    }
    if (next == total) {
      if (lat.size() == total) break;
      if (drain_until == 0) drain_until = now + 5'000'000'000;
      if (now >= drain_until) break;
    }
    if (s.get(zmq::sockopt::events) & ZMQ_POLLIN) continue;
    const std::int64_t wait = (next < total ? loop.Due(next) : drain_until) - now;
    const timespec ts{static_cast<time_t>(wait / 1'000'000'000),
                      static_cast<long>(wait % 1'000'000'000)};
    pollfd p[2] = {{fd, POLLIN, 0}, {StopFd(), POLLIN, 0}};
    ppoll(p, 2, &ts, nullptr);
  }
  // From the first due time to the last reply, plus the one interval the
  // first send is owed: exactly `rate` for a system that keeps up.
  const double elapsed = static_cast<double>(last_reply - start) / 1e9 + 1 / a.rate;
  json r = lat.Summary();
  r.update({{"system", "ceiling"},
            {"bench", "latency"},
            {"size", a.size},
            {"workers", a.cluster.workers},
            {"rate", a.rate},
            {"achieved_rate", elapsed > 0 ? static_cast<double>(lat.size()) / elapsed : 0.0},
            {"lost", total - lat.size()},
            {"credit", a.cluster.credit}});
  PrintResult(r);
  return lat.size() == total ? 0 : 1;
}

void AddClusterOptions(CLI::App* cmd, ClusterArgs& c) {
  cmd->add_option("--workers", c.workers, "worker processes")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--credit", c.credit,
                  "tasks each worker takes at once (match fleet's --concurrency)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "fleet-bench-ceiling: a minimal ZeroMQ credit-window broker, workers and producers; "
      "the ceiling fleet's figures are compared with (bench/run.py)"};
  app.require_subcommand(1);

  BrokerArgs ba;
  auto* broker = app.add_subcommand("broker", "run the broker until SIGTERM/SIGINT");
  broker->add_option("--frontend", ba.frontend, "producers' endpoint to bind")
      ->capture_default_str();
  broker->add_option("--backend", ba.backend, "workers' endpoint to bind")->capture_default_str();
  broker->add_option("--report-fd", ba.report_fd,
                     "write the bound endpoints and each READY here (for the drivers)");

  WorkerArgs wa;
  auto* worker = app.add_subcommand("worker", "echo tasks from a broker's backend");
  worker->add_option("--connect", wa.connect, "broker backend endpoint")->required();
  worker->add_option("--credit", wa.credit, "tasks held at once (like fleet's --concurrency)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  worker->add_option("--sleep-ms", wa.sleep_ms, "sleep this long before each echo")
      ->check(CLI::Range(0, 60'000))
      ->capture_default_str();

  ThroughputArgs ta;
  auto* tp = app.add_subcommand("throughput", "tasks/s from P producers with a window each");
  AddClusterOptions(tp, ta.cluster);
  tp->add_option("--producers", ta.producers, "producer processes")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  tp->add_option("--size", ta.size, "payload bytes")
      ->check(CLI::Range(0, 64 << 20))
      ->capture_default_str();
  tp->add_option("--count", ta.count, "tasks over all producers, after the warm-up")
      ->check(CLI::Range(1ULL, 1'000'000'000ULL))
      ->capture_default_str();
  tp->add_option("--window", ta.window, "tasks in flight per producer")
      ->check(CLI::Range(1, 10'000'000))
      ->capture_default_str();
  tp->add_option("--sleep-ms", ta.cluster.sleep_ms, "workers sleep this long per task (0: echo)")
      ->check(CLI::Range(0, 60'000))
      ->capture_default_str();
  tp->add_option("--warmup", ta.warmup,
                 "untimed tasks first (default: 2000 echo, two rounds of credit when sleeping)")
      ->check(CLI::Range(0L, 10'000'000L));

  LatencyArgs la;
  auto* lt = app.add_subcommand("latency", "open-loop latency at a fixed offered rate");
  AddClusterOptions(lt, la.cluster);
  lt->add_option("--size", la.size, "payload bytes")
      ->check(CLI::Range(0, 64 << 20))
      ->capture_default_str();
  lt->add_option("--rate", la.rate, "tasks per second offered")
      ->check(CLI::Range(1.0, 10'000'000.0))
      ->capture_default_str();
  lt->add_option("--seconds", la.seconds, "how long they are offered")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  try {
    InstallStopHandlers();
    if (*broker) return RunBroker(ba);
    if (*worker) return RunWorker(wa);
    if (*tp) return RunThroughput(ta);
    if (*lt) {
      if (la.rate * la.seconds < 1) throw std::invalid_argument("--rate x --seconds is below 1");
      return RunLatency(la);
    }
  } catch (const Interrupted&) {
    Log("interrupted; children stopped");
    return 130;
  } catch (const std::exception& e) {
    Log(std::string("error: ") + e.what());
    return 1;
  }
  return 2;
}

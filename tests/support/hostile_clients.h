// Hostile peers for the fault tests and the hostile benchmark: raw TCP
// connections that send garbage to a ZeroMQ endpoint, CURVE key files for a
// broker with allowlists, and fleet-submit runs the broker must refuse (no
// key, a wrong server key, an unlisted key, a key of another role).
//
// Not thread-safe, except GarbageFlood, whose thread touches only its own
// sockets and counters.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process.h"

namespace fleet::testing {

// Raises this process's soft limit of open files to at least `want` (never
// above the hard limit); processes started afterwards inherit it. Returns the
// soft limit now.
std::size_t RaiseOpenFileLimit(std::size_t want);

struct GarbageStats {
  std::size_t rounds = 0;      // rounds completed
  std::size_t connected = 0;   // connections established
  std::size_t failed = 0;      // connects refused or timed out (3 s)
  std::size_t bytes_sent = 0;  // garbage the peer accepted into its socket
  double seconds = 0;          // spent in rounds (gaps between them not counted)
};

// One round of garbage: opens `count` TCP connections to the host and port of
// `endpoint` (tcp://HOST:PORT), `batch` at a time. Connection i sends one of
// four kinds of garbage, by i % 4: random bytes; a ZMTP 3.0 greeting for the
// NULL mechanism followed by junk; a CURVE greeting followed by a bogus HELLO;
// a CURVE greeting and a command header announcing 64 MiB, then a few KiB of
// it. Every connection stays open until the last batch is sent, then all are
// closed. Requires `count` spare open files (see RaiseOpenFileLimit).
GarbageStats GarbageRound(const std::string& endpoint, std::size_t count, std::size_t batch,
                          unsigned seed);

// A raw TCP connection to `endpoint` that speaks ZMTP 3.0 (NULL mechanism)
// as a DEALER, then starts one frame announcing `announced` bytes, sends
// `sent` of them and never finishes it: what a peer does to make the
// receiver hold memory it cannot see. Returns the fd (the caller closes it)
// or -1 when the connect failed. A broker that closes the connection
// meanwhile is not an error (see PeerClosed).
int StartUnfinishedFrame(const std::string& endpoint, std::size_t announced, std::size_t sent);

// True when the peer of `fd` has closed or reset the connection (reads and
// discards whatever it sent, without blocking).
bool PeerClosed(int fd);

// GarbageRound again and again on a thread, `gap` between rounds, until Stop.
class GarbageFlood {
 public:
  GarbageFlood(std::string endpoint, std::size_t count, std::size_t batch,
               std::chrono::milliseconds gap);
  ~GarbageFlood();
  GarbageFlood(const GarbageFlood&) = delete;
  GarbageFlood& operator=(const GarbageFlood&) = delete;

  // Rounds completed so far.
  std::size_t rounds() const { return rounds_.load(); }
  // Lets the round under way finish (so there is always at least one), joins
  // the thread and returns the totals. Idempotent.
  GarbageStats Stop();

 private:
  void Run();

  std::string endpoint_;
  std::size_t count_, batch_;
  std::chrono::milliseconds gap_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> rounds_{0};
  GarbageStats total_;  // written by the thread, read after join
  std::thread thread_;
};

// Key files made by `fleet-ctl keygen` in `dir`: the broker's pair, one key
// per role (producer, worker, control) on that role's allowlist, a stranger
// on no list, and an impostor pair posing as the broker.
class CurveSetup {
 public:
  // Throws std::runtime_error if keygen fails.
  explicit CurveSetup(const TempDir& dir);

  // fleet-broker flags: its secret key and the three allowlists.
  std::vector<std::string> BrokerFlags() const;
  // Client flags (fleet-submit, fleet-worker, fleet-ctl) to connect as `who`
  // ("producer", "worker", "control", "stranger") to the broker, or to the
  // key named by `server` ("broker", or "impostor" for a wrong server key).
  std::vector<std::string> As(const std::string& who, const std::string& server = "broker") const;

 private:
  const TempDir& dir_;
};

// fleet-submit runs, in the background, that the broker must refuse: no key,
// the producer's own key with a wrong server key, an unlisted key, and a
// worker's key (listed, for another role). Each keeps trying to submit
// generated batches for up to `timeout`; logs go to `dir`.
std::vector<std::unique_ptr<Process>> StartRefusedProducers(const std::string& frontend,
                                                            const CurveSetup& keys,
                                                            const TempDir& dir,
                                                            std::chrono::seconds timeout);

}  // namespace fleet::testing

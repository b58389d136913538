#include "tests/support/hostile_clients.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>

#include "tests/support/cluster.h"

namespace fleet::testing {
namespace {

// A ZMTP 3.0 greeting (64 bytes) offering `mechanism`, as a client.
std::string Greeting(const std::string& mechanism) {
  std::string g(64, '\0');
  g[0] = '\xff';
  g[9] = '\x7f';
  g[10] = 3;  // version 3.0
  g.replace(12, mechanism.size(), mechanism);
  return g;
}

std::string RandomBytes(std::mt19937& rng, std::size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// The four kinds of garbage of GarbageRound, by kind 0..3.
std::string Garbage(std::size_t kind, std::mt19937& rng) {
  switch (kind % 4) {
    case 0:
      return RandomBytes(rng, 256);
    case 1:  // a plain-text peer where CURVE is required, then junk frames
      return Greeting("NULL") + RandomBytes(rng, 128);
    case 2: {  // a HELLO of the right size whose box opens with no key
      std::string hello = "\x05HELLO" + RandomBytes(rng, 194);
      return Greeting("CURVE") + std::string("\x04") + static_cast<char>(hello.size()) + hello;
    }
    default: {  // a 64 MiB command announced, 4 KiB of it sent
      std::string header("\x06\0\0\0\0\x04\0\0\0", 9);
      return Greeting("CURVE") + header + RandomBytes(rng, 4096);
    }
  }
}

// One connected TCP socket to host:port, or -1.
int Connect(const sockaddr_in& addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{3, 0};  // bounds connect() too on Linux
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

sockaddr_in Address(const std::string& endpoint) {
  // tcp://HOST:PORT
  const std::string prefix = "tcp://";
  auto colon = endpoint.rfind(':');
  if (endpoint.rfind(prefix, 0) != 0 || colon == std::string::npos || colon < prefix.size()) {
    throw std::invalid_argument("not a tcp://HOST:PORT endpoint: " + endpoint);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  std::string host = endpoint.substr(prefix.size(), colon - prefix.size());
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    throw std::invalid_argument("not an IPv4 address: " + host);
  }
  return addr;
}

}  // namespace

std::size_t RaiseOpenFileLimit(std::size_t want) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
    lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min<rlim_t>(want, lim.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lim);
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  return lim.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<std::size_t>(lim.rlim_cur);
}

GarbageStats GarbageRound(const std::string& endpoint, std::size_t count, std::size_t batch,
                          unsigned seed) {
  const sockaddr_in addr = Address(endpoint);
  const auto start = std::chrono::steady_clock::now();
  std::mt19937 rng(seed);
  GarbageStats stats;
  std::vector<int> open;
  open.reserve(count);
  for (std::size_t i = 0; i < count; i += batch) {
    // A batch connects first and then writes, so the broker sees a burst
    // of connections arrive together rather than a trickle.
    std::vector<std::pair<int, std::size_t>> fresh;
    for (std::size_t k = i; k < std::min(count, i + batch); ++k) {
      int fd = Connect(addr);
      if (fd < 0) {
        ++stats.failed;
        continue;
      }
      ++stats.connected;
      open.push_back(fd);
      fresh.emplace_back(fd, k);
    }
    for (const auto& [fd, k] : fresh) {
      const std::string junk = Garbage(k, rng);
      // The peer may already have hung up (a bad greeting): that is fine.
      ssize_t n = send(fd, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) stats.bytes_sent += static_cast<std::size_t>(n);
    }
  }
  for (int fd : open) close(fd);
  stats.rounds = 1;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

int StartUnfinishedFrame(const std::string& endpoint, std::size_t announced, std::size_t sent) {
  const int fd = Connect(Address(endpoint));
  if (fd < 0) return -1;
  // READY with Socket-Type DEALER, then a long frame's header (flags 0x02,
  // 64-bit big-endian size).
  const std::string type = "Socket-Type", value = "DEALER";
  std::string ready = "\x05READY" + std::string(1, static_cast<char>(type.size())) + type +
                      std::string("\0\0\0", 3) + static_cast<char>(value.size()) + value;
  std::string out = Greeting("NULL") + "\x04" + static_cast<char>(ready.size()) + ready + "\x02";
  for (int shift = 56; shift >= 0; shift -= 8) {
    out += static_cast<char>((static_cast<std::uint64_t>(announced) >> shift) & 0xff);
  }
  out.append(std::min(sent, announced), 'x');
  std::size_t at = 0;
  while (at < out.size()) {
    // Blocking, bounded by the socket's 3 s send timeout.
    ssize_t n = send(fd, out.data() + at, out.size() - at, MSG_NOSIGNAL);
    if (n <= 0) break;  // closed by the broker: the caller finds out
    at += static_cast<std::size_t>(n);
  }
  return fd;
}

bool PeerClosed(int fd) {
  char buf[4096];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

GarbageFlood::GarbageFlood(std::string endpoint, std::size_t count, std::size_t batch,
                           std::chrono::milliseconds gap)
    : endpoint_(std::move(endpoint)), count_(count), batch_(batch), gap_(gap) {
  thread_ = std::thread([this] { Run(); });
}

GarbageFlood::~GarbageFlood() { Stop(); }

void GarbageFlood::Run() {
  unsigned seed = 1;
  do {
    GarbageStats s = GarbageRound(endpoint_, count_, batch_, seed++);
    total_.connected += s.connected;
    total_.failed += s.failed;
    total_.bytes_sent += s.bytes_sent;
    total_.seconds += s.seconds;
    total_.rounds = ++rounds_;
    // The gap is slept in slices so Stop is not held up by it.
    for (auto slept = std::chrono::milliseconds(0); slept < gap_ && !stop_.load();
         slept += std::chrono::milliseconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } while (!stop_.load());
}

GarbageStats GarbageFlood::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  return total_;
}

CurveSetup::CurveSetup(const TempDir& dir) : dir_(dir) {
  for (const char* name : {"broker", "producer", "worker", "control", "stranger", "impostor"}) {
    RunResult r = Run({Bin("fleet-ctl"), "keygen", dir_.File(name)}, std::chrono::seconds(20),
                      dir_.File(std::string("keygen-") + name + ".log"));
    if (r.exit_code != 0) throw std::runtime_error("fleet-ctl keygen failed: " + r.output);
  }
  for (const char* role : {"producer", "worker", "control"}) {
    std::ofstream(dir_.File(std::string(role) + "s.keys"))
        << "# " << role << "\n"
        << ReadFile(dir_.File(std::string(role) + ".pub"));
  }
}

std::vector<std::string> CurveSetup::BrokerFlags() const {
  return {"--curve-secret-key", dir_.File("broker.key"),
          "--curve-producers",  dir_.File("producers.keys"),
          "--curve-workers",    dir_.File("workers.keys"),
          "--curve-control",    dir_.File("controls.keys")};
}

std::vector<std::string> CurveSetup::As(const std::string& who, const std::string& server) const {
  return {"--curve-server-key", dir_.File(server + ".pub"), "--curve-key",
          dir_.File(who + ".key")};
}

std::vector<std::unique_ptr<Process>> StartRefusedProducers(const std::string& frontend,
                                                            const CurveSetup& keys,
                                                            const TempDir& dir,
                                                            std::chrono::seconds timeout) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> who = {
      {"no-key", {}},
      {"wrong-server-key", keys.As("producer", "impostor")},
      {"unlisted-key", keys.As("stranger")},
      {"worker-key", keys.As("worker")},
  };
  std::vector<std::unique_ptr<Process>> out;
  for (const auto& [name, flags] : who) {
    std::vector<std::string> argv = {Bin("fleet-submit"), "--broker", frontend, "--count",
                                     "1000000", "--size", "64", "--inflight", "50",
                                     "--timeout-seconds", std::to_string(timeout.count()),
                                     "--resend-after-seconds", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    out.push_back(std::make_unique<Process>(argv, dir.File("refused-" + name + ".log")));
  }
  return out;
}

}  // namespace fleet::testing

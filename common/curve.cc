#include "common/curve.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/log.h"
#include "common/zmq_util.h"

namespace fleet {

namespace {

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::string DecodeZ85(const std::string& z85) {
  std::string out(32, '\0');
  if (z85.size() != 40 ||
      zmq_z85_decode(reinterpret_cast<std::uint8_t*>(out.data()), z85.c_str()) == nullptr) {
    return "";
  }
  return out;
}

void WriteNew(const std::string& path, const std::string& text, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno) +
                             (errno == EEXIST ? " (refusing to overwrite a key)" : ""));
  }
  ssize_t n = ::write(fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write " + path);
}

// Reads the file's lines through one descriptor and reports its mode from
// fstat on that descriptor, so the file checked is the file read (symlinks
// are followed on purpose: Docker and Kubernetes secrets are links to the
// real file, whose mode is what counts).
std::vector<std::string> ReadLines(const std::string& path, unsigned* perms = nullptr) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot read key file " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw std::runtime_error("key file " + path + " is not a regular file");
  }
  if (perms != nullptr) *perms = st.st_mode & 07777;
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("cannot read key file " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    // A key file is two lines; an allowlist of a million keys is 42 MB.
    if (text.size() > (64u << 20)) throw std::runtime_error(path + ": larger than 64 MiB");
  }
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

}  // namespace

bool ValidZ85Key(const std::string& z85) { return !DecodeZ85(z85).empty(); }

CurveKeyPair GenerateKeyPair() {
  char pub[41] = {};
  char sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    throw std::runtime_error(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()) +
                             " (libzmq without CURVE support?)");
  }
  return {pub, sec};
}

void WriteKeyPair(const std::string& name, const CurveKeyPair& keys) {
  WriteNew(name + ".key",
           "# fleet CURVE key pair: keep this file secret\npublic = " + keys.public_key +
               "\nsecret = " + keys.secret_key + "\n",
           0600);
  WriteNew(name + ".pub", "# fleet CURVE public key\npublic = " + keys.public_key + "\n", 0644);
}

void CheckSecretKeyMode(const std::string& path, unsigned perms) {
  if ((perms & 077) == 0) return;
  char mode[16];
  std::snprintf(mode, sizeof mode, "%04o", perms);
  throw std::runtime_error("secret key file " + path + " has mode " + mode +
                           ": group or others may read it; make it readable by its owner "
                           "only: chmod 600 " + path);
}

CurveKeyPair ReadKeyFile(const std::string& path, bool need_secret) {
  CurveKeyPair k;
  int n = 0;
  unsigned perms = 0;
  for (const std::string& raw : ReadLines(path, &perms)) {
    ++n;
    std::string line = Trim(raw);
    if (line.empty() || line[0] == '#') continue;
    std::string key, value;
    if (auto eq = line.find('='); eq != std::string::npos) {
      key = Trim(line.substr(0, eq));
      value = Trim(line.substr(eq + 1));
    } else {
      key = "public";
      value = line;
    }
    if ((key != "public" && key != "secret") || !ValidZ85Key(value)) {
      throw std::runtime_error(path + ":" + std::to_string(n) +
                               ": expected \"public = <40 Z85 characters>\" or \"secret = ...\"");
    }
    (key == "public" ? k.public_key : k.secret_key) = value;
  }
  if (need_secret && k.secret_key.empty()) {
    throw std::runtime_error(path + ": no secret key (give the .key file from fleet-ctl keygen, "
                                    "not the .pub)");
  }
  // Whatever flag it came from: a file that holds a secret must be private.
  if (!k.secret_key.empty()) CheckSecretKeyMode(path, perms);
  if (!k.secret_key.empty()) {
    char derived[41] = {};
    if (zmq_curve_public(derived, k.secret_key.c_str()) != 0) {
      throw std::runtime_error(path + ": the secret key is not a CURVE key");
    }
    if (k.public_key.empty()) k.public_key = derived;
    if (k.public_key != derived) {
      throw std::runtime_error(path + ": the public key does not belong to the secret key");
    }
  }
  if (k.public_key.empty()) throw std::runtime_error(path + ": no key in the file");
  return k;
}

std::set<std::string> ReadAllowlist(const std::string& path) {
  std::set<std::string> keys;
  int n = 0;
  for (const std::string& raw : ReadLines(path)) {
    ++n;
    std::string line = Trim(raw);
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("public", 0) == 0 && line.find('=') != std::string::npos) {
      line = Trim(line.substr(line.find('=') + 1));
    }
    if (line.rfind("secret", 0) == 0) {
      throw std::runtime_error(path + ":" + std::to_string(n) +
                               ": a secret key in an allowlist; list public keys only");
    }
    if (!ValidZ85Key(line)) {
      throw std::runtime_error(path + ":" + std::to_string(n) +
                               ": not a public key (40 Z85 characters)");
    }
    keys.insert(line);
  }
  return keys;
}

CurveClient LoadCurveClient(const std::string& server_key_file, const std::string& key_file) {
  CurveClient c;
  if (server_key_file.empty() && key_file.empty()) return c;
  if (server_key_file.empty() || key_file.empty()) {
    throw std::invalid_argument(
        "CURVE needs both --curve-server-key (the broker's .pub) and --curve-key (this "
        "client's .key from fleet-ctl keygen)");
  }
  c.server_key = ReadKeyFile(server_key_file, false).public_key;
  c.keys = ReadKeyFile(key_file, true);
  return c;
}

void AddCurveClientFlags(CLI::App& app, std::string* server_key_file, std::string* key_file) {
  app.add_option("--curve-server-key", *server_key_file,
                 "CURVE: the broker's public key file (.pub); with --curve-key turns "
                 "encryption and authentication on");
  app.add_option("--curve-key", *key_file,
                 "CURVE: this client's key pair file (.key from fleet-ctl keygen; mode 0600: "
                 "refused if group or others may read it)");
}

void ApplyCurveClient(zmq::socket_t& socket, const CurveClient& curve) {
  if (!curve.enabled()) return;
  socket.set(zmq::sockopt::curve_serverkey, curve.server_key);
  socket.set(zmq::sockopt::curve_publickey, curve.keys.public_key);
  socket.set(zmq::sockopt::curve_secretkey, curve.keys.secret_key);
}

void ApplyCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys, const std::string& domain) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  // libzmq's ZMQ_ZAP_ENFORCE_DOMAIN is draft API (not in Debian's build):
  // nothing here stops a server without a handler from letting every key in.
  // The broker's start-up self-check (VerifyUnknownKeyRefused) is the guard.
  socket.set(zmq::sockopt::zap_domain, domain);
}

std::string EncodeZ85Key(const std::string& binary) {
  if (binary.size() != 32) return "";
  char out[41] = {};
  if (zmq_z85_encode(out, reinterpret_cast<const std::uint8_t*>(binary.data()), 32) == nullptr) {
    return "";
  }
  return out;
}

std::shared_ptr<const ZapHandler::BinaryLists> ZapHandler::Decode(const Allowlists& allow) {
  auto lists = std::make_shared<BinaryLists>();
  for (const auto& [domain, keys] : allow) {
    auto& binary = (*lists)[domain];
    for (const std::string& k : keys) binary.insert(DecodeZ85(k));
  }
  return lists;
}

ZapHandler::ZapHandler(zmq::context_t& context, Allowlists allow, const std::string& probe_key)
    : context_(context),
      allow_(Decode(allow)),
      probe_key_(probe_key.empty() ? "" : DecodeZ85(probe_key)),
      socket_(context, zmq::socket_type::rep) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { Run(); });
}

void ZapHandler::Replace(const Allowlists& allow) {
  std::shared_ptr<const BinaryLists> lists = Decode(allow);  // outside the lock
  std::lock_guard<std::mutex> lock(allow_mu_);
  allow_.swap(lists);
  // The old lists are freed by whoever drops the last reference: `lists`
  // here, or the handler thread's copy if it is deciding a request now.
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  thread_.join();
}

void ZapHandler::Run() {
  zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
  std::vector<zmq::message_t> frames;
  // By endpoint and peer address: one line per address per 10 s on each
  // endpoint, so a flood from one host neither floods the log nor hides
  // another host (or the same host on another endpoint).
  KeyedLogThrottle throttle;
  auto next_summary = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!stop_) {
    // The timeout only bounds how long a stop waits; requests wake it.
    const int ready = PollNoThrow(&item, 1, std::chrono::milliseconds(100));
    if (const auto now = std::chrono::steady_clock::now(); now >= next_summary) {
      next_summary = now + std::chrono::seconds(10);
      const KeyedLogThrottle::Summary held = throttle.Expire(now);
      if (held.events > 0) {
        spdlog::warn("refused {} more CURVE clients (keys not on an allowlist) from {} "
                     "addresses, not logged one by one", held.events, held.keys);
      }
    }
    if (ready <= 0) continue;
    if (!RecvMultipart(socket_, &frames)) continue;
    // version, request id, domain, address, identity, mechanism, credentials
    std::string status = "400", text = "refused", user;
    if (frames.size() >= 6 && frames[0].to_string_view() == "1.0") {
      const std::string domain = frames[2].to_string();
      const std::string mechanism = frames[5].to_string();
      std::shared_ptr<const BinaryLists> allow;
      {
        std::lock_guard<std::mutex> lock(allow_mu_);
        allow = allow_;
      }
      auto it = allow->find(domain);
      if (mechanism == "CURVE" && frames.size() >= 7 && it != allow->end() &&
          it->second.count(frames[6].to_string()) != 0) {
        status = "200";
        text = "OK";
        user = domain;
      }
      const std::string key = frames.size() >= 7 ? frames[6].to_string() : "";
      std::uint64_t held_back = 0;
      if (status == "200") {
        ++accepted_;
      } else if (!probe_key_.empty() && key == probe_key_) {
        spdlog::debug("the start-up self-check's unlisted key was refused on the {} endpoint, "
                      "as it must be", domain);
      } else if (++refused_,
                 throttle.Allow(domain + " " + frames[3].to_string(),
                                std::chrono::steady_clock::now(), &held_back)) {
        spdlog::warn("refused a {} client on the {} endpoint from {}: its key {} is not on "
                     "the endpoint's allowlist{}",
                     mechanism, domain.empty() ? "(no domain)" : domain, frames[3].to_string(),
                     key.empty() ? "(none)" : EncodeZ85Key(key),
                     held_back == 0
                         ? ""
                         : fmt::format(" ({} more refused from this address here since its last line)",
                                       held_back));
      }
    }
    const std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
    std::array<std::string, 6> reply{"1.0", request_id, status, text, user, ""};
    for (std::size_t i = 0; i < reply.size(); ++i) {
      socket_.send(zmq::buffer(reply[i]),
                   i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
}

bool VerifyUnknownKeyRefused(zmq::context_t& context, const std::string& endpoint,
                             const std::string& server_public_key, const CurveKeyPair& probe_keys,
                             std::chrono::milliseconds timeout, std::string* detail) {
  std::string target = endpoint;
  for (const char* any : {"tcp://0.0.0.0:", "tcp://*:"}) {
    if (target.rfind(any, 0) == 0) target = "tcp://127.0.0.1:" + target.substr(std::strlen(any));
  }
  static std::atomic<int> counter{0};
  const std::string monitor_endpoint = "inproc://fleet-curve-check-" + std::to_string(++counter);
  zmq::socket_t probe(context, zmq::socket_type::dealer);
  probe.set(zmq::sockopt::linger, 0);
  CurveClient stranger;
  stranger.server_key = server_public_key;
  stranger.keys = probe_keys;
  ApplyCurveClient(probe, stranger);
  const int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
  if (zmq_socket_monitor(probe.handle(), monitor_endpoint.c_str(), events) != 0) {
    *detail = std::string("cannot monitor the probe: ") + zmq_strerror(zmq_errno());
    return false;
  }
  zmq::socket_t monitor(context, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(monitor_endpoint);
  probe.connect(target);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<zmq::message_t> frames;
  bool refused = false;
  *detail = "no handshake with " + target + " within " + std::to_string(timeout.count()) + " ms";
  while (std::chrono::steady_clock::now() < deadline) {
    zmq::pollitem_t item{monitor.handle(), 0, ZMQ_POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (PollNoThrow(&item, 1, left) <= 0) continue;
    if (!RecvMultipart(monitor, &frames) || frames.empty() || frames[0].size() < 2) continue;
    std::uint16_t event = 0;
    std::memcpy(&event, frames[0].data(), sizeof event);
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      refused = true;
      *detail = "";
      break;
    }
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      *detail = "a client with an unknown key completed the handshake on " + endpoint;
      break;
    }
    *detail = "the probe's handshake failed for another reason (event " +
              std::to_string(event) + ")";
  }
  zmq_socket_monitor(probe.handle(), nullptr, 0);
  return refused;
}

}  // namespace fleet

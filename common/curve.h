// CURVE security for the broker's three endpoints: key files, client and
// server socket setup, and the ZAP handler that decides who gets in.
//
// Key files (written by `fleet-ctl keygen NAME`):
//   NAME.key  (mode 0600)  "public = <Z85>" and "secret = <Z85>" lines
//   NAME.pub               "public = <Z85>"
// Allowlists: one Z85 public key per line (a .pub file's "public = " prefix
// is accepted too); blank lines and # comments are ignored.
//
// libzmq accepts ANY client key when no ZAP handler answers; the broker
// therefore runs ZapHandler and, before it serves, proves with a real
// handshake (VerifyUnknownKeyRefused) that an unknown key is refused.
#pragma once

#include <CLI/CLI.hpp>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace fleet {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; empty for a .pub file
};

// Client side: the broker's public key and our own pair. Empty: plain TCP.
struct CurveClient {
  std::string server_key;
  CurveKeyPair keys;
  bool enabled() const { return !server_key.empty(); }
};

CurveKeyPair GenerateKeyPair();
// Writes NAME.key (0600) and NAME.pub; refuses to overwrite. Throws
// std::runtime_error with the reason.
void WriteKeyPair(const std::string& name, const CurveKeyPair& keys);
// Reads a key file; `need_secret` requires the secret line. A file that
// holds a secret key must not be open to group or others (mode & 077): it
// is refused with the file, its mode and the fix (chmod 600 FILE). Throws
// std::runtime_error naming the file and what is wrong.
CurveKeyPair ReadKeyFile(const std::string& path, bool need_secret);
// Reads an allowlist of public keys (Z85). Throws on a malformed line.
std::set<std::string> ReadAllowlist(const std::string& path);
// Throws std::runtime_error naming `path`, `perms` (its mode bits) and the
// fix when group or others have any access to it (perms & 077).
void CheckSecretKeyMode(const std::string& path, unsigned perms);
// True when `z85` is a well-formed 40-character Z85 key.
bool ValidZ85Key(const std::string& z85);

// The client flags every program shares (--curve-server-key FILE,
// --curve-key FILE) turned into keys; both empty: plain. Throws on half a
// configuration or a bad file.
CurveClient LoadCurveClient(const std::string& server_key_file, const std::string& key_file);

// Adds --curve-server-key and --curve-key to a client program.
void AddCurveClientFlags(CLI::App& app, std::string* server_key_file, std::string* key_file);

void ApplyCurveClient(zmq::socket_t& socket, const CurveClient& curve);
// Makes `socket` a CURVE server whose ZAP domain is `domain`.
void ApplyCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys, const std::string& domain);

// The ZAP handler (RFC 27) on inproc://zeromq.zap.01 of `context`, in its
// own thread: a CURVE client is let in only when its public key is in the
// allowlist of the domain of the socket it connects to, and gets that
// domain as its User-Id. Everything else (unknown key, unknown domain,
// another mechanism) is refused with 400 and logged as a warning with the
// endpoint, the peer's address and its public key (at most one line per
// peer address and endpoint per 10 s; the next says how many it stands
// for, and a summary line every 10 s counts those no line reported). `probe_key` (Z85, may be
// empty) is the broker's own start-up self-check: refused like any unknown
// key, but logged at debug and not counted, since it is no attack.
//
// Replace swaps the allowlists while the handler runs (the broker's SIGHUP
// reload): the handler thread reads them through a shared_ptr taken under a
// mutex once per request, so a swap never races a lookup and a request sees
// either the old lists or the new ones whole. Handshakes decided before the
// swap stand (their connections stay); the next handshake of a removed key
// is refused. Thread-safe: Replace and the counters from any thread.
class ZapHandler {
 public:
  using Allowlists = std::map<std::string, std::set<std::string>>;  // domain -> Z85 keys

  ZapHandler(zmq::context_t& context, Allowlists allow, const std::string& probe_key = "");
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  std::uint64_t accepted() const { return accepted_.load(); }
  std::uint64_t refused() const { return refused_.load(); }

  // Replaces every domain's allowlist with `allow` (Z85 keys, already
  // checked: ReadAllowlist). Handshakes from now on use the new lists.
  void Replace(const Allowlists& allow);

 private:
  using BinaryLists = std::map<std::string, std::set<std::string>>;  // domain -> binary keys
  static std::shared_ptr<const BinaryLists> Decode(const Allowlists& allow);
  void Run();

  zmq::context_t& context_;
  mutable std::mutex allow_mu_;
  std::shared_ptr<const BinaryLists> allow_;  // guarded by allow_mu_; never null
  std::string probe_key_;                               // binary; "" when none
  zmq::socket_t socket_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> accepted_{0};
  std::atomic<std::uint64_t> refused_{0};
};

// Connects to `endpoint` (as bound; a wildcard address is reached on
// 127.0.0.1) with `probe`, a fresh key pair nobody listed, and waits for
// the handshake. True when the server refused it; false with `detail` when
// it let it in or said nothing within `timeout`.
bool VerifyUnknownKeyRefused(zmq::context_t& context, const std::string& endpoint,
                             const std::string& server_public_key, const CurveKeyPair& probe,
                             std::chrono::milliseconds timeout, std::string* detail);

// Z85 text of a 32-byte binary key, or "" when `binary` is not 32 bytes.
std::string EncodeZ85Key(const std::string& binary);

}  // namespace fleet

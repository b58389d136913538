// Tunables of fleet-broker, with defaults. Flags map onto these in main.cc.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"

namespace fleet::broker {

class JournalIo;

struct BrokerOptions {
  std::string frontend = "tcp://*:5555";  // producers
  std::string backend = "tcp://*:5556";   // workers
  std::string control = "tcp://*:5557";   // fleet-ctl, autoscaler
  std::string ready_file;  // if set: resolved endpoints written here once bound

  std::size_t max_queue = 100000;  // batches waiting, all queues; 1..1e8
  // Payload bytes held (queued + running), all queues; past it "queue full".
  std::size_t max_queue_bytes = std::size_t{1} << 30;
  // Unfinished batches one producer connection may hold; 0: only the
  // global caps. Keeps one flooding producer from filling the queue.
  std::size_t max_inflight_per_producer = 0;
  std::uint32_t max_attempts = 5;  // dispatches before dead-lettering; 1..100
  Duration blacklist_ttl = std::chrono::seconds(120);  // 0..1 day
  // A retired worker that holds nothing is told to stop this long after its
  // retirement, not at once: a burst arriving meanwhile can take it back
  // (unretire) instead of cold-starting another. 0..1 min.
  Duration retire_linger = std::chrono::milliseconds(1000);
  Duration heartbeat = std::chrono::milliseconds(1000);  // 10 ms..60 s
  std::uint32_t liveness = 3;  // missed heartbeats before a worker is dead
  Duration result_retention = std::chrono::seconds(300);  // dedup window
  std::size_t max_retained_results = 100000;  // results kept for dedup/fetch
  std::size_t max_batch_bytes = 16u << 20;     // one payload; 1..1 GiB
  // One frame from any peer; 0: max_batch_bytes + kEnvelopeBytes (see
  // MaxMessageBytes). Else at least max_batch_bytes + 1 KiB; up to 1 GiB.
  std::size_t max_message_bytes = 0;
  // Worst-case bytes that connections which have not yet sent a valid
  // message may make the broker hold (each is charged one frame of
  // ZMQ_MAXMSGSIZE); a connection past it is refused. 0: no limit.
  // --max-inbound-mb; at least one frame, up to 1 TiB.
  std::uint64_t max_inbound_bytes = std::uint64_t{256} << 20;
  // How long a connection that has sent nothing valid is safe from being
  // closed to make room for a new one under max_inbound_bytes. 10 ms..1 min.
  Duration unproven_grace = std::chrono::seconds(1);
  std::size_t max_id_bytes = 256;              // batch, worker, queue ids
  // How long an object request (OBJECT_GET passed on as OBJECT_REQUEST)
  // waits for the producer before the worker gets `timeout`. 0.1 s..1 h.
  Duration object_timeout = std::chrono::seconds(30);
  // CURVE: the broker's key pair file and the allowlists of client public
  // keys per endpoint. All empty: plain TCP (anyone who reaches a port).
  std::string curve_secret_key_file;
  std::string curve_producers_file;
  std::string curve_workers_file;
  std::string curve_control_file;
  // Journal directory (--data-dir); empty: in memory only.
  std::string data_dir;
  std::uint64_t journal_segment_bytes = 64ull << 20;  // a new segment past this
  bool journal_recover = false;  // start past damaged records (--journal-recover)
  // At most one journal write (and fdatasync) starts per interval; what
  // comes meanwhile goes with the next (--journal-sync-interval-ms). 0: a
  // write starts as soon as the last one is done.
  Duration journal_sync_interval = std::chrono::milliseconds(2);
  JournalIo* journal_io = nullptr;  // tests: the journal's file system (null: the real one)
};

// The protocol's largest envelope around one payload of max_batch_bytes: a
// DONE carrying one result of that size with a 64 KiB error text, or a
// SUBMIT of one batch with 256-byte id and queue, and their msgpack
// headers, rounded up.
inline constexpr std::size_t kEnvelopeBytes = 68u << 10;

// Bytes over --max-message-bytes that libzmq still delivers (ZMQ_MAXMSGSIZE),
// so a slightly oversized frame gets ERROR too_large instead of a silently
// dropped connection; larger frames make libzmq drop the connection.
inline constexpr std::size_t kFrameSlackBytes = 64u << 10;

// --max-message-bytes as set, or derived from --max-batch-bytes.
inline std::size_t MaxMessageBytes(const BrokerOptions& o) {
  return o.max_message_bytes != 0 ? o.max_message_bytes : o.max_batch_bytes + kEnvelopeBytes;
}

// ZMQ_MAXMSGSIZE of the broker's sockets.
inline std::size_t TransportFrameLimit(const BrokerOptions& o) {
  return MaxMessageBytes(o) + kFrameSlackBytes;
}

}  // namespace fleet::broker

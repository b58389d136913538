// Producer: the client side of the broker's frontend. Submits batches over
// one DEALER socket with a bounded in-flight window, coalesces many batches
// into one SUBMIT, retries queue-full rejections with backoff, re-sends every
// batch without a result as soon as the connection to the broker comes back,
// fetches batches whose result is overdue and submits again the ones the
// broker lost, and hands each submitted id's result to a callback exactly
// once.
//
// Refusals. The same monitor reports failed handshakes into a
// HandshakeWatch (common/handshake_watch.h): once the broker refused this
// client for good (its key, its mechanism, or the wrong server key),
// handshake().failed() says so and why.
//
// Reconnects. A ZeroMQ socket monitor on the DEALER (an inproc PAIR, polled
// by Poll beside the DEALER: no thread, no sleep) reports each completed
// handshake with the broker. Every handshake after the first is a new
// connection: the broker restarted (an in-memory one lost every batch), or
// the network dropped (the broker kept the batches, but its results for
// them went to the old connection's routing id and were dropped). Either
// way libzmq also dropped whatever was still queued for the old connection
// (ZMQ_IMMEDIATE). So on each reconnect every batch that was sent and has
// no result is submitted again at once with the same id and payload, and
// the reconnect callback is told how many. Not on the disconnect: libzmq
// reports it a moment before it closes the old pipe, so a SUBMIT sent then
// is dropped too; at the handshake it is one of the batches re-sent.
//
// Why re-SUBMIT and not FETCH-then-submit: the broker deduplicates SUBMIT by
// id, checked before any queue limit (docs/protocol.md, SUBMIT): an id with
// a retained result is accepted and its result sent again, nothing runs; an
// id still queued or running is accepted and re-owned by this connection,
// nothing runs again; only an id it does not know (a restarted in-memory
// broker, or a result past its retention) runs. That covers every answer
// FETCH could give, in one round trip instead of two, and a known id is
// never refused as queue-full. It costs the payloads of the window sent
// again, once per reconnect. Duplicate results (a result that was already on
// its way, plus the retained copy the re-SUBMIT brings back) are dropped here
// by id, so the application still sees each result once.
//
// The resend_after timer stays as the safety net for a batch lost while the
// connection stayed up (a result the broker could not deliver, a peer gone
// silent without a disconnect): it fetches the overdue ids and submits again
// the ones the broker answers "unknown".
//
// Owns its sockets (the DEALER, connected to Options::endpoint, and its
// monitor) and a copy of every batch without a result (see BatchTracker).
// Borrows the ZeroMQ context and the clock, which must outlive it.
// Move-only.
//
// Not thread-safe: one thread calls Submit and Poll (the process's loop).
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/batch_tracker.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/handshake_watch.h"
#include "common/protocol.h"
#include "common/zmq_util.h"

namespace fleet::client {

// One batch's final answer. Views are valid only during the callback.
struct ResultView {
  std::string_view id;
  proto::Outcome outcome = proto::Outcome::kOk;  // kOk or kFailed
  std::uint32_t attempts = 0;  // 0 when the broker rejected the batch
  std::string_view result;     // the handler's output
  std::string_view error;      // why it failed; "" when ok
};

class Producer {
 public:
  struct Options {
    std::string endpoint = "tcp://127.0.0.1:5555";
    // Batches handed to the broker and without a result; 1..1'000'000.
    std::size_t max_in_flight = 1000;
    // Coalescing caps for one SUBMIT (or FETCH): batches (1..65536) and
    // approximate bytes. A lone batch larger than max_message_bytes still
    // goes out alone.
    std::size_t max_batches_per_message = 256;
    std::size_t max_message_bytes = 1u << 20;
    // Queue-full retry: first wait, doubled per rejection of the same batch,
    // capped. Milliseconds to seconds.
    Duration retry_initial = std::chrono::milliseconds(10);
    Duration retry_max = std::chrono::seconds(1);
    // A batch sent this long ago without a result is fetched; if the broker
    // answers "unknown" it is submitted again. A reconnect re-sends at once
    // without waiting for this; it is the net for batches lost while the
    // connection stayed up. Seconds to minutes.
    Duration resend_after = std::chrono::seconds(10);
    SocketLimits socket;
    proto::Limits limits;  // applied to what the broker sends, and to Submit
  };

  struct Counters {
    std::uint64_t submit_messages = 0;     // SUBMIT messages sent
    std::uint64_t acks = 0;                // ACK messages received
    std::uint64_t accepted = 0;            // batches the broker accepted
    std::uint64_t queue_full_retries = 0;  // queue_full rejections
    std::uint64_t disk_full_retries = 0;   // disk_full rejections (also waited out)
    std::uint64_t rejected = 0;            // final rejections (also local)
    std::uint64_t results = 0;             // results handed to the callback
    std::uint64_t duplicates_dropped = 0;  // results for ids not outstanding
    std::uint64_t fetches = 0;             // ids fetched because overdue
    std::uint64_t resends = 0;             // ids submitted again (unknown)
    std::uint64_t connections = 0;         // handshakes with the broker
    std::uint64_t disconnects = 0;         // connections lost
    std::uint64_t reconnects = 0;          // connections after the first
    std::uint64_t reconnect_resends = 0;   // batches re-sent on reconnects
    std::uint64_t errors = 0;              // ERROR messages from the broker
    std::uint64_t malformed = 0;           // frames we could not decode
    std::uint64_t object_requests = 0;     // OBJECT_REQUESTs answered unknown_object
  };

  using ResultCallback = std::function<void(const ResultView&)>;
  // Told, from Poll, of each reconnect and how many batches it re-sends.
  using ReconnectCallback = std::function<void(std::size_t resent)>;

  // Connects (lazily: ZeroMQ connects in the background). Throws
  // zmq::error_t on a malformed endpoint or when the socket cannot be
  // monitored. `on_result` must not call Poll.
  Producer(zmq::context_t& context, Options options, ResultCallback on_result,
           const Clock& clock);
  Producer(Producer&&) = default;
  Producer& operator=(Producer&&) = delete;

  // A descriptor Poll also waits on (an eventfd another thread writes to
  // hand this one work): Poll returns early when it is readable; the
  // caller reads it. -1 (the default): none.
  void set_wake_fd(int fd) { wake_fd_ = fd; }

  // Replaces the reconnect callback (none by default). It must not call
  // Poll.
  void set_on_reconnect(ReconnectCallback on_reconnect) {
    on_reconnect_ = std::move(on_reconnect);
  }

  // Copies the batch into the pending FIFO; it is sent by Poll when the
  // window has room. An empty queue means "default". Returns false (and
  // takes nothing) when `id` is already outstanding. A batch the codec
  // limits forbid (empty or long id, large payload) is accepted here and
  // reported by the next Poll as a failed result with attempts 0.
  bool Submit(std::string_view id, std::string_view queue,
              std::string_view payload);

  // Runs the I/O once: sends what the window allows, waits up to `timeout`
  // (less when a retry or resend comes due, 0 if a result is already
  // waiting) for the broker, handles everything received, re-sends after a
  // reconnect, and calls the callbacks. Returns the number of results
  // delivered. Returns early on a signal. Throws only on ZeroMQ failures
  // that are not the peer's.
  std::size_t Poll(std::chrono::milliseconds timeout);

  // Submitted and without a result yet (pending + in flight).
  std::size_t outstanding() const { return tracker_.outstanding(); }
  // Handed to the broker (or waiting to be handed again) without a result.
  std::size_t in_flight() const { return tracker_.in_flight(); }
  // Submitted, not yet sent: waiting for a window slot.
  std::size_t pending() const { return tracker_.pending(); }
  const Counters& counters() const { return counters_; }
  // The broker's verdict on our handshakes: failed() once it refused this
  // client for good (see common/handshake_watch.h); Poll does not throw
  // for it, the caller decides (fleet::Client fails every batch).
  const HandshakeWatch& handshake() const { return handshake_; }

 private:
  void Flush(TimePoint now);
  bool FlushSubmits(TimePoint now);
  bool FlushFetches();
  std::size_t Receive(TimePoint now);
  std::size_t Handle(const proto::Message& message, TimePoint now);
  void ReadMonitor();
  void OnReconnect();
  std::size_t DeliverLocalRejections();
  void Deliver(const ResultView& view);

  Options options_;
  ResultCallback on_result_;
  ReconnectCallback on_reconnect_;
  const Clock* clock_;
  zmq::socket_t monitor_;  // PAIR: socket_'s connection events
  int monitor_fd_ = -1;         // monitor_'s ZMQ_FD, polled as a descriptor (Poll)
  bool monitor_unread_ = true;  // monitor_ not yet emptied by a receive
  zmq::socket_t socket_;
  BatchTracker tracker_;
  std::vector<std::string> fetch_queue_;  // ids to FETCH, not yet sent
  // Batches that failed local validation: (id, message), reported by Poll.
  std::vector<std::pair<std::string, std::string>> local_rejections_;
  bool send_blocked_ = false;  // the socket refused a send: wait for POLLOUT
  int wake_fd_ = -1;
  std::string buffer_;         // reused encode buffer
  std::vector<const BatchTracker::Batch*> sendable_;  // reused
  std::vector<zmq::message_t> frames_;                // reused
  Counters counters_;
  HandshakeWatch handshake_;
};

}  // namespace fleet::client

// fleet's C++ SDK, producer side: submit batches to a fleet broker and get
// each one's result once, as a future or through a callback.
//
//   #include <fleet/client.h>
//
//   fleet::ClientOptions options;
//   options.endpoint = "tcp://127.0.0.1:5555";
//   fleet::Client client(options);
//   std::future<fleet::Result> f = client.Submit("payload bytes");
//   fleet::Result r = f.get();          // r.ok, r.result or r.error
//
// Link with fleet::client (find_package(fleet) after `cmake --install`).
//
// The client runs one I/O thread of its own. It keeps every batch until its
// result is in: it resends what a restarted broker lost, waits and resends
// when the broker says queue_full, and never drops a batch. The wire
// protocol is docs/protocol.md; this header needs nothing but the standard
// library.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "fleet/errors.h"

namespace fleet {

// One batch's final answer.
struct Result {
  std::string id;
  bool ok = false;
  // Times the batch was dispatched to a worker; 0 when the broker (or the
  // client) refused it before any ran it.
  std::uint32_t attempts = 0;
  std::string result;  // the handler's output, when ok
  std::string error;   // why it failed ("dead-lettered after ...", the
                       // handler's error text, "payload too large" ...)
};

struct ClientOptions {
  // The broker's frontend (fleet-broker --frontend).
  std::string endpoint = "tcp://127.0.0.1:5555";
  // The queue batches go to; "" is the broker's "default".
  std::string queue;
  // Batches handed to the broker and without a result, at most; the rest
  // wait in the client, in order. 1..1'000'000.
  std::size_t max_in_flight = 1000;
  // A batch without a result this long is asked after and sent again if
  // the broker lost it (a reconnect resends at once without waiting).
  std::chrono::milliseconds resend_after{10000};
  // CURVE (docs/protocol.md, Security): the broker's public key file
  // (.pub) and this client's key pair file (.key), both or neither.
  std::string curve_server_key;
  std::string curve_key;
  // Told, on the I/O thread, of each reconnect to the broker after the
  // first connection and how many batches it sent again; may be empty.
  std::function<void(std::size_t resent)> on_reconnect;
  // Told once, on the I/O thread, when the broker refused this client's
  // handshake for good ("authentication failed: ..."; see
  // AuthenticationError), before every batch without a result is failed
  // with that text. May be empty.
  std::function<void(const std::string& why)> on_failure;
};

// What the client did so far, for logs and metrics.
struct ClientCounters {
  std::uint64_t submit_messages = 0;     // SUBMIT messages sent (several batches each)
  std::uint64_t accepted = 0;            // batches the broker accepted
  std::uint64_t queue_full_retries = 0;  // queue_full answers, each waited out and resent
  std::uint64_t disk_full_retries = 0;   // disk_full answers (the broker's disk), the same
  std::uint64_t rejected = 0;            // batches refused for good (too large, bad id)
  std::uint64_t results = 0;             // results handed over
  std::uint64_t duplicates_dropped = 0;  // second results for a batch, dropped
  std::uint64_t fetches = 0;             // overdue batches asked after
  std::uint64_t resends = 0;             // batches sent again: the broker had lost them
  std::uint64_t reconnects = 0;          // connections to the broker after the first
  std::uint64_t reconnect_resends = 0;   // batches sent again on those
  std::uint64_t errors = 0;              // ERROR answers from the broker
};

// Thread-safe: any thread may submit. Callbacks run on the client's I/O
// thread (those the destructor fails, on the destroying thread); they must
// not block for long, must not wait for other results (WaitAll, a future's
// get) and must not destroy the client; an exception a callback throws is
// logged and dropped.
//
// Submit never blocks and never refuses for lack of room: what is beyond
// max_in_flight waits in the client's memory. A producer of unbounded work
// should keep its own bound (for example, submit more only while
// outstanding() is below a limit).
class Client {
 public:
  // Connects in the background. Throws std::invalid_argument on bad
  // options (a malformed endpoint, an unreadable key file or one that
  // others may read).
  //
  // When the broker refuses the handshake for good (a key not on its
  // allowlist, plain TCP to a CURVE broker or the reverse, the wrong server
  // key: docs/protocol.md, Security), the client gives up: every batch
  // without a result, and every one submitted later, fails: a future with
  // AuthenticationError, a callback with a failed Result whose error is the
  // same text; error() returns it.
  explicit Client(ClientOptions options = {});
  // Stops the I/O thread. Batches still without a result are not waited
  // for: their futures get a std::runtime_error, their callbacks a failed
  // Result whose error says the client was closed (the broker may still
  // run them). Call WaitAll first to wait for them.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Submits one batch under an id the client makes up (unique in this
  // process and run).
  std::future<Result> Submit(std::string payload);
  void Submit(std::string payload, std::function<void(const Result&)> on_result);
  // With your own id (1..256 bytes): a batch submitted again with the same
  // id while the broker still knows it is not run again (the broker keeps
  // finished results for a while), so a retry after a crash is safe.
  // Refused (a failed Result, attempts 0) when the id is already waiting
  // for its result in this client.
  std::future<Result> SubmitWithId(std::string id, std::string payload);
  void SubmitWithId(std::string id, std::string payload,
                    std::function<void(const Result&)> on_result);

  // Submitted and without a result yet.
  std::size_t outstanding() const;
  // As of the I/O thread's last turn.
  ClientCounters counters() const;
  // Empty while the client works; once the broker refused it for good,
  // why ("authentication failed: ...").
  std::string error() const;
  // Waits until every batch submitted so far has its result, or `timeout`
  // passes; true if all are in.
  bool WaitAll(std::chrono::milliseconds timeout);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fleet

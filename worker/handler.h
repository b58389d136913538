// What a worker does with one batch: the Handler interface, the built-in
// echo / sleep / sha256 handlers and the factory that picks one by name
// (exec lives in exec_handler.h).
//
// A Handler is shared by every slot thread, so every implementation must be
// thread-safe; the built-in ones hold no mutable state.
#pragma once

#include <chrono>
#include <memory>
#include <cstdint>
#include <string>
#include <string_view>

namespace fleet::worker {

// Seconds as a double; 0 means "no limit".
using Timeout = std::chrono::duration<double>;

// The outcome of one batch. A failed batch is a value, never an exception.
struct HandlerOutput {
  bool ok = true;
  std::string result;  // the handler's output ("" when failed)
  std::string error;   // why it failed ("" when ok)
  // Failed without running to an answer (its handler process died or broke
  // the protocol): the broker is asked for another try (DONE outcome retry).
  bool retry = false;

  static HandlerOutput Ok(std::string result) {
    return HandlerOutput{true, std::move(result), {}, false};
  }
  static HandlerOutput Failed(std::string error) {
    return HandlerOutput{false, {}, std::move(error), false};
  }
  static HandlerOutput Retry(std::string error) {
    return HandlerOutput{false, {}, std::move(error), true};
  }
};

// What a handler may want to know about the batch besides its payload.
struct BatchInfo {
  std::string_view id;
  std::string_view queue;
  std::uint32_t attempt = 1;
};

class Handler {
 public:
  virtual ~Handler() = default;

  // Runs one batch. `payload` is moved in (a handler may hand it back as its
  // result without copying). `timeout` > 0 bounds how long the batch may run:
  // a handler that can stop early (sleep, exec) does so and fails the batch
  // with TimeoutError(timeout); the slot pool fails any other batch that ran
  // past it. Must not throw for bad input; a thrown exception is turned into
  // a failed result by the caller.
  virtual HandlerOutput Run(std::string payload, Timeout timeout) = 0;

  // Run with the batch's id, queue and attempt, for handlers that pass
  // them on (the process handler); the others ignore them.
  virtual HandlerOutput RunBatch(const BatchInfo& /*batch*/, std::string payload,
                                 Timeout timeout) {
    return Run(std::move(payload), timeout);
  }

  // A handler whose slots need preparing (a process started and ready)
  // says how many are ready now; -1 (the default): every slot, always.
  // Thread-safe.
  virtual int ready_slots() const { return -1; }
  // A descriptor that becomes readable when ready_slots() may have changed
  // (an eventfd; the loop polls it and calls AckReady); -1: none.
  virtual int ready_fd() const { return -1; }
  virtual void AckReady() {}

  // Stops any external work (child processes) at once. Called only on the
  // "exit now" path; batches in progress then fail. Thread-safe.
  virtual void Abort() {}

  virtual std::string_view name() const = 0;

  // The largest payload this handler runs on the worker's loop thread, as
  // the batch arrives, instead of handing it to a slot thread and taking
  // the result back over a socket (a thread wake-up each way): for a
  // handler that never blocks and takes microseconds per kilobyte. 0: never
  // (the default); SIZE_MAX: always, and the worker starts no slot threads.
  virtual std::size_t inline_max_bytes() const { return 0; }
};

// "timed out after 0.5s": the one wording every handler uses.
std::string TimeoutError(Timeout timeout);

// Returns the payload unchanged.
class EchoHandler : public Handler {
 public:
  HandlerOutput Run(std::string payload, Timeout timeout) override;
  std::string_view name() const override { return "echo"; }
  // Hands the payload back without copying it: any size.
  std::size_t inline_max_bytes() const override { return SIZE_MAX; }
};

// Payload: a decimal number of milliseconds (surrounding whitespace allowed,
// at most kMaxMillis). Sleeps that long and returns "". A bad payload fails
// the batch; a sleep longer than the timeout is cut short and fails.
class SleepHandler : public Handler {
 public:
  static constexpr std::uint64_t kMaxMillis = 24ull * 3600 * 1000;
  HandlerOutput Run(std::string payload, Timeout timeout) override;
  std::string_view name() const override { return "sleep"; }
};

// Returns the lowercase hex SHA-256 digest of the payload (OpenSSL EVP).
class Sha256Handler : public Handler {
 public:
  HandlerOutput Run(std::string payload, Timeout timeout) override;
  std::string_view name() const override { return "sha256"; }
  // About 0.1 ms: a worker holding a full credit of them keeps its loop
  // (and its heartbeats) well within a heartbeat. Larger ones go to slots.
  std::size_t inline_max_bytes() const override { return 64u << 10; }
};

// Lowercase hex SHA-256 of `data`. Throws std::runtime_error only if OpenSSL
// itself fails.
std::string Sha256Hex(std::string_view data);

struct HandlerOptions {
  std::string name = "echo";  // echo, sleep, sha256, exec, process
  std::string exec;           // the shell command for exec and process
  // process: one handler process per slot; the worker's id (passed on in
  // FLEET_WORKER_ID); how long a handler has to exit after its stdin is
  // closed; the largest frame body taken from a handler.
  int slots = 1;
  std::string worker_id;
  Timeout grace{5};
  std::size_t max_frame_bytes = (64u << 20) + (64u << 10);
  // process: handlers may fetch objects (`get`; FLEET_HANDLER_FEATURES
  // says `objects`). fleet-worker sets it: its loop relays the requests.
  bool objects = false;
};

// Builds the handler `options.name`. Throws std::invalid_argument on an
// unknown name or exec without a command.
std::unique_ptr<Handler> MakeHandler(const HandlerOptions& options);

}  // namespace fleet::worker

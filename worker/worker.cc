#include "worker/worker.h"

#include <fmt/ranges.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "common/endpoint.h"
#include "common/signals.h"
#include "fleet/errors.h"

namespace fleet::worker {
namespace {

constexpr const char* kResultsEndpoint = "inproc://fleet-worker-results";
// Broker messages handled per loop iteration, so a flood cannot starve the
// slots' results or the timers.
constexpr int kMaxMessagesPerIteration = 1000;
// Longest poll even with no deadline: a safety net in case a stop signal is
// delivered to a thread we did not start (and so could not mask) and thus
// does not interrupt our poll.
constexpr Millis kMaxPoll{1000};
// After ERROR duplicate_worker, HELLO again this long after (the broker lets
// a restarted worker in once the old connection is closed or has been silent
// for two heartbeats).
constexpr Millis kDuplicateRetry{500};
// An error text longer than this is cut (the codec allows 64 KiB).
constexpr std::size_t kMaxErrorBytes = 8 << 10;
// Results packed into one DONE, like the broker's own messages: the broker
// refuses frames over its --max-message-bytes (by default the largest batch
// plus 68 KiB), so several results share a DONE only up to this, and a
// larger one (at most max_payload_bytes) travels alone.
constexpr std::size_t kMaxDoneBytes = 8u << 20;

// fleet::StopRequested() only says "at least one signal came". To tell the
// second one apart, the loop re-arms SIGINT/SIGTERM with this handler once
// it has seen the first; like the first, it only sets a flag. (A count in
// common/signals.h would make this unnecessary.)
//
// A SIGTERM sent by the process that started this worker never counts as
// the second: an autoscaler asks once and escalates with SIGKILL, and when
// an autoscaler dies the kernel delivers its parent-death SIGTERM
// (PR_SET_PDEATHSIG) once for every thread of the dying process that the
// worker is handed to on the way, several within milliseconds. Treating
// those as "stop now" would abandon the batches a drain should finish.
// Telling them apart by sender (si_pid) keeps a second Ctrl-C, or a second
// kill from anyone else, as the way to stop at once.
volatile std::sig_atomic_t g_second_stop = 0;
volatile std::sig_atomic_t g_parent_pid = 0;       // 0: no parent to trust (pid 1, containers)
volatile std::sig_atomic_t g_parent_repeats = 0;  // SIGTERMs from it after the first
extern "C" void OnSecondStop(int sig, siginfo_t* info, void* /*context*/) {
  if (sig == SIGTERM && g_parent_pid > 1 && info != nullptr && info->si_code == SI_USER &&
      info->si_pid == g_parent_pid) {
    g_parent_repeats = g_parent_repeats + 1;
    return;
  }
  g_second_stop = 1;
}

void ArmSecondStopSignal() {
  struct sigaction sa {};
  sa.sa_sigaction = OnSecondStop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;  // no SA_RESTART: let poll() return with EINTR
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

template <typename T>
bool Holds(const proto::Message& m) {
  return std::holds_alternative<T>(m);
}

}  // namespace

void ValidateOptions(const WorkerOptions& o) {
  const proto::Limits limits;
  CheckEndpoint("--broker", o.broker, EndpointUse::kConnect);
  if (o.id.empty() || o.id.size() > limits.max_id_bytes) {
    throw std::invalid_argument("--id must be 1.." +
                                std::to_string(limits.max_id_bytes) + " bytes");
  }
  if (o.concurrency < 1 || o.concurrency > 1024) {
    throw std::invalid_argument("--concurrency must be in 1..1024");
  }
  if (o.prefetch < 0 || o.prefetch > 4096) {
    throw std::invalid_argument("--prefetch must be in 0..4096");
  }
  if (!std::isfinite(o.batch_timeout.count()) || o.batch_timeout.count() < 0) {
    throw std::invalid_argument("--batch-timeout must be >= 0 seconds");
  }
  for (const auto& q : o.queues) {
    if (q.empty() || q.size() > limits.max_id_bytes) {
      throw std::invalid_argument("--queues: each queue name must be 1.." +
                                  std::to_string(limits.max_id_bytes) + " bytes");
    }
  }
  if (o.heartbeat < Millis(10) || o.heartbeat > Millis(3'600'000)) {
    throw std::invalid_argument("--heartbeat-ms must be in 10..3600000");
  }
  if (o.liveness < 1 || o.liveness > 100) {
    throw std::invalid_argument("liveness must be in 1..100");
  }
  if (o.backoff_initial <= Millis(0) || o.backoff_max < o.backoff_initial) {
    throw std::invalid_argument("backoff must be > 0 and max >= initial");
  }
}

Worker::Worker(WorkerOptions options) : Worker(std::move(options), nullptr) {}

Worker::Worker(WorkerOptions options, std::unique_ptr<Handler> handler)
    : options_(std::move(options)),
      rng_(std::random_device{}()),
      context_(1),
      results_(context_, zmq::socket_type::pull),
      heartbeat_(options_.heartbeat),
      liveness_(options_.liveness),
      backoff_(options_.backoff_initial),
      handshake_(options_.broker, options_.socket_limits.curve.enabled()),
      credit_(static_cast<std::uint32_t>(std::max(options_.concurrency, 1) +
                                         std::max(options_.prefetch, 0))) {
  ValidateOptions(options_);
  // One value per run of this process: the broker tells a reconnect of this
  // process (same value) from another process using the same id.
  incarnation_ = fmt::format("{:016x}", std::uniform_int_distribution<std::uint64_t>()(rng_));
  // Read now: once the parent dies, getppid() names whoever adopted us.
  if (const pid_t parent = getppid(); parent > 1) g_parent_pid = parent;
  options_.handler.slots = options_.concurrency;
  options_.handler.worker_id = options_.id;
  // A handler's answer may be up to the largest message plus room for its
  // id and error (docs/handler-protocol.md); a result over the payload
  // limit then fails its batch as the others do, for good.
  options_.handler.max_frame_bytes = (64u << 20) + (64u << 10);
  // Its handlers' object requests go out on our loop (SendObjectGets).
  options_.handler.objects = true;
  handler_ = handler ? std::move(handler) : MakeHandler(options_.handler);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) throw std::runtime_error("worker: eventfd failed");
  if (handler_->ready_slots() >= 0) {
    // Its slots count once their handler process is ready (UpdateCapacity).
    credit_.SetCapacity(0);
  }
  results_.set(zmq::sockopt::rcvhwm, 0);
  results_.set(zmq::sockopt::linger, 0);
  results_.bind(kResultsEndpoint);
  results_fd_ = static_cast<int>(results_.get(zmq::sockopt::fd));
  process_ = dynamic_cast<ProcessHandler*>(handler_.get());
  process_limits_.timeout = options_.batch_timeout;
  process_limits_.max_result_bytes = options_.limits.max_payload_bytes;
  process_limits_.max_error_bytes = kMaxErrorBytes;
  // A handler that runs every batch on this thread (HandleDispatch), or
  // whose processes this thread drives, needs no slots.
  if (handler_->inline_max_bytes() != SIZE_MAX && process_ == nullptr) {
    pool_ = std::make_unique<SlotPool>(context_, kResultsEndpoint, *handler_,
                                       options_.concurrency, options_.batch_timeout,
                                       options_.limits.max_payload_bytes, kMaxErrorBytes);
  }
  if (!options_.metrics.empty()) {
    metrics_ = std::make_unique<WorkerMetrics>(options_.metrics, options_.concurrency,
                                               options_.metrics_auth);
    spdlog::info("worker {}: metrics on {}", options_.id, metrics_->url());
  }
}

Worker::~Worker() {
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void Worker::AbortNow() { handler_->Abort(); }

void Worker::RequestStop() {
  stop_asked_.store(true);
  const std::uint64_t one = 1;
  while (::write(stop_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

int Worker::Run() {
  spdlog::info("worker {} starting: broker {}, handler {}, concurrency {}, prefetch {}, "
               "queues [{}]",
               options_.id, options_.broker, handler_->name(), options_.concurrency,
               options_.prefetch, fmt::join(options_.queues, ","));
  OpenSocket(clock_.Now());
  while (true) {
    TimePoint now = clock_.Now();
    CheckSignals();
    if (exit_code_) return *exit_code_;
    CheckTimers(now);
    Flush(now);
    if (exit_code_) return *exit_code_;

    // The results socket, the broker's (when connected) and its monitor,
    // the handler's readiness descriptor (process handler), then the pipes
    // of the batches its processes are running.
    //
    // The results socket and the monitor are polled by their descriptors
    // (ZMQ_FD), not as zmq sockets: zmq::poll asks a socket for ZMQ_EVENTS
    // before and after each wait, two system calls each for an idle one
    // (common/socket_waiter.h). A socket's descriptor wakes when commands
    // reach it, which is exact for input once a receive has found nothing
    // and nothing else is done with the socket: ReceiveCompletions empties
    // the results socket every turn, ReadHandshakes the monitor whenever it
    // wakes, and neither is sent on. A new monitor is read once before its
    // descriptor is trusted (input that came before any receive wakes
    // nothing). The broker's socket stays a zmq item: it is sent on, and
    // waits for POLLOUT.
    poll_items_.clear();
    poll_items_.push_back({nullptr, results_fd_, ZMQ_POLLIN, 0});
    if (broker_) {
      poll_items_.push_back({broker_->handle(), 0,
                             static_cast<short>(ZMQ_POLLIN | (want_out_ ? ZMQ_POLLOUT : 0)), 0});
      poll_items_.push_back({nullptr, monitor_fd_, ZMQ_POLLIN, 0});
    }
    if (!stop_from_signal_) poll_items_.push_back({nullptr, stop_fd_, ZMQ_POLLIN, 0});
    const int ready_fd = handler_->ready_fd();
    if (ready_fd >= 0) poll_items_.push_back({nullptr, ready_fd, ZMQ_POLLIN, 0});
    if (process_ != nullptr && process_->has_object_gets()) SendObjectGets(now);
    const std::size_t pipes_at = poll_items_.size();
    if (process_ != nullptr) process_->PollItems(&poll_items_);
    PollNoThrow(poll_items_.data(), static_cast<int>(poll_items_.size()),
                broker_ && monitor_unread_ ? Millis(0) : PollTimeout(now));

    now = clock_.Now();
    if (ready_fd >= 0 && (poll_items_[pipes_at - 1].revents & ZMQ_POLLIN) != 0) {
      UpdateCapacity();
    }
    if (process_ != nullptr) {
      process_->Service(poll_items_.data() + pipes_at, poll_items_.size() - pipes_at,
                        process_limits_, &finished_);
      for (Completion& c : finished_) TakeCompletion(std::move(c));
      finished_.clear();
    }
    ReceiveCompletions();
    ReceiveFromBroker(now);
    // Only when the monitor has something: its events are per connection
    // attempt, and this loop turns per batch.
    if (broker_ && (monitor_unread_ || (poll_items_[2].revents & ZMQ_POLLIN) != 0)) {
      ReadHandshakes();
    }
  }
}

void Worker::ReadHandshakes() {
  if (!monitor_) return;
  std::vector<zmq::message_t> frames;
  // Each event is [u16 event, u32 value][endpoint]; one or two per attempt.
  while (!handshake_.failed()) {
    if (!RecvMultipart(*monitor_, &frames)) {
      monitor_unread_ = false;  // emptied: its descriptor wakes for the next
      break;
    }
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    if (frames.empty() || frames[0].size() < sizeof event + sizeof value) continue;
    std::memcpy(&event, frames[0].data(), sizeof event);
    std::memcpy(&value, static_cast<const char*>(frames[0].data()) + sizeof event, sizeof value);
    handshake_.OnEvent(event, value, clock_.Now());
  }
  if (!handshake_.failed()) return;
  // Nothing reaches the broker on this socket or the next: a worker that
  // waited on would sit in silence. What it holds (if the broker changed
  // its keys under a registered worker) the broker requeues.
  spdlog::debug("worker {}: refused by the broker with {} batches held", options_.id,
                credit_.held());
  throw AuthenticationError(handshake_.error());
}

void Worker::TakeCompletion(Completion&& completion) {
  credit_.OnCompleted();
  if (metrics_) {
    metrics_->OnCompleted(completion.ok(), completion.seconds());
    metrics_->SetBusy(credit_.held());
  }
  unsent_.push_back(std::move(completion));
}

void Worker::UpdateCapacity() {
  handler_->AckReady();
  const int ready = handler_->ready_slots();
  if (ready < 0) return;
  // Prefetch rides on the ready slots only: no batch waits here for a
  // handler that is not up.
  const auto capacity = static_cast<std::uint32_t>(ready > 0 ? ready + options_.prefetch : 0);
  if (capacity == credit_.capacity()) return;
  if (ready > 0 && !ever_ready_) {
    ever_ready_ = true;
    spdlog::info("worker {}: a handler is ready; registering", options_.id);
  }
  spdlog::debug("worker {}: {} of {} handler processes ready", options_.id, ready,
                options_.concurrency);
  credit_.SetCapacity(capacity);
}

void Worker::OpenSocket(TimePoint now) {
  broker_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
  ApplySocketOptions(*broker_, options_.socket_limits, /*router=*/false);
  // Its handshakes, before it connects: a refused one is how the worker
  // learns that the broker will never let it in (HandshakeWatch).
  static std::atomic<unsigned> counter{0};
  const std::string monitor_endpoint = "inproc://fleet-worker-monitor-" + std::to_string(++counter);
  if (zmq_socket_monitor(broker_->handle(), monitor_endpoint.c_str(), HandshakeWatch::kEvents) !=
      0) {
    throw zmq::error_t();
  }
  monitor_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
  monitor_->set(zmq::sockopt::linger, 0);
  monitor_->connect(monitor_endpoint);
  monitor_fd_ = static_cast<int>(monitor_->get(zmq::sockopt::fd));
  monitor_unread_ = true;  // Run: read once before the descriptor is trusted
  // Queue nothing for a connection that is not up: HELLO must be the first
  // thing the broker sees from this socket, and we learn via POLLOUT when
  // it can be sent.
  broker_->set(zmq::sockopt::immediate, 1);
  broker_->connect(options_.broker);
  state_ = State::kConnecting;
  hello_at_ = now;
  want_out_ = true;
}

void Worker::Reconnect(TimePoint now, const std::string& why) {
  const Millis delay = NextBackoff();
  spdlog::warn("worker {}: {}; reconnecting to {} in {} ms ({} held, {} results kept)",
               options_.id, why, options_.broker, delay.count(), credit_.held(),
               unsent_.size());
  // Anything still queued on the old socket is dropped, not resent: a result
  // is sent at most once, and the broker requeues what it never got.
  broker_->set(zmq::sockopt::linger, 0);
  FailObjectGets("the worker's connection to the broker was replaced");
  ReadHandshakes();  // what the old socket saw still counts
  broker_.reset();
  monitor_.reset();
  state_ = State::kBackoff;
  reconnect_at_ = now + delay;
  want_out_ = false;
}

Millis Worker::NextBackoff() {
  const Millis base = backoff_;
  backoff_ = std::min(backoff_ * 2, options_.backoff_max);
  // +-20% jitter so a fleet that lost its broker does not return in lockstep.
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  return Millis(static_cast<Millis::rep>(static_cast<double>(base.count()) * jitter(rng_)));
}

bool Worker::MaySendResults() const {
  // After a STOP the broker knows us even when it refused our HELLO, so what
  // we finished still goes back to it before we leave.
  return state_ == State::kRegistered ||
         (stop_from_broker_ && state_ == State::kAwaitWelcome);
}

void Worker::ReceiveCompletions() {
  // Until a receive finds nothing, not merely until one is dropped: Run
  // trusts the socket's descriptor only then.
  while (true) {
    bool dropped = false;
    std::optional<Completion> completion = Completion::Receive(results_, &dropped);
    if (completion) {
      TakeCompletion(std::move(*completion));
    } else if (!dropped) {
      return;
    }
  }
}

void Worker::ReceiveFromBroker(TimePoint now) {
  std::vector<zmq::message_t> frames;
  for (int i = 0; i < kMaxMessagesPerIteration && broker_; ++i) {
    if (!RecvMultipart(*broker_, &frames)) break;
    last_heard_ = now;  // anything at all shows the broker is alive
    if (frames.size() != 1) {
      spdlog::warn("worker {}: ignoring a {}-frame message from the broker",
                   options_.id, frames.size());
      continue;
    }
    proto::Decoded decoded =
        proto::Decode(frames[0].data(), frames[0].size(), options_.limits);
    if (!decoded.ok()) {
      spdlog::warn("worker {}: bad message from the broker ({}): {}", options_.id,
                   proto::ErrorCodeName(decoded.error), decoded.detail);
      continue;
    }
    HandleMessage(*decoded.message, now);
  }
}

void Worker::HandleMessage(const proto::Message& message, TimePoint now) {
  if (const auto* m = std::get_if<proto::Welcome>(&message)) {
    heartbeat_ = std::clamp(Millis(m->heartbeat_ms), Millis(10), Millis(3'600'000));
    liveness_ = std::clamp<std::uint32_t>(m->liveness, 1, 100);
    if (state_ != State::kRegistered) {
      spdlog::info("worker {} registered with {} (heartbeat {} ms, liveness {})",
                   options_.id, options_.broker, heartbeat_.count(), liveness_);
    }
    state_ = State::kRegistered;
    backoff_ = options_.backoff_initial;
    duplicate_logged_ = false;
  } else if (const auto* m = std::get_if<proto::Dispatch>(&message)) {
    HandleDispatch(*m);
  } else if (const auto* m = std::get_if<proto::Stop>(&message)) {
    if (!stop_from_broker_) {
      spdlog::info("worker {}: stop from broker ({}); draining {} held batches",
                   options_.id, m->reason, credit_.held());
    }
    stop_from_broker_ = true;
  } else if (const auto* m = std::get_if<proto::Reset>(&message)) {
    if (state_ == State::kRegistered) {
      spdlog::info("worker {}: broker reset us ({}); registering again", options_.id,
                   m->reason);
      FailObjectGets("the broker reset the worker's registration");
      state_ = State::kConnecting;
      hello_at_ = now;
      want_out_ = true;
    } else {
      // A HELLO is sent or due: a restarted broker answers every DONE and
      // heartbeat it gets from an unknown connection with a RESET, and
      // those sent before our HELLO arrive before its WELCOME. One HELLO.
      spdlog::debug("worker {}: RESET while registering ({}); one HELLO is enough",
                    options_.id, m->reason);
    }
  } else if (const auto* m = std::get_if<proto::Error>(&message)) {
    if (m->code == proto::ErrorCode::kDuplicateWorker) {
      // Another live connection has our id. It may be our own previous run,
      // dead but not yet noticed: the broker lets us in once it is, so we
      // ask again at a steady pace (not the reconnect backoff, which grows
      // to seconds), logging the first refusal only.
      if (!duplicate_logged_) {
        spdlog::warn("worker {}: broker error {}: {}; asking again every {} ms",
                     options_.id, proto::ErrorCodeName(m->code), m->message,
                     kDuplicateRetry.count());
        duplicate_logged_ = true;
      }
      state_ = State::kConnecting;
      hello_at_ = now + kDuplicateRetry;
    } else if (m->code == proto::ErrorCode::kMalformed && state_ == State::kAwaitWelcome &&
               !legacy_hello_) {
      // A broker of the first protocol revision takes a HELLO of exactly 4
      // fields: send it that (no slots, no incarnation), once.
      spdlog::warn("worker {}: the broker refused our HELLO ({}); it may predate the "
                   "HELLO's slots and incarnation fields: registering without them",
                   options_.id, m->message);
      legacy_hello_ = true;
      state_ = State::kConnecting;
      hello_at_ = now;
      want_out_ = true;
    } else {
      spdlog::warn("worker {}: broker error {}: {}", options_.id,
                   proto::ErrorCodeName(m->code), m->message);
    }
  } else if (const auto* m = std::get_if<proto::ObjectData>(&message)) {
    const auto delivery =
        process_ != nullptr
            ? process_->DeliverObject(m->tag, m->status, m->total, m->offset, m->data, m->error)
            : ProcessHandler::Delivery::kUnknown;
    if (delivery == ProcessHandler::Delivery::kDelivered) {
      if (metrics_) metrics_->OnObjectBytes(m->data.size());
    } else if (delivery == ProcessHandler::Delivery::kUnknown) {
      spdlog::debug("worker {}: OBJECT_DATA for tag {}, which no handler waits for; dropped",
                    options_.id, m->tag);
      if (metrics_) metrics_->OnObjectDataDropped();
    }
  } else if (Holds<proto::Heartbeat>(message)) {
    // Liveness is already noted.
  } else {
    spdlog::warn("worker {}: unexpected command {} from the broker", options_.id,
                 static_cast<int>(proto::CommandOf(message)));
  }
}

void Worker::HandleDispatch(const proto::Dispatch& dispatch) {
  const auto n = static_cast<std::uint32_t>(dispatch.batches.size());
  for (const auto& b : dispatch.batches) {
    // The one copy of the payload: out of the frame, into the task.
    tasks_.push_back(
        Task{std::string(b.id), std::string(b.queue), b.attempt, std::string(b.payload)});
  }
  credit_.OnDispatch(n);
  const std::size_t inline_max = handler_->inline_max_bytes();
  if (inline_max > 0) {
    // Done before the next message is read: no slot thread, no socket hop.
    // The rest (too large to run here) keep their order for the slots.
    std::size_t kept = 0;
    for (Task& task : tasks_) {
      if (task.payload.size() > inline_max) {
        if (&tasks_[kept] != &task) tasks_[kept] = std::move(task);
        ++kept;
        continue;
      }
      unsent_.push_back(Completion::Run(*handler_, std::move(task), options_.batch_timeout,
                                        options_.limits.max_payload_bytes, kMaxErrorBytes));
      credit_.OnCompleted();
      if (metrics_) metrics_->OnCompleted(unsent_.back().ok(), unsent_.back().seconds());
    }
    tasks_.resize(kept);
  }
  if (!tasks_.empty()) {
    if (process_ != nullptr) {
      process_->Submit(tasks_, process_limits_, &finished_);
      for (Completion& c : finished_) TakeCompletion(std::move(c));
      finished_.clear();
    } else {
      pool_->Submit(tasks_);
    }
  }
  if (metrics_) metrics_->SetBusy(credit_.held());
  if (credit_.over_committed() && !warned_overcredit_) {
    warned_overcredit_ = true;
    spdlog::warn("worker {}: broker sent more batches than our credit ({} held, "
                 "{} slots + {} prefetch); queueing the extra ones locally (warned once)",
                 options_.id, credit_.held(), options_.concurrency, options_.prefetch);
  }
  if (Draining()) {
    spdlog::debug("worker {}: {} batches arrived while draining; running them",
                  options_.id, n);
  }
}

void Worker::CheckSignals() {
  const bool signalled = StopRequested();
  if (!signalled && !stop_asked_.load()) return;
  if (!stop_from_signal_ && !signalled) {
    stop_from_signal_ = true;
    spdlog::info("worker {}: stop requested; draining {} held batches, then exiting",
                 options_.id, credit_.held());
    return;
  }
  if (!signalled) return;  // stopped by RequestStop, no signal yet
  if (!signal_armed_) {
    // The first stop signal (maybe after a RequestStop): drain, and let a
    // second one mean "now".
    signal_armed_ = true;
    stop_from_signal_ = true;
    ArmSecondStopSignal();
    spdlog::info("worker {}: signal {}; draining {} held batches, then exiting "
                 "(signal again to exit now)",
                 options_.id, StopSignal(), credit_.held());
  } else if (g_parent_repeats != reported_parent_repeats_ && !g_second_stop) {
    reported_parent_repeats_ = g_parent_repeats;
    spdlog::info("worker {}: SIGTERM again from the process that started it (pid {}; "
                 "{} repeats so far): still draining {} held batches",
                 options_.id, static_cast<int>(g_parent_pid), reported_parent_repeats_,
                 credit_.held());
  } else if (g_second_stop && !exit_code_) {
    spdlog::warn("worker {}: second stop signal; exiting now, leaving {} batches "
                 "to the broker to requeue",
                 options_.id, credit_.held());
    handler_->Abort();
    abandoned_ = true;
    exit_code_ = 1;
  }
}

void Worker::CheckTimers(TimePoint now) {
  switch (state_) {
    case State::kBackoff:
      if (now >= reconnect_at_) OpenSocket(now);
      break;
    case State::kConnecting:
      break;  // Flush sends HELLO once it is due and the socket is writable
    case State::kAwaitWelcome:
    case State::kRegistered:
      if (now - last_heard_ >= liveness_ * heartbeat_) {
        Reconnect(now, fmt::format("nothing from the broker for {} ms",
                                   std::chrono::duration_cast<Millis>(now - last_heard_).count()));
      } else if (state_ == State::kRegistered && now - last_sent_ >= heartbeat_) {
        Send(proto::Heartbeat{}, now);  // if refused, the next tick retries
      }
      break;
  }
}

void Worker::Flush(TimePoint now) {
  want_out_ = false;
  if (Draining() && credit_.held() == 0 && unsent_.empty() && state_ != State::kRegistered) {
    // Not registered on a live connection, so the broker holds nothing of
    // ours there (e.g. STOP "blacklisted" answering our HELLO, or SIGTERM
    // while the broker is unreachable): nothing to wait for or say BYE to.
    spdlog::info("worker {}: stopped while not registered; exiting", options_.id);
    exit_code_ = 0;
    return;
  }
  if (!broker_) return;

  if (state_ == State::kConnecting) {
    if (now < hello_at_) return;
    // A worker whose handler processes are starting asks for work once the
    // first one is ready: their start-up is not a batch's wait. (After
    // that, a HELLO goes out whatever is ready, results may be waiting.)
    if (handler_->ready_slots() >= 0 && !ever_ready_ && !Draining()) return;
    proto::Hello hello;
    hello.worker_id = options_.id;
    // To the broker, concurrency is what it may have us hold at once.
    hello.concurrency = static_cast<std::uint32_t>(options_.concurrency + options_.prefetch);
    hello.credit = Draining() ? 0 : credit_.free();
    hello.queues.assign(options_.queues.begin(), options_.queues.end());
    if (!legacy_hello_) {
      hello.slots = static_cast<std::uint32_t>(options_.concurrency);
      hello.incarnation = incarnation_;
    }
    if (!Send(hello, now)) {
      want_out_ = true;  // not connected yet: POLLOUT tells us when
      return;
    }
    spdlog::debug("worker {}: HELLO sent (credit {})", options_.id, hello.credit);
    state_ = State::kAwaitWelcome;
    credit_.OnHello(Draining());
    drain_sent_ = false;
    last_heard_ = now;  // the broker has liveness * heartbeat to answer
  }

  if (state_ == State::kRegistered && stop_from_signal_ && !drain_sent_) {
    if (!Send(proto::Drain{}, now)) {
      want_out_ = true;
      return;
    }
    drain_sent_ = true;
  }

  if ((!unsent_.empty() && MaySendResults()) ||
      (state_ == State::kRegistered && credit_.GrantDue(Draining()))) {
    if (!SendDone(now)) {
      want_out_ = true;
      return;
    }
  }

  if (Draining() && credit_.held() == 0 && unsent_.empty() && state_ == State::kRegistered) {
    if (!Send(proto::Bye{}, now)) {
      want_out_ = true;
      return;
    }
    spdlog::info("worker {}: drained after {} batches; said BYE, exiting",
                 options_.id, batches_done_);
    exit_code_ = 0;
  } else if (Draining() && credit_.held() == 0 && unsent_.empty()) {
    // Results just went out in a DONE while unregistered (after STOP).
    spdlog::info("worker {}: stopped while not registered; exiting", options_.id);
    exit_code_ = 0;
  }
}

// One DONE per loop iteration carries everything finished since the last
// one; it is split at kMaxDoneBytes and the broker's item limit. The credit
// (see CreditLedger) rides on the first part.
bool Worker::SendDone(TimePoint now) {
  std::uint32_t credit = 0;
  bool granted = false;
  const std::size_t budget =
      std::min(options_.limits.max_message_bytes - 4096, kMaxDoneBytes);
  // No results but credit to grant (a handler became ready): one DONE
  // with an empty list.
  bool grant_only = unsent_.empty();
  while (!unsent_.empty() || grant_only) {
    grant_only = false;
    proto::Done done;
    if (!granted) credit = credit_.TakeGrant(Draining());
    done.credit = credit;
    std::size_t bytes = 64;
    for (const Completion& c : unsent_) {
      if (done.results.size() >= options_.limits.max_items) break;
      if (!done.results.empty() && bytes + c.size() > budget) break;
      bytes += c.size();
      done.results.push_back(proto::DoneItem{
          c.id(), c.attempt(),
          c.ok() ? proto::Outcome::kOk
                 : (c.retry() ? proto::Outcome::kRetry : proto::Outcome::kFailed),
          c.result(), c.error()});
    }
    if (!Send(done, now)) {
      // The grant was not sent after all: give it back to the next DONE.
      if (!granted) credit_.ReturnGrant(credit);
      return false;
    }
    granted = true;
    credit = 0;
    const std::size_t sent = done.results.size();
    batches_done_ += sent;
    unsent_.erase(unsent_.begin(), unsent_.begin() + static_cast<std::ptrdiff_t>(sent));
  }
  return true;
}

bool Worker::Send(const proto::Message& message, TimePoint now) {
  proto::EncodeTo(message, &out_);
  if (!SendFrame(*broker_, out_, /*block=*/false)) return false;
  last_sent_ = now;
  return true;
}

void Worker::SendObjectGets(TimePoint now) {
  process_->TakeObjectGets(&object_gets_);
  // Each answer must fit a message we take from the broker.
  const std::uint64_t chunk = std::min<std::uint64_t>(
      options_.limits.max_message_bytes - 4096, std::numeric_limits<std::uint32_t>::max());
  for (const ProcessHandler::ObjectGetOut& g : object_gets_) {
    if (state_ != State::kRegistered || !broker_) {
      process_->DeliverObject(g.tag, static_cast<std::uint32_t>(proto::ObjectStatus::kUnavailable),
                              0, g.offset, {},
                              "fleet-worker is not registered with a broker now");
      continue;
    }
    proto::ObjectGet get;
    get.tag = g.tag;
    get.batch_id = g.batch_id;
    get.digest = g.digest;
    get.offset = g.offset;
    get.length = static_cast<std::uint32_t>(std::min(g.length, chunk));
    if (!Send(get, now)) {
      process_->DeliverObject(g.tag, static_cast<std::uint32_t>(proto::ObjectStatus::kBusy), 0,
                              g.offset, {}, "the connection to the broker is full");
    }
  }
  object_gets_.clear();
}

void Worker::FailObjectGets(const char* why) {
  if (process_ == nullptr || process_->object_gets_out() == 0) return;
  spdlog::info("worker {}: {}; {} object requests answered unavailable", options_.id, why,
               process_->object_gets_out());
  process_->FailObjectGets(static_cast<std::uint32_t>(proto::ObjectStatus::kUnavailable), why);
}

Millis Worker::PollTimeout(TimePoint now) const {
  TimePoint next = now + kMaxPoll;
  switch (state_) {
    case State::kBackoff:
      next = std::min(next, reconnect_at_);
      break;
    case State::kConnecting:
      if (hello_at_ > now) next = std::min(next, hello_at_);
      break;
    case State::kRegistered:
      next = std::min(next, last_sent_ + heartbeat_);
      [[fallthrough]];
    case State::kAwaitWelcome:
      next = std::min(next, last_heard_ + liveness_ * heartbeat_);
      break;
  }
  if (process_ != nullptr) {
    // A batch timeout is on the real clock: the handler's processes run on it.
    if (const auto deadline = process_->NextDeadline()) {
      next = std::min(next, now + (*deadline - std::chrono::steady_clock::now()));
    }
  }
  // Rounded up, so we never wake a hair early and spin with a 0 ms poll.
  const auto wait = std::chrono::ceil<Millis>(next - now);
  return std::max(wait, Millis(0));
}

}  // namespace fleet::worker

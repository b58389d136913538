// fleet::Client (include/fleet/client.h): a Producer driven by one I/O
// thread of the client's own. Submitting threads hand batches over through
// a locked inbox and an eventfd that wakes the thread's poll; results go
// back through each batch's promise or callback.
#include "fleet/client.h"
#include "fleet/errors.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

#include "client/producer.h"
#include "common/clock.h"
#include "common/curve.h"
#include "common/endpoint.h"

namespace fleet {
namespace {

// Who waits for a batch's result: a promise, or a callback.
struct Waiter {
  std::optional<std::promise<Result>> promise;  // none for a callback
  std::function<void(const Result&)> callback;
};

struct Handed {
  std::string id;
  std::string payload;
  Waiter waiter;
};

void Deliver(Waiter& w, Result r) {
  if (w.callback) {
    try {
      w.callback(r);
    } catch (const std::exception& e) {
      spdlog::error("fleet::Client: the result callback of {} threw: {}", r.id, e.what());
    } catch (...) {
      spdlog::error("fleet::Client: the result callback of {} threw", r.id);
    }
  } else {
    w.promise->set_value(std::move(r));
  }
}

Result Failed(std::string id, std::string error) {
  Result r;
  r.id = std::move(id);
  r.ok = false;
  r.error = std::move(error);
  return r;
}

}  // namespace

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {
    if (options_.max_in_flight < 1 || options_.max_in_flight > 1'000'000) {
      throw std::invalid_argument("fleet::Client: max_in_flight must be in 1..1000000");
    }
    CheckEndpoint("fleet::ClientOptions::endpoint", options_.endpoint, EndpointUse::kConnect);
    client::Producer::Options po;
    po.endpoint = options_.endpoint;
    po.max_in_flight = options_.max_in_flight;
    po.resend_after = options_.resend_after;
    try {
      po.socket.curve = LoadCurveClient(options_.curve_server_key, options_.curve_key);
    } catch (const std::exception& e) {
      throw std::invalid_argument(e.what());
    }
    try {
      producer_ = std::make_unique<client::Producer>(
          context_, po, [this](const client::ResultView& r) { OnResult(r); }, clock_);
    } catch (const zmq::error_t& e) {
      throw std::invalid_argument("cannot connect to " + options_.endpoint + ": " + e.what());
    }
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw std::runtime_error("fleet::Client: eventfd failed");
    producer_->set_wake_fd(wake_fd_);
    if (options_.on_reconnect) producer_->set_on_reconnect(options_.on_reconnect);
    std::random_device rd;
    char prefix[32];
    std::snprintf(prefix, sizeof prefix, "c%d-%08x-", static_cast<int>(::getpid()),
                  static_cast<unsigned>(rd()));
    prefix_ = prefix;
    io_ = std::thread([this] { Loop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    Wake();
    io_.join();
    // What never got a result: told so, not left hanging (on this thread;
    // a callback that submits now is refused at once, see Hand).
    std::unordered_map<std::string, Waiter> waiting;
    waiting.swap(waiters_);
    for (auto& [id, w] : waiting) {
      Refuse(w, id, "fleet::Client closed before the result of " + id + " came");
    }
    std::deque<Handed> unsent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      unsent.swap(inbox_);
    }
    for (Handed& h : unsent) {
      Refuse(h.waiter, h.id, "fleet::Client closed before " + h.id + " was sent");
    }
    producer_.reset();
    ::close(wake_fd_);
  }

  // `auth`: the broker refused us (AuthenticationError for a future).
  static void Refuse(Waiter& w, const std::string& id, const std::string& why,
                     bool auth = false) {
    if (w.callback) {
      Deliver(w, Failed(id, why));
    } else if (auth) {
      w.promise->set_exception(std::make_exception_ptr(AuthenticationError(why)));
    } else {
      w.promise->set_exception(std::make_exception_ptr(std::runtime_error(why)));
    }
  }

  std::string NextId() { return prefix_ + std::to_string(++next_id_); }

  void Hand(std::string id, std::string payload, Waiter waiter) {
    bool was_empty;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) {
        // A callback submitting while the client is being destroyed.
        lock.unlock();
        Refuse(waiter, id, "fleet::Client closed before " + id + " was sent");
        return;
      }
      if (!failure_.empty()) {
        const std::string why = failure_;
        lock.unlock();
        Refuse(waiter, id, why, /*auth=*/true);
        return;
      }
      was_empty = inbox_.empty();
      inbox_.push_back(Handed{std::move(id), std::move(payload), std::move(waiter)});
      ++outstanding_;
    }
    // The thread takes the whole inbox when it wakes: one write per burst.
    if (was_empty) Wake();
  }

  std::size_t outstanding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return outstanding_;
  }

  ClientCounters counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  bool WaitAll(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return done_cv_.wait_for(lock, timeout, [&] { return outstanding_ == 0; });
  }

 private:
  void Wake() {
    const std::uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

  void Loop() {
    std::deque<Handed> taken;
    while (true) {
      // Reset the wake-up before taking the inbox: a batch handed over in
      // between wakes the next poll instead of waiting for the safety net.
      std::uint64_t n;
      while (::read(wake_fd_, &n, sizeof(n)) < 0 && errno == EINTR) {
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        taken.swap(inbox_);
      }
      for (Handed& h : taken) {
        if (waiters_.count(h.id) != 0 ||
            !producer_->Submit(h.id, options_.queue, h.payload)) {
          Finish(h.waiter, Failed(h.id, "batch id " + h.id +
                                            " is already waiting for its result in this client"));
          continue;
        }
        waiters_.emplace(std::move(h.id), std::move(h.waiter));
      }
      taken.clear();
      // Woken by a result, the wake descriptor, a retry or resend coming
      // due; the second is only a safety net.
      producer_->Poll(std::chrono::milliseconds(1000));
      if (producer_->handshake().failed()) {
        FailAll(producer_->handshake().error());
        return;
      }
      const auto& c = producer_->counters();
      std::lock_guard<std::mutex> lock(mu_);
      counters_.submit_messages = c.submit_messages;
      counters_.accepted = c.accepted;
      counters_.queue_full_retries = c.queue_full_retries;
      counters_.disk_full_retries = c.disk_full_retries;
      counters_.rejected = c.rejected;
      counters_.results = c.results;
      counters_.duplicates_dropped = c.duplicates_dropped;
      counters_.fetches = c.fetches;
      counters_.resends = c.resends;
      counters_.reconnects = c.reconnects;
      counters_.reconnect_resends = c.reconnect_resends;
      counters_.errors = c.errors;
    }
  }

  // The broker refused our handshake for good: nothing submitted can reach
  // it. Told first, then every batch without a result fails with `why`, and
  // so does every later submit; the I/O thread ends.
  void FailAll(const std::string& why) {
    if (options_.on_failure) {
      options_.on_failure(why);
    } else {
      spdlog::error("fleet::Client: {}", why);
    }
    std::deque<Handed> unsent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = why;
      unsent.swap(inbox_);
    }
    std::unordered_map<std::string, Waiter> waiting;
    waiting.swap(waiters_);
    for (auto& [id, w] : waiting) FinishRefused(w, id, why);
    for (Handed& h : unsent) FinishRefused(h.waiter, h.id, why);
  }

  void FinishRefused(Waiter& w, const std::string& id, const std::string& why) {
    Refuse(w, id, why, /*auth=*/true);
    std::lock_guard<std::mutex> lock(mu_);
    if (--outstanding_ == 0) done_cv_.notify_all();
  }

  void OnResult(const client::ResultView& view) {
    auto it = waiters_.find(std::string(view.id));
    if (it == waiters_.end()) return;  // the producer delivers each id once
    Result r;
    r.id = std::string(view.id);
    r.ok = view.outcome == proto::Outcome::kOk;
    r.attempts = view.attempts;
    r.result = std::string(view.result);
    r.error = std::string(view.error);
    Waiter w = std::move(it->second);
    waiters_.erase(it);
    Finish(w, std::move(r));
  }

  void Finish(Waiter& w, Result r) {
    Deliver(w, std::move(r));
    std::lock_guard<std::mutex> lock(mu_);
    if (--outstanding_ == 0) done_cv_.notify_all();
  }

  const ClientOptions options_;
  zmq::context_t context_{1};
  SteadyClock clock_;
  std::unique_ptr<client::Producer> producer_;  // the I/O thread's, once started
  int wake_fd_ = -1;
  std::string prefix_;
  std::atomic<std::uint64_t> next_id_{0};

  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<Handed> inbox_;     // guarded by mu_
  std::size_t outstanding_ = 0;  // guarded by mu_
  bool stopping_ = false;        // guarded by mu_
  std::string failure_;          // guarded by mu_; set once: the broker refused us
  ClientCounters counters_;      // guarded by mu_
  std::unordered_map<std::string, Waiter> waiters_;  // the I/O thread's
  std::thread io_;
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Client::~Client() = default;

std::future<Result> Client::Submit(std::string payload) {
  return SubmitWithId(impl_->NextId(), std::move(payload));
}

void Client::Submit(std::string payload, std::function<void(const Result&)> on_result) {
  SubmitWithId(impl_->NextId(), std::move(payload), std::move(on_result));
}

std::future<Result> Client::SubmitWithId(std::string id, std::string payload) {
  Waiter w;
  std::future<Result> f = w.promise.emplace().get_future();
  impl_->Hand(std::move(id), std::move(payload), std::move(w));
  return f;
}

void Client::SubmitWithId(std::string id, std::string payload,
                          std::function<void(const Result&)> on_result) {
  if (!on_result) throw std::invalid_argument("fleet::Client::Submit: empty callback");
  Waiter w;
  w.callback = std::move(on_result);
  impl_->Hand(std::move(id), std::move(payload), std::move(w));
}

std::size_t Client::outstanding() const { return impl_->outstanding(); }

ClientCounters Client::counters() const { return impl_->counters(); }

std::string Client::error() const { return impl_->error(); }

bool Client::WaitAll(std::chrono::milliseconds timeout) { return impl_->WaitAll(timeout); }

}  // namespace fleet

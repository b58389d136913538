// fleet::Worker (include/fleet/worker.h): the worker of worker.h with the
// user's function as its handler, run on the slot threads.
#include "fleet/worker.h"

#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "common/curve.h"
#include "common/metrics_server.h"
#include "common/signals.h"
#include "worker/handler.h"
#include "worker/worker.h"

namespace fleet {
namespace {

class FunctionHandler : public worker::Handler {
 public:
  explicit FunctionHandler(Function function) : function_(std::move(function)) {}

  worker::HandlerOutput Run(std::string payload, worker::Timeout timeout) override {
    return RunBatch(worker::BatchInfo{}, std::move(payload), timeout);
  }

  // An exception is the slot's to turn into a failed batch.
  worker::HandlerOutput RunBatch(const worker::BatchInfo& info, std::string payload,
                                 worker::Timeout /*timeout*/) override {
    Reply reply = function_(Batch{info.id, payload, info.queue, info.attempt});
    return reply.ok ? worker::HandlerOutput::Ok(std::move(reply.data))
                    : worker::HandlerOutput::Failed(std::move(reply.data));
  }

  std::string_view name() const override { return "function"; }

 private:
  Function function_;
};

std::string DefaultId() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "worker");
  }
  return std::string(host) + "-" + std::to_string(::getpid());
}

}  // namespace

class Worker::Impl {
 public:
  Impl(WorkerOptions options, Function function) : handle_signals_(options.handle_signals) {
    worker::WorkerOptions o;
    o.broker = options.broker;
    o.id = options.id.empty() ? DefaultId() : options.id;
    o.concurrency = options.concurrency;
    o.prefetch = options.prefetch;
    o.queues = options.queues;
    o.batch_timeout = options.batch_timeout;
    o.heartbeat = options.heartbeat;
    o.metrics = options.metrics;
    std::unique_ptr<worker::Handler> handler;
    if (function) {
      handler = std::make_unique<FunctionHandler>(std::move(function));
      o.handler.name = "function";
    } else {
      o.handler.name = options.handler.empty() ? "echo" : options.handler;
      o.handler.exec = options.exec;
      o.handler.grace = options.handler_grace;
      if ((o.handler.name == "exec" || o.handler.name == "process") && o.handler.exec.empty()) {
        throw std::invalid_argument("handler " + o.handler.name + " needs exec (the command)");
      }
    }
    try {
      o.socket_limits.curve = LoadCurveClient(options.curve_server_key, options.curve_key);
      o.metrics_auth = LoadMetricsFlags(options.metrics, options.metrics_auth_file);
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const std::exception& e) {
      throw std::invalid_argument(e.what());
    }
    worker::ValidateOptions(o);  // before touching the process's signals
    // A write to a handler process that just died must fail with EPIPE,
    // not end the worker.
    struct sigaction old_pipe {};
    if (::sigaction(SIGPIPE, nullptr, &old_pipe) == 0 && old_pipe.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
    // Before any handler process starts, so a signal from now on drains.
    if (handle_signals_) InstallStopSignals();
    worker_ = std::make_unique<worker::Worker>(std::move(o), std::move(handler));
  }

  int Run() {
    int code = 1;
    try {
      code = worker_->Run();
    } catch (...) {
      // Its handler's processes (exec, process) go at once; the slots then
      // finish quickly for the destructor.
      worker_->AbortNow();
      throw;
    }
    if (worker_->abandoned()) {
      // A second stop signal: exit now, as fleet-worker does. The slots may
      // be busy in the user's function, which nothing can interrupt.
      spdlog::default_logger()->flush();
      std::_Exit(code);
    }
    return code;
  }

  void Stop() { worker_->RequestStop(); }

 private:
  bool handle_signals_;
  std::unique_ptr<worker::Worker> worker_;
};

Worker::Worker(WorkerOptions options, Function function) {
  if (!function) throw std::invalid_argument("fleet::Worker: no function");
  impl_ = std::make_unique<Impl>(std::move(options), std::move(function));
}

Worker::Worker(WorkerOptions options) : impl_(std::make_unique<Impl>(std::move(options), nullptr)) {}

Worker::~Worker() = default;

int Worker::Run() { return impl_->Run(); }

void Worker::Stop() { impl_->Stop(); }

}  // namespace fleet

#include "common/signals.h"

#include <atomic>

namespace fleet {
namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
// Lock-free, so safe to store from a handler (checked below).
std::atomic<bool> g_reload{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void OnStopSignal(int sig) { g_stop_signal = sig; }
extern "C" void OnReloadSignal(int) { g_reload.store(true, std::memory_order_relaxed); }
}  // namespace

void InstallReloadSignal() {
  struct sigaction sa {};
  sa.sa_handler = OnReloadSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGHUP, &sa, nullptr);
}

bool TakeReloadRequest() {
  // A load first: the loop asks every turn, and a store per turn would
  // make the cache line bounce for nothing.
  return g_reload.load(std::memory_order_relaxed) &&
         g_reload.exchange(false, std::memory_order_relaxed);
}

void InstallStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: let poll() return with EINTR
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

bool StopRequested() { return g_stop_signal != 0; }

int StopSignal() { return g_stop_signal; }

}  // namespace fleet

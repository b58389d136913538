// SIGINT/SIGTERM handling: the handler only sets a flag that loops poll.
// Blocking calls (zmq::poll) return early with EINTR when a signal lands.
#pragma once

#include <csignal>

namespace fleet {

// Installs handlers for SIGINT and SIGTERM (and ignores SIGPIPE).
void InstallStopSignals();

// True once SIGINT or SIGTERM arrived.
bool StopRequested();

// Which signal asked us to stop (0 if none).
int StopSignal();

// Installs a handler for SIGHUP that only records the request (no
// SA_RESTART: a blocking poll returns with EINTR when the signal lands on
// its thread; on another thread, the loop sees it at its next wake-up).
void InstallReloadSignal();

// True once per SIGHUP received since the last call (several in a row
// count as one); clears the request.
bool TakeReloadRequest();

}  // namespace fleet

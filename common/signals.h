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

}  // namespace fleet

// Command-line flags shared by every program, on CLI11. Every long flag can
// also come from an environment variable FLEET_<FLAG_IN_CAPS> (--max-queue
// and FLEET_MAX_QUEUE); the flag wins when both are set.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace fleet {

// Gives every option of `app` (and its subcommands) that has a long name and
// no environment variable yet the name FLEET_<LONG_NAME_IN_CAPS>. Call after
// adding options, before parsing.
void AddEnvNames(CLI::App& app);

// Exit code of every program for a bad command line (unknown flag, bad
// value, missing argument) and for settings refused before it starts.
inline constexpr int kUsageError = 2;

// Exit code of every client program (fleet-submit, fleet-ctl, fleet-worker,
// fleet-autoscaler) when the broker refused its handshake for good
// ("authentication failed": common/handshake_watch.h).
inline constexpr int kAuthFailed = 3;

// Parses argv; on --help or a bad flag prints the message and returns the
// exit code to use (0 for --help, kUsageError for a bad flag). Returns -1
// when the program should run.
int ParseFlags(CLI::App& app, int argc, char** argv);

}  // namespace fleet

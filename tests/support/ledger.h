// The one checker of every fault test: reads the ledgers fleet-submit wrote
// (--ledger: each batch submitted, each result handed to the application)
// and, when the handler logged them, the executions (one batch id per line,
// appended by the handler each time it starts a batch), and says what went
// wrong:
//   lost        submitted, and no result at all (not even a dead letter)
//   duplicated  more than one result handed over for one id
//   unexpected  a result for an id nobody submitted, an ok result whose
//               value is not the deterministic one (echo: the payload), or
//               an execution of an unknown id
//   executions  runs per batch; more than max_attempts is a failure
// Pass = 0 lost, 0 duplicated, 0 unexpected, executions <= max_attempts.
//
// Thread-safe: pure functions of the files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fleet::testing {

struct LedgerOptions {
  // Results of ok batches must equal their payload (echo handlers).
  bool echo = true;
  // Executions per batch allowed (the broker's --max-attempts).
  std::uint32_t max_attempts = 3;
  // Failed results (dead letters) allowed; tests of healthy handlers say 0.
  bool allow_failed = false;
};

struct LedgerReport {
  std::size_t submitted = 0;
  std::size_t results = 0;  // results handed over, duplicates included
  std::size_t ok = 0, failed = 0;
  std::size_t lost = 0, duplicated = 0, unexpected = 0;
  std::size_t over_executed = 0;  // batches run more than max_attempts times
  std::size_t executions = 0;     // total runs logged (0 without a log)
  std::size_t reexecuted = 0;     // batches run more than once
  std::uint32_t max_executions = 0;
  std::map<std::uint32_t, std::size_t> by_executions;  // runs -> batches
  std::vector<std::string> problems;  // the first few, for the failure text
  bool passed = false;

  // A few lines: the counts, the executions histogram and the problems.
  std::string Describe() const;
};

// `ledgers`: files written by fleet-submit --ledger; `execution_logs`: files
// of ids appended by the handler ("" entries are skipped). A missing or
// malformed file is a problem in the report (and a failure), not a throw.
LedgerReport CheckLedger(const std::vector<std::string>& ledgers,
                         const std::vector<std::string>& execution_logs,
                         const LedgerOptions& options = {});

// An exec handler command (for fleet-worker --handler exec --exec CMD) that
// appends the batch's id (the payload's first word, as fleet-submit
// generates payloads) to `execution_log`, sleeps `sleep_ms` and echoes the
// payload.
std::string LoggingEchoCommand(const std::string& execution_log, int sleep_ms);

}  // namespace fleet::testing

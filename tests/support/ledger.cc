#include "tests/support/ledger.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace fleet::testing {
namespace {

constexpr std::size_t kMaxProblems = 10;

struct Batch {
  std::string payload_hash;
  std::uint32_t results = 0;
  std::uint32_t executions = 0;
  bool failed = false;
};

void Problem(LedgerReport* r, std::string text) {
  if (r->problems.size() < kMaxProblems) r->problems.push_back(std::move(text));
}

}  // namespace

LedgerReport CheckLedger(const std::vector<std::string>& ledgers,
                         const std::vector<std::string>& execution_logs,
                         const LedgerOptions& options) {
  LedgerReport r;
  std::unordered_map<std::string, Batch> batches;
  // Submissions first (a result may sit in an earlier file than its submit
  // when several producers share nothing, so read in two passes).
  std::vector<std::vector<std::string>> results;
  bool files_ok = true;
  for (const auto& path : ledgers) {
    std::ifstream in(path);
    if (!in) {
      Problem(&r, "cannot read ledger " + path);
      files_ok = false;
      continue;
    }
    std::string line;
    std::size_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      std::istringstream words(line);
      std::string kind, id;
      words >> kind >> id;
      if (kind == "submit") {
        std::string hash;
        words >> hash;
        if (hash.empty()) {
          Problem(&r, path + ":" + std::to_string(n) + ": malformed: " + line);
          files_ok = false;
          continue;
        }
        auto [it, fresh] = batches.try_emplace(id);
        if (!fresh) {
          Problem(&r, "id submitted twice: " + id);
          files_ok = false;
        }
        it->second.payload_hash = hash;
        ++r.submitted;
      } else if (kind == "result") {
        std::string outcome, attempts, hash;
        words >> outcome >> attempts >> hash;
        if (hash.empty() || (outcome != "ok" && outcome != "failed")) {
          Problem(&r, path + ":" + std::to_string(n) + ": malformed: " + line);
          files_ok = false;
          continue;
        }
        results.push_back({id, outcome, hash});
      } else if (!line.empty()) {
        Problem(&r, path + ":" + std::to_string(n) + ": malformed: " + line);
        files_ok = false;
      }
    }
  }
  for (const auto& res : results) {
    const std::string& id = res[0];
    ++r.results;
    auto it = batches.find(id);
    if (it == batches.end()) {
      ++r.unexpected;
      Problem(&r, "result for an id nobody submitted: " + id);
      continue;
    }
    Batch& b = it->second;
    if (++b.results == 2) {
      ++r.duplicated;
      Problem(&r, "result delivered more than once: " + id);
    }
    if (b.results > 1) continue;
    if (res[1] == "ok") {
      ++r.ok;
      if (options.echo && res[2] != b.payload_hash) {
        ++r.unexpected;
        Problem(&r, "ok result is not the payload of " + id);
      }
    } else {
      ++r.failed;
      b.failed = true;
      if (!options.allow_failed) {
        ++r.unexpected;
        Problem(&r, "failed result (dead letter) for " + id);
      }
    }
  }
  for (const auto& path : execution_logs) {
    if (path.empty()) continue;
    std::ifstream in(path);
    if (!in) {
      // No batch ran at all: the log is created by the first execution.
      if (r.submitted > 0) {
        Problem(&r, "cannot read execution log " + path);
        files_ok = false;
      }
      continue;
    }
    std::string id;
    while (std::getline(in, id)) {
      if (id.empty()) continue;
      ++r.executions;
      auto it = batches.find(id);
      if (it == batches.end()) {
        ++r.unexpected;
        Problem(&r, "execution of an id nobody submitted: " + id);
        continue;
      }
      ++it->second.executions;
    }
  }
  const bool counted = r.executions > 0;
  for (const auto& [id, b] : batches) {
    if (b.results == 0) {
      ++r.lost;
      Problem(&r, "lost (no result): " + id);
    }
    if (!counted) continue;
    ++r.by_executions[b.executions];
    if (b.executions > r.max_executions) r.max_executions = b.executions;
    if (b.executions > 1) ++r.reexecuted;
    if (b.executions > options.max_attempts) {
      ++r.over_executed;
      Problem(&r, "ran " + std::to_string(b.executions) + " times (max attempts " +
                      std::to_string(options.max_attempts) + "): " + id);
    }
    if (b.executions == 0 && b.results > 0 && !b.failed) {
      ++r.unexpected;
      Problem(&r, "ok result but never executed: " + id);
    }
  }
  r.passed = files_ok && r.submitted > 0 && r.lost == 0 && r.duplicated == 0 &&
             r.unexpected == 0 && r.over_executed == 0;
  if (r.submitted == 0) Problem(&r, "nothing was submitted");
  return r;
}

std::string LedgerReport::Describe() const {
  std::ostringstream out;
  out << "ledger: submitted=" << submitted << " results=" << results << " ok=" << ok
      << " failed=" << failed << " lost=" << lost << " duplicated=" << duplicated
      << " unexpected=" << unexpected << " executions=" << executions
      << " reexecuted=" << reexecuted << " max_executions=" << max_executions
      << " over_executed=" << over_executed << " -> " << (passed ? "PASS" : "FAIL");
  if (!by_executions.empty()) {
    out << "\nexecutions per batch:";
    for (const auto& [runs, count] : by_executions) out << " " << runs << "x=" << count;
  }
  for (const auto& p : problems) out << "\n  " << p;
  return out.str();
}

std::string LoggingEchoCommand(const std::string& execution_log, int sleep_ms) {
  // The id is the payload's first word; one short append (O_APPEND) per run
  // is atomic, so concurrent slots and workers can share the log.
  std::string cmd = "p=$(cat); printf '%s\\n' \"${p%% *}\" >> '" + execution_log + "'; ";
  if (sleep_ms > 0) {
    char s[32];
    std::snprintf(s, sizeof s, "sleep %d.%03d; ", sleep_ms / 1000, sleep_ms % 1000);
    cmd += s;
  }
  cmd += "printf '%s' \"$p\"";
  return cmd;
}

}  // namespace fleet::testing

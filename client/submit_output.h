// What fleet-submit prints: generated payloads, one JSON line per result and
// the summary line. Kept out of submit_main.cc so tests can pin the formats.
//
// Thread-safe: free functions without shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "client/producer.h"

namespace fleet::client {

// A printable payload of exactly `size` bytes that depends only on `id`: the
// id, a space, then a repeating a..z pattern (truncated when `size` is
// shorter than the id).
std::string GeneratePayload(std::string_view id, std::size_t size);

// {"id","outcome","attempts","result","error"} on one line, no newline. The
// result goes in "result" when it is valid UTF-8, else base64-encoded in
// "result_base64". Invalid UTF-8 in id or error is replaced (U+FFFD).
std::string ResultJsonLine(const ResultView& result);

// The fault-test ledger (fleet-submit --ledger): one line per batch handed
// to the producer and one per result handed to the application, so a
// checker can tell lost, duplicated and unexpected results apart.
//   submit ID HASH LEN
//   result ID ok|failed ATTEMPTS HASH
// HASH is the 16-hex-digit FNV-1a 64 of the payload / result. Ids never
// contain spaces (fleet-submit makes them).
std::uint64_t Fnv1a64(std::string_view bytes);
std::string LedgerSubmitLine(std::string_view id, std::string_view payload);
std::string LedgerResultLine(const ResultView& result);

struct SubmitSummary {
  std::uint64_t submitted = 0;  // batches handed to Producer::Submit
  std::uint64_t ok = 0;
  std::uint64_t failed = 0;     // includes final rejections
  double seconds = 0;
  std::uint64_t lost() const {
    return submitted > ok + failed ? submitted - ok - failed : 0;
  }
};

// `submitted=N ok=N failed=N lost=N seconds=S batches_per_s=R` (S with 3
// decimals; R = results per second with 1 decimal), no newline.
std::string SummaryLine(const SubmitSummary& summary);

}  // namespace fleet::client

#include "client/submit_output.h"

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <cstdio>

namespace fleet::client {
namespace {

bool ValidUtf8(std::string_view s) {
  // nlohmann's strict serializer is the UTF-8 validator we already ship.
  try {
    (void)nlohmann::json(std::string(s)).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

}  // namespace

std::string GeneratePayload(std::string_view id, std::size_t size) {
  std::string payload;
  payload.reserve(size);
  payload.append(id.substr(0, size));
  if (payload.size() < size) payload.push_back(' ');
  for (std::size_t i = 0; payload.size() < size; ++i) {
    payload.push_back(static_cast<char>('a' + i % 26));
  }
  return payload;
}

std::string ResultJsonLine(const ResultView& r) {
  nlohmann::ordered_json j;
  j["id"] = std::string(r.id);
  j["outcome"] = proto::OutcomeName(r.outcome);
  j["attempts"] = r.attempts;
  if (ValidUtf8(r.result)) {
    j["result"] = std::string(r.result);
  } else {
    j["result_base64"] = Base64(r.result);
  }
  j["error"] = std::string(r.error);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::uint64_t Fnv1a64(std::string_view bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string LedgerSubmitLine(std::string_view id, std::string_view payload) {
  char tail[48];
  std::snprintf(tail, sizeof tail, " %016llx %zu",
                static_cast<unsigned long long>(Fnv1a64(payload)), payload.size());
  std::string line = "submit ";
  line.append(id).append(tail);
  return line;
}

std::string LedgerResultLine(const ResultView& r) {
  char tail[64];
  std::snprintf(tail, sizeof tail, " %s %u %016llx",
                r.outcome == proto::Outcome::kOk ? "ok" : "failed", r.attempts,
                static_cast<unsigned long long>(Fnv1a64(r.result)));
  std::string line = "result ";
  line.append(r.id).append(tail);
  return line;
}

std::string SummaryLine(const SubmitSummary& s) {
  std::uint64_t done = s.ok + s.failed;
  double rate = s.seconds > 0 ? static_cast<double>(done) / s.seconds : 0.0;
  char line[256];
  std::snprintf(line, sizeof line,
                "submitted=%llu ok=%llu failed=%llu lost=%llu seconds=%.3f "
                "batches_per_s=%.1f",
                static_cast<unsigned long long>(s.submitted),
                static_cast<unsigned long long>(s.ok),
                static_cast<unsigned long long>(s.failed),
                static_cast<unsigned long long>(s.lost()), s.seconds, rate);
  return line;
}

}  // namespace fleet::client

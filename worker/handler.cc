#include "worker/handler.h"

#include <openssl/evp.h>
#include <spdlog/fmt/fmt.h>

#include <charconv>
#include <stdexcept>
#include <thread>

#include "worker/exec_handler.h"
#include "worker/process_handler.h"

namespace fleet::worker {

std::string TimeoutError(Timeout timeout) {
  return fmt::format("timed out after {}s", timeout.count());
}

HandlerOutput EchoHandler::Run(std::string payload, Timeout /*timeout*/) {
  return HandlerOutput::Ok(std::move(payload));
}

namespace {

std::string_view Trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\n";
  auto first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  auto last = s.find_last_not_of(kSpace);
  return s.substr(first, last - first + 1);
}

// Quotes at most 32 bytes of a bad payload for the error message.
std::string Preview(std::string_view s) {
  constexpr std::size_t kMax = 32;
  std::string out(s.substr(0, kMax));
  if (s.size() > kMax) out += "...";
  return out;
}

}  // namespace

HandlerOutput SleepHandler::Run(std::string payload, Timeout timeout) {
  std::string_view text = Trim(payload);
  std::uint64_t ms = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ms);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      ms > kMaxMillis) {
    return HandlerOutput::Failed(fmt::format(
        "sleep: payload must be a whole number of milliseconds (0..{}), got "
        "'{}'",
        kMaxMillis, Preview(payload)));
  }
  const std::chrono::milliseconds want(ms);
  if (timeout.count() > 0 && want > timeout) {
    std::this_thread::sleep_for(timeout);
    return HandlerOutput::Failed(TimeoutError(timeout));
  }
  std::this_thread::sleep_for(want);
  return HandlerOutput::Ok({});
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(),
                 nullptr) != 1) {
    throw std::runtime_error("EVP_Digest(sha256) failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * length, '\0');
  for (unsigned int i = 0; i < length; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0x0f];
  }
  return out;
}

HandlerOutput Sha256Handler::Run(std::string payload, Timeout /*timeout*/) {
  return HandlerOutput::Ok(Sha256Hex(payload));
}

std::unique_ptr<Handler> MakeHandler(const HandlerOptions& options) {
  if (options.name == "echo") return std::make_unique<EchoHandler>();
  if (options.name == "sleep") return std::make_unique<SleepHandler>();
  if (options.name == "sha256") return std::make_unique<Sha256Handler>();
  if (options.name == "exec") {
    if (options.exec.empty()) {
      throw std::invalid_argument("--handler exec requires --exec \"CMD\"");
    }
    ExecHandler::Options exec;
    exec.command = options.exec;
    return std::make_unique<ExecHandler>(std::move(exec));
  }
  if (options.name == "process") {
    if (options.exec.empty()) {
      throw std::invalid_argument("--handler process requires --exec \"CMD\"");
    }
    ProcessHandler::Options process;
    process.command = options.exec;
    process.slots = options.slots;
    process.worker_id = options.worker_id;
    process.grace = options.grace;
    process.max_frame_bytes = options.max_frame_bytes;
    process.objects = options.objects;
    return std::make_unique<ProcessHandler>(std::move(process));
  }
  throw std::invalid_argument("unknown handler '" + options.name +
                              "' (echo, sleep, sha256, exec, process)");
}

}  // namespace fleet::worker

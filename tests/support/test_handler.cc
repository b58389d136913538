// fleet-test-handler: a persistent handler (docs/handler-protocol.md) for
// the tests and the benchmark. By default it echoes each payload; payloads
// of the form VERB:ARG make it misbehave on purpose:
//
//   sleep:MS        sleep MS milliseconds, then answer ok ""
//   error:TEXT      answer error TEXT
//   exit:CODE       exit with CODE in the middle of the batch
//   kill            SIGKILL itself in the middle of the batch
//   garbage         write bytes that are not a frame to stdout
//   wrongid         answer ok for another batch id
//   stderr:TEXT     write TEXT and a newline to stderr, answer ok ""
//   env             answer ok "<FLEET_HANDLER_SLOT> <FLEET_WORKER_ID>"
//   pid             answer ok with its pid
//   once:FILE:VERB  if FILE does not exist, create it and do VERB (e.g.
//                   kill); otherwise answer ok "again"
//   features        answer ok with FLEET_HANDLER_FEATURES ("-" when unset)
//   fetch:HEX:CHUNK fetch the object whose digest is the bytes HEX, CHUNK
//                   bytes per `get`, one at a time, and answer ok with its
//                   bytes; error "status S: TEXT" when a get is refused
//   gets:N:HEX      send N gets of byte 0 at once, answer ok with their
//                   statuses in the order asked ("0,0,4")
//   badget          a get with an empty digest: answer ok with its status
//   getkill:HEX     send a get for HEX, then SIGKILL itself
//   lateget         answer ok "", then send a get (after its last answer)
//
// The object verbs read `object` frames until theirs comes and drop any
// other frame, so use them with a depth of 1.
//
// Flags: --ready-when FILE (say ready once FILE exists, polling every 10 ms;
// a FILE ending in "-" gets the slot number appended: one file per slot),
// --exit-before-ready CODE, --depth N (say in ready that it takes N
// batches at once; it still runs them one by one, in order, and writes the
// answers of echoes together while more batches are waiting), --ignore-eof
// (keep running after stdin closes: the worker must kill it), --marker TEXT
// (ignored; names it for pgrep).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/handler_frames.h"

namespace frames = fleet::worker::frames;

namespace {

// Reads stdin in large pieces: a frame usually takes one read.
class Input {
 public:
  // The next `n` bytes, or null at end of input.
  const char* Take(std::size_t n) {
    if (at_ > 0 && buf_.size() - at_ < n) {
      buf_.erase(0, at_);
      at_ = 0;
    }
    while (buf_.size() - at_ < n) {
      char chunk[65536];
      const ssize_t r = ::read(0, chunk, sizeof(chunk));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return nullptr;
      buf_.append(chunk, static_cast<std::size_t>(r));
    }
    const char* p = buf_.data() + at_;
    at_ += n;
    return p;
  }
  // Whether a whole frame is buffered: taking it will not block.
  bool HasFrame() const {
    const std::size_t left = buf_.size() - at_;
    if (left < 4) return false;
    const auto* h = reinterpret_cast<const unsigned char*>(buf_.data() + at_);
    const std::size_t n = (std::size_t{h[0]} << 24) | (std::size_t{h[1]} << 16) |
                          (std::size_t{h[2]} << 8) | std::size_t{h[3]};
    return left - 4 >= n;
  }

 private:
  std::string buf_;
  std::size_t at_ = 0;
};

void WriteAll(const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t w = ::write(1, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) std::_Exit(3);
    done += static_cast<std::size_t>(w);
  }
}

std::string FromHex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// An `object` frame's fields.
struct Object {
  std::uint64_t tag = 0, total = 0, offset = 0;
  std::uint32_t status = 0;
  std::string data, error;
};

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ready_when;
  bool ignore_eof = false;
  int exit_before_ready = -1;
  int depth = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ready-when" && i + 1 < argc) {
      ready_when = argv[++i];
    } else if (a == "--exit-before-ready" && i + 1 < argc) {
      exit_before_ready = std::atoi(argv[++i]);
    } else if (a == "--depth" && i + 1 < argc) {
      depth = std::atoi(argv[++i]);
    } else if (a == "--ignore-eof") {
      ignore_eof = true;
    } else if (a == "--marker" && i + 1 < argc) {
      ++i;
    } else {
      std::fprintf(stderr, "fleet-test-handler: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (exit_before_ready >= 0) {
    std::fprintf(stderr, "failing before ready on purpose\n");
    return exit_before_ready;
  }
  if (!ready_when.empty() && ready_when.back() == '-') {
    const char* slot = std::getenv("FLEET_HANDLER_SLOT");
    ready_when += slot != nullptr ? slot : "?";
  }
  while (!ready_when.empty() && !Exists(ready_when)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string out;
  frames::AppendReady(&out, frames::kVersion, static_cast<std::uint32_t>(std::max(depth, 0)));
  WriteAll(out);

  Input in;
  std::string body;
  std::string answers;  // not written yet: with a depth, while more input is buffered
  // The next frame's body into `body`; false at end of input.
  const auto next_frame = [&]() {
    const char* header = in.Take(4);
    if (header == nullptr) return false;
    const auto* h = reinterpret_cast<const unsigned char*>(header);
    const std::size_t n = (std::size_t{h[0]} << 24) | (std::size_t{h[1]} << 16) |
                          (std::size_t{h[2]} << 8) | std::size_t{h[3]};
    const char* b = in.Take(n);
    if (b == nullptr) std::_Exit(4);
    body.assign(b, n);
    return true;
  };
  // The answer to the get `tag` (other objects are skipped).
  const auto await_object = [&](std::uint64_t tag) {
    Object o;
    while (next_frame()) {
      if (frames::DecodeObjectForTests(body, &o.tag, &o.status, &o.total, &o.offset, &o.data,
                                       &o.error) &&
          o.tag == tag) {
        return o;
      }
    }
    std::_Exit(6);  // end of input while waiting
  };
  std::uint64_t next_tag = 1;
  while (true) {
    if (!answers.empty() && !in.HasFrame()) {
      WriteAll(answers);  // before a read that may block
      answers.clear();
    }
    if (!next_frame()) break;
    std::string id, payload;
    if (!frames::DecodeBatchForTests(body, &id, &payload)) {
      std::fprintf(stderr, "fleet-test-handler: not a batch frame\n");
      return 5;
    }
    std::string verb = payload, arg;
    if (const auto colon = payload.find(':'); colon != std::string::npos) {
      verb = payload.substr(0, colon);
      arg = payload.substr(colon + 1);
    }
    if (verb == "once") {
      const auto colon = arg.find(':');
      const std::string file = arg.substr(0, colon);
      if (Exists(file)) {
        verb = "again";
      } else {
        std::ofstream(file) << "1";
        verb = colon == std::string::npos ? "" : arg.substr(colon + 1);
        arg.clear();
      }
    }
    out.clear();
    bool quick = false;  // an echo: its answer may wait for the next one's
    if (verb == "fetch" || verb == "gets" || verb == "badget" || verb == "getkill") {
      WriteAll(answers);  // a get is made for the oldest batch not answered
      answers.clear();
    }
    if (verb == "sleep") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(arg.c_str())));
      frames::AppendOk(&out, id, "");
    } else if (verb == "error") {
      frames::AppendError(&out, id, arg);
    } else if (verb == "exit") {
      return std::atoi(arg.c_str());
    } else if (verb == "kill") {
      ::kill(::getpid(), SIGKILL);
    } else if (verb == "garbage") {
      out = "this is not a frame\n";
    } else if (verb == "wrongid") {
      frames::AppendOk(&out, id + "-other", payload);
    } else if (verb == "stderr") {
      std::fprintf(stderr, "%s\n", arg.c_str());
      std::fflush(stderr);
      frames::AppendOk(&out, id, "");
    } else if (verb == "env") {
      const char* slot = std::getenv("FLEET_HANDLER_SLOT");
      const char* worker = std::getenv("FLEET_WORKER_ID");
      frames::AppendOk(&out, id,
                       std::string(slot ? slot : "-") + " " + (worker ? worker : "-"));
    } else if (verb == "pid") {
      frames::AppendOk(&out, id, std::to_string(::getpid()));
    } else if (verb == "features") {
      const char* features = std::getenv("FLEET_HANDLER_FEATURES");
      frames::AppendOk(&out, id, features ? features : "-");
    } else if (verb == "fetch") {
      const auto colon = arg.find(':');
      const std::string digest = FromHex(arg.substr(0, colon));
      const std::uint64_t chunk =
          colon == std::string::npos ? 1u << 20 : std::stoull(arg.substr(colon + 1));
      std::string data, failure;
      std::uint64_t total = 1;
      while (data.size() < total && failure.empty()) {
        std::string get;
        const std::uint64_t tag = next_tag++;
        frames::AppendGet(&get, tag, digest, data.size(), chunk);
        WriteAll(get);
        const Object o = await_object(tag);
        if (o.status != 0) {
          failure = "status " + std::to_string(o.status) + ": " + o.error;
        } else if (o.offset != data.size() || (o.data.empty() && data.size() < o.total)) {
          failure = "bad answer at offset " + std::to_string(o.offset);
        } else {
          total = o.total;
          data += o.data;
        }
      }
      if (failure.empty()) {
        frames::AppendOk(&out, id, data);
      } else {
        frames::AppendError(&out, id, failure);
      }
    } else if (verb == "gets") {
      const auto colon = arg.find(':');
      const int n = std::atoi(arg.substr(0, colon).c_str());
      const std::string digest = colon == std::string::npos ? "" : FromHex(arg.substr(colon + 1));
      const std::uint64_t first = next_tag;
      std::string get;
      for (int i = 0; i < n; ++i) frames::AppendGet(&get, next_tag++, digest, 0, 1);
      WriteAll(get);
      std::vector<std::string> statuses(static_cast<std::size_t>(n));
      for (int got = 0; got < n; ++got) {
        Object o;
        if (!next_frame()) return 6;
        if (!frames::DecodeObjectForTests(body, &o.tag, &o.status, &o.total, &o.offset, &o.data,
                                          &o.error) ||
            o.tag < first || o.tag >= first + static_cast<std::uint64_t>(n)) {
          --got;
          continue;
        }
        statuses[o.tag - first] = std::to_string(o.status);
      }
      std::string joined;
      for (const auto& s : statuses) joined += (joined.empty() ? "" : ",") + s;
      frames::AppendOk(&out, id, joined);
    } else if (verb == "badget") {
      std::string get;
      const std::uint64_t tag = next_tag++;
      frames::AppendGet(&get, tag, "", 0, 1);
      WriteAll(get);
      frames::AppendOk(&out, id, std::to_string(await_object(tag).status));
    } else if (verb == "getkill") {
      std::string get;
      frames::AppendGet(&get, next_tag++, FromHex(arg), 0, 1);
      WriteAll(get);
      ::kill(::getpid(), SIGKILL);
    } else if (verb == "lateget") {
      frames::AppendOk(&out, id, "");
      frames::AppendGet(&out, next_tag++, "late", 0, 1);
    } else if (verb == "again") {
      frames::AppendOk(&out, id, "again");
    } else {
      frames::AppendOk(&out, id, payload);
      quick = true;
    }
    answers += out;
    if (depth <= 1 || !quick) {
      WriteAll(answers);
      answers.clear();
    }
  }
  if (ignore_eof) {
    while (true) ::pause();
  }
  return 0;
}

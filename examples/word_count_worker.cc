// A fleet worker running its own function: counts the words of each batch.
// Usage: word-count-worker [BROKER_BACKEND] (default tcp://127.0.0.1:5556).
// Runs until SIGTERM/SIGINT or `fleet-ctl retire`, finishing what it holds.
#include <fleet/worker.h>

#include <cctype>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  fleet::WorkerOptions options;
  if (argc > 1) options.broker = argv[1];
  options.concurrency = 2;

  fleet::Worker worker(options, [](const fleet::Batch& batch) {
    if (batch.payload.empty()) return fleet::Reply::Error("nothing to count");
    int words = 0;
    bool in_word = false;
    for (char c : batch.payload) {
      const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
      if (!space && !in_word) ++words;
      in_word = !space;
    }
    return fleet::Reply::Ok(std::to_string(words) + " words");
  });
  const int code = worker.Run();
  std::cerr << "word-count-worker: drained, exiting\n";
  return code;
}

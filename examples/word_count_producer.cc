// A fleet producer: sends each argument as a batch and prints its result.
// Usage: word-count-producer BROKER_FRONTEND TEXT... ; exits 1 if any failed.
#include <fleet/client.h>

#include <future>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: word-count-producer BROKER_FRONTEND TEXT...\n";
    return 2;
  }
  fleet::ClientOptions options;
  options.endpoint = argv[1];
  fleet::Client client(options);

  std::vector<std::future<fleet::Result>> results;
  for (int i = 2; i < argc; ++i) results.push_back(client.Submit(argv[i]));

  int failed = 0;
  for (auto& f : results) {
    const fleet::Result r = f.get();  // waits for this batch's result
    if (r.ok) {
      std::cout << r.id << " ok " << r.result << "\n";
    } else {
      std::cout << r.id << " failed " << r.error << "\n";
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}

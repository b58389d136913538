// Malformed endpoints and listen addresses are refused at start by every
// program, naming the flag and the value, and exit 2: nothing binds a port
// it was not given or fails later with a bare "Invalid argument".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/process.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

TEST(EndpointFlagsTest, EveryProgramRefusesAMalformedEndpointNamingFlagAndValue) {
  TempDir dir;
  struct Case {
    std::vector<std::string> argv;
    std::string says;
  };
  const std::vector<Case> cases = {
      // Regression: libzmq bound a random port for this one.
      {{Bin("fleet-broker"), "--frontend", "tcp://127.0.0.1:99999", "--metrics", ""},
       "--frontend 'tcp://127.0.0.1:99999': port '99999' is out of range"},
      {{Bin("fleet-broker"), "--backend", "tcp://:5556", "--metrics", ""},
       "--backend 'tcp://:5556': no host"},
      {{Bin("fleet-broker"), "--control", "inproc://control", "--metrics", ""},
       "--control 'inproc://control': inproc:// reaches only"},
      {{Bin("fleet-broker"), "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
        "--control", "tcp://127.0.0.1:*", "--metrics", "127.0.0.1:70000"},
       "--metrics '127.0.0.1:70000': '70000' is not a port"},
      // Regression: this said only "Invalid argument".
      {{Bin("fleet-worker"), "--broker", "garbage"}, "--broker 'garbage': no scheme"},
      {{Bin("fleet-worker"), "--broker", "tcp://127.0.0.1:5556", "--metrics", "9752"},
       "--metrics '9752': a port alone"},
      {{Bin("fleet-submit"), "--broker", "tcp://*:5555", "--count", "1"},
       "--broker 'tcp://*:5555': * is not a host to connect to"},
      {{Bin("fleet-ctl"), "--control", "tcp://127.0.0.1:0", "workers"},
       "--control 'tcp://127.0.0.1:0': port '0' is out of range (1..65535)"},
      {{Bin("fleet-autoscaler"), "--control", "udp://127.0.0.1:5557", "--metrics", ""},
       "--control 'udp://127.0.0.1:5557': unsupported scheme"},
      {{Bin("fleet-autoscaler"), "--control", "tcp://127.0.0.1:5557", "--metrics", "localhost:1"},
       "--metrics 'localhost:1': 'localhost' is not an IPv4 address"},
  };
  int n = 0;
  for (const Case& c : cases) {
    RunResult r = fleet::testing::Run(c.argv, seconds(20), dir.File("run-" + std::to_string(++n) + ".log"));
    EXPECT_EQ(r.exit_code, 2) << c.argv[0] << " " << c.argv[2] << ": " << r.output;
    EXPECT_THAT(r.output, ::testing::HasSubstr(c.says)) << c.argv[0];
  }
}

}  // namespace
}  // namespace fleet::testing

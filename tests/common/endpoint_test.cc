#include "common/endpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace fleet {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::string& endpoint, EndpointUse use) {
  try {
    CheckEndpoint("--frontend", endpoint, use);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(EndpointTest, AcceptsWhatEachSideMayUse) {
  for (const char* e : {"tcp://*:5555", "tcp://*:*", "tcp://*:0", "tcp://127.0.0.1:5555",
                        "tcp://0.0.0.0:1", "tcp://[::1]:65535", "tcp://[::]:*", "tcp://lo:5555",
                        "ipc:///tmp/fleet.sock", "ipc://*"}) {
    EXPECT_EQ(ErrorOf(e, EndpointUse::kBind), "") << e;
  }
  for (const char* e : {"tcp://127.0.0.1:5555", "tcp://broker.example:65535", "tcp://[::1]:1",
                        "tcp://fleet-broker:5556", "ipc:///tmp/fleet.sock"}) {
    EXPECT_EQ(ErrorOf(e, EndpointUse::kConnect), "") << e;
  }
}

TEST(EndpointTest, RefusesBadEndpointsNamingTheFlagTheValueAndWhy) {
  struct Case {
    const char* endpoint;
    EndpointUse use;
    const char* error;
  } cases[] = {
      {"tcp://127.0.0.1:99999", EndpointUse::kBind, "port '99999' is out of range (1..65535"},
      {"tcp://127.0.0.1:65536", EndpointUse::kConnect, "out of range"},
      {"tcp://127.0.0.1:0", EndpointUse::kConnect, "port '0' is out of range"},
      {"tcp://127.0.0.1:*", EndpointUse::kConnect, "port '*' is out of range"},
      {"tcp://127.0.0.1:-1", EndpointUse::kBind, "out of range"},
      {"tcp://127.0.0.1:55 55", EndpointUse::kBind, "out of range"},
      {"tcp://127.0.0.1:", EndpointUse::kBind, "no port after the host"},
      {"tcp://127.0.0.1", EndpointUse::kConnect, "no port"},
      {"tcp://:5555", EndpointUse::kBind, "no host"},
      {"tcp://:5555", EndpointUse::kConnect, "no host"},
      {"tcp://*:5555", EndpointUse::kConnect, "* is not a host to connect to"},
      {"tcp://::1:5555", EndpointUse::kConnect, "goes in brackets"},
      {"tcp://[::1:5555", EndpointUse::kConnect, "no port after the IPv6 address"},
      {"tcp://[nope]:5555", EndpointUse::kConnect, "not an IPv6 address"},
      {"tcp://bro ker:5555", EndpointUse::kConnect, "not a host name"},
      {"garbage", EndpointUse::kConnect, "no scheme"},
      {"", EndpointUse::kConnect, "empty"},
      {"127.0.0.1:5555", EndpointUse::kConnect, "no scheme"},
      {"udp://127.0.0.1:5555", EndpointUse::kConnect, "unsupported scheme 'udp://'"},
      {"inproc://broker", EndpointUse::kBind, "inproc:// reaches only"},
      {"ipc://", EndpointUse::kBind, "no path"},
      {"ipc://*", EndpointUse::kConnect, "only names a path to bind"},
  };
  for (const auto& c : cases) {
    const std::string error = ErrorOf(c.endpoint, c.use);
    EXPECT_THAT(error, HasSubstr(c.error)) << c.endpoint;
    EXPECT_THAT(error, HasSubstr("--frontend '" + std::string(c.endpoint) + "'")) << c.endpoint;
    EXPECT_THAT(error, HasSubstr("want tcp://HOST:PORT")) << c.endpoint;
  }
}

TEST(EndpointTest, ListenAddressesNameTheirFlag) {
  EXPECT_NO_THROW(CheckListenAddress("--metrics", "127.0.0.1:0"));
  EXPECT_NO_THROW(CheckListenAddress("--metrics", "[::]:9750"));
  try {
    CheckListenAddress("--metrics", "127.0.0.1:99999");
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("--metrics '127.0.0.1:99999': '99999' is not a port"));
  }
}

}  // namespace
}  // namespace fleet

#include "common/metrics_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>

#include <chrono>
#include <stdexcept>

#include "common/http_client.h"

namespace fleet {
namespace {

using ::testing::HasSubstr;
using std::chrono::seconds;

std::string ListenErrorOf(const std::string& address) {
  try {
    CheckMetricsAddress(address);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(MetricsServerTest, AcceptsNumericAddressWithPort) {
  for (const char* a : {"0.0.0.0:9750", "127.0.0.1:0", "10.1.2.3:65535", "[::]:9750", "[::1]:0"}) {
    EXPECT_EQ(ListenErrorOf(a), "") << a;
  }
}

TEST(MetricsServerTest, RefusesAHostAlonePortAloneAndOtherBadAddressesSayingWhy) {
  struct Case {
    const char* address;
    const char* error;
  } cases[] = {
      {"127.0.0.1", "no port"},
      {"0.0.0.0", "no port"},
      {"9750", "a port alone"},
      {":9750", "no address"},
      {"localhost:9750", "not an IPv4 address"},
      {"::1:9750", "not an IPv4 address"},
      {"127.0.0.1:", "not a port"},
      {"127.0.0.1:http", "not a port"},
      {"127.0.0.1:65536", "not a port"},
      {"127.0.0.1:-1", "not a port"},
      {"127.0.0.1:0000009750", "not a port"},
      {"[::1]", "no port after the IPv6 address"},
      {"[::1]9750", "no port after the IPv6 address"},
      {"[nope]:9750", "not an IPv6 address"},
      {"", "no port"},
  };
  for (const auto& c : cases) {
    std::string error = ListenErrorOf(c.address);
    EXPECT_THAT(error, HasSubstr(c.error)) << c.address;
    EXPECT_THAT(error, HasSubstr("ADDRESS:PORT")) << c.address;
    EXPECT_THAT(error, HasSubstr("--metrics")) << c.address;
  }
}

class ServedMetricsTest : public ::testing::Test {
 protected:
  void Serve(const std::optional<BasicAuth>& auth) {
    registry_ = std::make_shared<prometheus::Registry>();
    prometheus::BuildCounter().Name("fleet_test_total").Help("t").Register(*registry_).Add({});
    served_ = ServeMetrics("127.0.0.1:0", registry_, auth);
  }
  // The status of GET `path` on the served port, with `user`:`password`
  // when user is non-empty.
  long Status(const std::string& path, const std::string& user = "",
              const std::string& password = "", std::string* body = nullptr) {
    http::HttpOptions options;
    options.username = user;
    options.password = password;
    std::string url = served_.url().substr(0, served_.url().rfind("/metrics")) + path;
    http::HttpResponse r = http_.Get(url, std::chrono::milliseconds(5000), options);
    EXPECT_EQ(r.error, "") << url;
    if (body != nullptr) *body = r.body;
    return r.status;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  MetricsServer served_;
  http::HttpClient http_;
};

TEST_F(ServedMetricsTest, WithAuthOnlyTheRightUserAndPasswordGetThePage) {
  Serve(BasicAuth{"prom", "s3cret"});
  std::string body;
  EXPECT_EQ(Status("/metrics"), 401);
  EXPECT_EQ(Status("/metrics", "prom", "wrong"), 401);
  EXPECT_EQ(Status("/metrics", "prom", "s3cret "), 401);
  EXPECT_EQ(Status("/metrics", "other", "s3cret"), 401);
  EXPECT_EQ(Status("/metrics", "prom", "s3cret", &body), 200);
  EXPECT_THAT(body, HasSubstr("fleet_test_total 0"));
  // Query strings do not change the path.
  EXPECT_EQ(Status("/metrics?x=1", "prom", "s3cret"), 200);
}

TEST_F(ServedMetricsTest, EveryPathButMetricsIs404WithOrWithoutAuth) {
  for (bool with_auth : {false, true}) {
    Serve(with_auth ? std::optional<BasicAuth>(BasicAuth{"prom", "s3cret"}) : std::nullopt);
    for (const char* path : {"/", "/metrics/", "/metrics/x", "/metricsx", "/Metrics",
                             "/favicon.ico", "/index.html", "/../etc/passwd", "/%2e%2e/"}) {
      EXPECT_EQ(Status(path), 404) << path << " auth " << with_auth;
      EXPECT_EQ(Status(path, "prom", "s3cret"), 404) << path << " auth " << with_auth;
    }
    EXPECT_EQ(Status("/metrics", "prom", "s3cret"), 200) << "auth " << with_auth;
  }
}

// A restarted program binds the same --metrics port the moment the old one
// is gone, even right after a scrape (whose connection the server closed).
TEST_F(ServedMetricsTest, StoppedPageFreesItsPortForARestartAtOnce) {
  Serve(std::nullopt);
  ASSERT_TRUE(served_.serving());
  EXPECT_EQ(Status("/metrics"), 200);
  const std::string url = served_.url();
  const std::string address = url.substr(7, url.rfind("/metrics") - 7);  // after http://
  for (int round = 0; round < 3; ++round) {
    served_.Stop();
    EXPECT_FALSE(served_.serving());
    served_ = ServeMetrics(address, registry_);
    EXPECT_EQ(served_.url(), url);
    EXPECT_EQ(Status("/metrics"), 200) << "round " << round;
  }
  // A moved-from server no longer owns the page; the new owner serves it.
  MetricsServer moved = std::move(served_);
  EXPECT_FALSE(served_.serving());
  EXPECT_TRUE(moved.serving());
}

TEST(MetricsServerTest, LoadMetricsFlagsChecksTheAddressAndNeedsMetricsForAuth) {
  EXPECT_FALSE(LoadMetricsFlags("127.0.0.1:0", "").has_value());
  EXPECT_FALSE(LoadMetricsFlags("", "").has_value());
  EXPECT_THROW(LoadMetricsFlags("127.0.0.1", ""), std::invalid_argument);
  try {
    LoadMetricsFlags("", "/some/file");
    ADD_FAILURE() << "no throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("--metrics-auth-file"));
  }
  try {
    LoadMetricsFlags("127.0.0.1:0", "/nonexistent/auth");
    ADD_FAILURE() << "no throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("--metrics-auth-file"));
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/auth"));
  }
}

}  // namespace
}  // namespace fleet

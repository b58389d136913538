// The inbound budget (--max-inbound-mb) under a flood of connections that
// each start a large frame and never finish it: the broker refuses the
// connections past the budget and counts them, stays up, and a producer
// next to the flood gets every batch done (checked by the ledger). Real
// broker, worker and fleet-submit on 127.0.0.1; no assertion is on time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/hostile_clients.h"
#include "tests/support/http_get.h"
#include "tests/support/ledger.h"
#include "tests/support/wait.h"

namespace fleet::testing {
namespace {

using std::chrono::seconds;

// Sum of every series of `name` whose labels contain `labels`.
double Sum(const std::string& page, const std::string& name, const std::string& labels) {
  std::istringstream in(page);
  std::string line;
  double total = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0 || line.find(labels) == std::string::npos) continue;
    total += std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return total;
}

// The value of the unlabelled series `name`, or -1.
double Plain(const std::string& page, const std::string& name) {
  const auto at = page.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(page.c_str() + at + name.size() + 2);
}

TEST(FloodTest, ConnectionsPastTheInboundBudgetAreRefusedWhileAProducerCompletesEveryBatch) {
  // Batches of at most 1 MiB: a frame may be 1 MiB + 68 KiB of envelope
  // (--max-message-bytes, derived) + 64 KiB of slack, so a budget of 4 MiB
  // holds three connections that have not sent a valid message.
  constexpr std::size_t kBatch = 1 << 20;
  constexpr std::size_t kFrame = kBatch + (68 << 10) + (64 << 10);
  constexpr int kHeld = 3;
  constexpr int kFlood = 24;
  Cluster c;
  c.StartBroker({"--max-batch-bytes", std::to_string(kBatch), "--max-inbound-mb", "4",
                 "--max-attempts", "3"});
  c.StartWorker("w1", {"--handler", "echo", "--concurrency", "4"});
  ASSERT_TRUE(WaitFor([&] { return c.Workers().size() == 1; })) << c.BrokerLog();

  // Each announces a whole frame (within ZMQ_MAXMSGSIZE, so libzmq keeps
  // reading it), sends a quarter of it and stops there.
  std::vector<int> flood;
  for (int i = 0; i < kFlood; ++i) {
    const int fd = StartUnfinishedFrame(c.frontend(), kFrame, kFrame / 4);
    ASSERT_GE(fd, 0) << "connect " << i;
    flood.push_back(fd);
  }
  auto page = [&] { return HttpGet(c.metrics()); };
  const std::string refused = "fleet_connections_refused_total";
  ASSERT_TRUE(WaitFor([&] {
    return Sum(page(), refused, "endpoint=\"producers\"") >= kFlood - kHeld;
  })) << page() << c.BrokerLog();
  int closed = 0;
  ASSERT_TRUE(WaitFor([&] {
    closed = 0;
    for (int fd : flood) closed += PeerClosed(fd);
    return closed >= kFlood - kHeld;
  })) << closed << " of " << kFlood << " closed\n" << c.BrokerLog();
  EXPECT_NE(c.BrokerLog().find("refused a connection on the producers endpoint"),
            std::string::npos) << c.BrokerLog();

  // A producer next to the flood: the budget is full of silent connections,
  // so it gets in once the oldest of them has had its grace (1 s) and is
  // closed to make room, and every batch completes exactly once.
  const std::string ledger = c.dir().File("ledger.txt");
  Cluster::Submitted s = c.Submit({"--count", "300", "--size", "64", "--inflight", "100",
                                   "--ledger", ledger});
  EXPECT_EQ(s.run.exit_code, 0) << s.run.output;
  EXPECT_EQ(s.summary["ok"], "300") << s.run.output;
  LedgerOptions options;
  options.max_attempts = 3;
  LedgerReport r = CheckLedger({ledger}, {}, options);
  EXPECT_TRUE(r.passed) << r.Describe() << "\n" << c.BrokerLog();
  EXPECT_EQ(r.submitted, 300u);

  // Still up, and no more silent connections are held than the budget has
  // room for.
  ASSERT_TRUE(c.broker().Running()) << c.BrokerLog();
  const std::string now = page();
  std::printf("refused %.0f, evicted %.0f, unproven now %.0f, reserved %.0f bytes\n",
              Sum(now, refused, "reason=\"inbound_budget\""),
              Sum(now, refused, "reason=\"unproven_evicted\""),
              Plain(now, "fleet_connections_unproven"), Plain(now, "fleet_inbound_reserved_bytes"));
  closed = 0;
  for (int fd : flood) closed += PeerClosed(fd);
  EXPECT_GE(closed, kFlood - kHeld);
  for (int fd : flood) close(fd);
  EXPECT_EQ(c.StatValue("completed_ok"), 300);
}

}  // namespace
}  // namespace fleet::testing

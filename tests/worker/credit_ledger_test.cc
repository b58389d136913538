#include "worker/credit_ledger.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fleet::worker {
namespace {

TEST(CreditLedgerTest, HelloOffersFreeSlotsOrZeroWhileDraining) {
  CreditLedger ledger(4);
  EXPECT_EQ(ledger.OnHello(false), 4u);
  ledger.OnDispatch(3);
  EXPECT_EQ(ledger.OnHello(false), 1u);
  EXPECT_EQ(ledger.OnHello(true), 0u);
}

// A script of events against a ledger of `slots`, with what each DONE grants.
struct Step {
  char op;             // 'h' hello, 'd' dispatch n, 'c' complete n, 'g' grant
  std::uint32_t n;     // batches for d / c; expected grant for g
};
struct Case {
  std::string name;
  std::uint32_t slots;
  bool draining;
  std::vector<Step> steps;
};

TEST(CreditLedgerTest, DoneGrantsExactlyTheSlotsFreed) {
  const std::vector<Case> cases = {
      {"one at a time", 2, false, {{'h', 0}, {'d', 2}, {'c', 1}, {'g', 1}, {'c', 1}, {'g', 1}}},
      {"coalesced", 3, false, {{'h', 0}, {'d', 3}, {'c', 3}, {'g', 3}}},
      {"partly used credit", 4, false, {{'h', 0}, {'d', 1}, {'c', 1}, {'g', 1}, {'g', 0}}},
      {"broker over-sends", 2, false,
       {{'h', 0}, {'d', 3}, {'c', 1}, {'g', 0}, {'c', 1}, {'g', 1}, {'c', 1}, {'g', 1}}},
      {"results after re-hello", 2, false, {{'h', 0}, {'d', 2}, {'c', 2}, {'h', 0}, {'g', 0}}},
      {"draining grants nothing", 2, true, {{'h', 0}, {'d', 2}, {'c', 2}, {'g', 0}}},
  };
  for (const Case& c : cases) {
    CreditLedger ledger(c.slots);
    for (const Step& s : c.steps) {
      switch (s.op) {
        case 'h': ledger.OnHello(c.draining); break;
        case 'd': ledger.OnDispatch(s.n); break;
        case 'c': for (std::uint32_t i = 0; i < s.n; ++i) ledger.OnCompleted(); break;
        case 'g': EXPECT_EQ(ledger.TakeGrant(c.draining), s.n) << c.name; break;
      }
      EXPECT_LE(ledger.broker_credit(), ledger.free()) << c.name;
    }
  }
}

TEST(CreditLedgerTest, ReturnedGrantIsOfferedAgain) {
  CreditLedger ledger(2);
  ledger.OnHello(false);
  ledger.OnDispatch(2);
  ledger.OnCompleted();
  EXPECT_EQ(ledger.TakeGrant(false), 1u);
  ledger.ReturnGrant(1);
  EXPECT_EQ(ledger.TakeGrant(false), 1u);
  EXPECT_EQ(ledger.TakeGrant(false), 0u);
}

TEST(CreditLedgerTest, OverCommittedOnlyWhileHoldingMoreThanSlots) {
  CreditLedger ledger(1);
  ledger.OnHello(false);
  ledger.OnDispatch(2);
  EXPECT_TRUE(ledger.over_committed());
  EXPECT_EQ(ledger.free(), 0u);
  ledger.OnCompleted();
  EXPECT_FALSE(ledger.over_committed());
}

}  // namespace
}  // namespace fleet::worker

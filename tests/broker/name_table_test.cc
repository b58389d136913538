#include "broker/name_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fleet::broker {
namespace {

TEST(NameTableTest, SharesOneTextAndCountsItsNames) {
  NameTable t;
  std::string text = "producer-1";
  Name a = t.Acquire(text);
  text = "something else";  // the table keeps its own copy
  Name b = t.Acquire("producer-1");
  EXPECT_EQ(a, "producer-1");
  EXPECT_EQ(a.view().data(), b.view().data());
  EXPECT_EQ(t.Count("producer-1"), 2u);
  EXPECT_EQ(t.size(), 1u);
}

TEST(NameTableTest, ForgetsATextWhenItsLastNameIsReleased) {
  NameTable t;
  Name a = t.Acquire("w1");
  Name b = t.Acquire("w1");
  t.Release(a);
  EXPECT_EQ(t.Count("w1"), 1u);
  EXPECT_EQ(b, "w1");
  t.Release(b);
  EXPECT_EQ(t.Count("w1"), 0u);
  EXPECT_EQ(t.size(), 0u);
}

TEST(NameTableTest, EmptyTextIsCountedAndDefaultNameIsIgnored) {
  NameTable t;
  Name e = t.Acquire("");
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(t.Count(""), 1u);
  t.Release(Name());  // not from the table: no count changes
  EXPECT_EQ(t.Count(""), 1u);
  t.Release(e);
  EXPECT_EQ(t.Count(""), 0u);
}

// Acquire takes the text it took last without a lookup, and Release counts
// down from the Name alone: both must keep every text's count exact when
// names interleave, repeat, and are forgotten and taken again.
TEST(NameTableTest, CountsStayExactThroughRepeatsInterleavingAndReuse) {
  NameTable t;
  std::vector<Name> held;
  for (int i = 0; i < 3; ++i) held.push_back(t.Acquire("p1"));  // the same text again
  held.push_back(t.Acquire("p2"));
  held.push_back(t.Acquire("p1"));  // back to the first: a lookup
  EXPECT_EQ(t.Count("p1"), 4u);
  EXPECT_EQ(t.Count("p2"), 1u);
  t.Release(held[3]);  // p2 forgotten while it is the last one acquired
  EXPECT_EQ(t.Count("p2"), 0u);
  EXPECT_EQ(t.size(), 1u);
  Name again = t.Acquire("p2");  // a fresh entry, not the forgotten one
  EXPECT_EQ(again, "p2");
  EXPECT_EQ(t.Count("p2"), 1u);
  for (Name n : {held[0], held[1], held[2], held[4]}) t.Release(n);
  EXPECT_EQ(t.Count("p1"), 0u);
  Name p1 = t.Acquire("p1");  // forgotten, then taken again
  EXPECT_EQ(t.Count("p1"), 1u);
  EXPECT_EQ(p1, "p1");
  t.Release(again);
  t.Release(p1);
  EXPECT_EQ(t.size(), 0u);
  // A text equal to the last one's but held elsewhere finds the entry too.
  std::string copy = "p3";
  Name a = t.Acquire("p3");
  Name b = t.Acquire(copy);
  EXPECT_EQ(a.view().data(), b.view().data());
  EXPECT_EQ(t.Count("p3"), 2u);
}

TEST(NameTableTest, NamesStayValidWhileTheTableGrows) {
  NameTable t;
  Name first = t.Acquire("queue-0");
  const char* where = first.view().data();
  for (int i = 1; i < 10000; ++i) t.Acquire("queue-" + std::to_string(i));
  EXPECT_EQ(first.view().data(), where);
  EXPECT_EQ(first, "queue-0");
}

TEST(NameTest, DefaultIsEmptyAndComparesByText) {
  std::string s = "q";
  Name n(s);
  EXPECT_EQ(Name(), "");
  EXPECT_EQ(n, Name(s));
  EXPECT_FALSE(n == Name());
  EXPECT_EQ(std::string_view(n), "q");
}

}  // namespace
}  // namespace fleet::broker

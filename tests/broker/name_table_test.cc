#include "broker/name_table.h"

#include <gtest/gtest.h>

#include <string>

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

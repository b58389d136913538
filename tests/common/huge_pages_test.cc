#include "common/huge_pages.h"

#include <gtest/gtest.h>

namespace fleet {
namespace {

constexpr const char* kMadvise = "always [madvise] never\n";

TEST(HugePagesTest, UnsetTunablesGetTheHugePageOne) {
  EXPECT_EQ(HugePageTunables(nullptr, kMadvise, nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(HugePageTunables("", kMadvise, nullptr), "glibc.malloc.hugetlb=1");
}

TEST(HugePagesTest, OtherTunablesAreKeptAndAppendedTo) {
  EXPECT_EQ(HugePageTunables("glibc.malloc.arena_max=2", kMadvise, nullptr),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
}

TEST(HugePagesTest, TheUsersOwnHugetlbChoiceStands) {
  EXPECT_EQ(HugePageTunables("glibc.malloc.hugetlb=0", kMadvise, nullptr), std::nullopt);
  EXPECT_EQ(HugePageTunables("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2", kMadvise,
                             nullptr),
            std::nullopt);
}

TEST(HugePagesTest, NothingToDoUnlessTheKernelAdvisesPerRegion) {
  EXPECT_EQ(HugePageTunables(nullptr, "always madvise [never]\n", nullptr), std::nullopt);
  EXPECT_EQ(HugePageTunables(nullptr, "[always] madvise never\n", nullptr), std::nullopt);
  EXPECT_EQ(HugePageTunables(nullptr, "", nullptr), std::nullopt);  // no THP at all
}

TEST(HugePagesTest, OptOutWithZero) {
  EXPECT_EQ(HugePageTunables(nullptr, kMadvise, "0"), std::nullopt);
  EXPECT_EQ(HugePageTunables(nullptr, kMadvise, "1"), "glibc.malloc.hugetlb=1");
}

}  // namespace
}  // namespace fleet

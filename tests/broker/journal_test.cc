#include "broker/journal.h"

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "tests/support/process.h"

namespace fleet::broker {
namespace {

using Record = std::pair<int, std::string>;

std::vector<Record> Replay(const JournalOptions& o, std::unique_ptr<Journal>* keep = nullptr) {
  std::vector<Record> seen;
  auto j = Journal::Open(o, [&](std::uint8_t type, std::string_view body) {
    seen.emplace_back(type, std::string(body));
  });
  if (keep != nullptr) *keep = std::move(j);
  return seen;
}

std::vector<std::string> Segments(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("journal-", 0) == 0) out.push_back(dir + "/" + n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

class JournalTest : public ::testing::Test {
 protected:
  JournalOptions Options() {
    JournalOptions o;
    o.dir = dir_.path() + "/data";
    return o;
  }
  // Writes `n` records "r0".."r{n-1}" of type 1 in one run, committed.
  std::string WriteRun(int n) {
    std::unique_ptr<Journal> j;
    EXPECT_TRUE(Replay(Options(), &j).empty());
    for (int i = 0; i < n; ++i) j->Append(1, "r" + std::to_string(i));
    EXPECT_TRUE(j->Commit());
    return Segments(Options().dir).back();
  }
  fleet::testing::TempDir dir_;
};

TEST(Crc32cTest, KnownVector) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST_F(JournalTest, CommittedRecordsReplayInOrderAcrossRestarts) {
  {
    std::unique_ptr<Journal> j;
    EXPECT_TRUE(Replay(Options(), &j).empty());
    EXPECT_FALSE(j->Commit());  // nothing to write
    j->Append(1, "accepted a");
    j->Append(2, std::string("completed\0a", 11));
    EXPECT_TRUE(j->pending());
    EXPECT_TRUE(j->Commit());
    EXPECT_FALSE(j->pending());
    EXPECT_EQ(j->stats().commits, 1u);
  }
  {
    std::unique_ptr<Journal> j;
    EXPECT_THAT(Replay(Options(), &j),
                ::testing::ElementsAre(Record{1, "accepted a"},
                                       Record{2, std::string("completed\0a", 11)}));
    EXPECT_EQ(j->stats().records_replayed, 2u);
    j->Append(1, "accepted b");
    j->Commit();
  }
  auto all = Replay(Options());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[2], (Record{1, "accepted b"}));
  // One per run that wrote, and the active one; compaction prunes them.
  EXPECT_EQ(Segments(Options().dir).size(), 3u);
}

TEST_F(JournalTest, TornLastRecordIsTruncatedAndTheRestKept) {
  std::string seg = WriteRun(3);
  std::string data = Slurp(seg);
  Spit(seg, data.substr(0, data.size() - 1));  // the power cut
  std::unique_ptr<Journal> j;
  auto seen = Replay(Options(), &j);
  EXPECT_THAT(seen, ::testing::ElementsAre(Record{1, "r0"}, Record{1, "r1"}));
  EXPECT_EQ(j->stats().torn_bytes_truncated, 9u + 2u - 1u);
  j.reset();
  EXPECT_EQ(Slurp(seg).size(), 2u * 11u);  // cut at the end of r1, for good
  EXPECT_EQ(Replay(Options()).size(), 2u);
}

TEST_F(JournalTest, LastRecordFailingItsChecksumIsATornTail) {
  std::string seg = WriteRun(3);
  std::string data = Slurp(seg);
  data.back() ^= 0x40;  // half-written sector
  Spit(seg, data);
  EXPECT_EQ(Replay(Options()).size(), 2u);
}

TEST_F(JournalTest, ZeroFilledTailIsATornTail) {
  std::string seg = WriteRun(2);
  Spit(seg, Slurp(seg) + std::string(4096, '\0'));
  std::unique_ptr<Journal> j;
  EXPECT_EQ(Replay(Options(), &j).size(), 2u);
  EXPECT_EQ(j->stats().torn_bytes_truncated, 4096u);
}

TEST_F(JournalTest, CorruptionInTheMiddleRefusesToStart) {
  std::string seg = WriteRun(3);
  std::string data = Slurp(seg);
  data[9] ^= 0x01;  // the body of r0, with r1 and r2 after it
  Spit(seg, data);
  try {
    Replay(Options());
    FAIL() << "a corrupt journal was replayed";
  } catch (const JournalError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("corrupt record at offset 0"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(seg));
  }
  EXPECT_EQ(Slurp(seg), data) << "a refused start must not change the files";
}

TEST_F(JournalTest, DamageInAnOlderSegmentRefusesToStart) {
  std::string first = WriteRun(2);
  {
    std::unique_ptr<Journal> j;
    Replay(Options(), &j);
    j->Append(1, "later");
    j->Commit();
  }
  std::string data = Slurp(first);
  Spit(first, data.substr(0, data.size() - 1));
  EXPECT_THROW(Replay(Options()), JournalError);
}

TEST_F(JournalTest, CompactionKeepsOnlyTheSnapshotAndDropsOldSegments) {
  JournalOptions o = Options();
  o.segment_bytes = 1000;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  for (int i = 0; i < 100; ++i) j->Append(1, "batch " + std::to_string(i));
  j->Commit();
  EXPECT_TRUE(j->NeedsCompaction());
  j->Compact([](Journal& out) {
    out.Append(1, "batch 98");
    out.Append(1, "batch 99");
  });
  EXPECT_FALSE(j->NeedsCompaction());
  EXPECT_EQ(j->segment_count(), 1u);
  EXPECT_EQ(Segments(o.dir).size(), 1u);
  j->Append(2, "done 98");
  j->Commit();
  j.reset();
  EXPECT_THAT(Replay(o), ::testing::ElementsAre(Record{1, "batch 98"}, Record{1, "batch 99"},
                                                Record{2, "done 98"}));
}

TEST_F(JournalTest, OnlyRecordsThatMustSyncCostAnFdatasync) {
  std::unique_ptr<Journal> j;
  Replay(Options(), &j);
  j->Append(2, "finished a", /*must_sync=*/false);
  EXPECT_TRUE(j->Commit());
  EXPECT_EQ(j->stats().syncs, 0u);
  j->Append(2, "finished b", false);
  j->Append(1, "accepted c");  // an ack waits for this one
  EXPECT_TRUE(j->Commit());
  EXPECT_EQ(j->stats().syncs, 1u);
  EXPECT_EQ(j->stats().commits, 2u);
  j.reset();
  EXPECT_EQ(Replay(Options()).size(), 3u);  // written all the same
}

TEST_F(JournalTest, ALiveSetLargerThanASegmentIsNotRewrittenOnEveryTick) {
  JournalOptions o = Options();
  o.segment_bytes = 1000;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  const std::string payload(100, 'p');
  for (int i = 0; i < 30; ++i) j->Append(1, payload);
  j->Commit();
  ASSERT_TRUE(j->NeedsCompaction());
  j->Compact([&](Journal& out) {
    for (int i = 0; i < 20; ++i) out.Append(1, payload);  // still live: 2180 bytes
  });
  EXPECT_GT(j->active_bytes(), o.segment_bytes);
  EXPECT_FALSE(j->NeedsCompaction()) << "it would compact again at once";
  for (int i = 0; i < 20; ++i) j->Append(2, "done");
  j->Commit();
  EXPECT_FALSE(j->NeedsCompaction());
  for (int i = 0; i < 20; ++i) j->Append(1, payload);
  j->Commit();
  EXPECT_TRUE(j->NeedsCompaction());  // twice what the last one kept
}

TEST_F(JournalTest, RunsThatWroteNothingLeaveNoSegment) {
  for (int i = 0; i < 5; ++i) Replay(Options());
  EXPECT_EQ(Segments(Options().dir).size(), 1u);
}

TEST_F(JournalTest, UnusableDirectoryIsAClearError) {
  JournalOptions o;
  o.dir = "/proc/version/data";  // a file's child: cannot exist
  EXPECT_THROW(Replay(o), JournalError);
}

}  // namespace
}  // namespace fleet::broker

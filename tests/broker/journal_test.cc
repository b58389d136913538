#include "broker/journal.h"

#include <dirent.h>
#include <poll.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <set>
#include <thread>

#include "broker/journal_pacer.h"
#include "broker/journal_records.h"
#include "tests/broker/faulty_journal_io.h"
#include "tests/support/process.h"

namespace fleet::broker {
namespace {

using Record = std::pair<int, std::string>;

std::vector<Record> Replay(const JournalOptions& o, std::unique_ptr<Journal>* keep = nullptr) {
  std::vector<Record> seen;
  auto j = Journal::Open(o, [&](std::uint64_t, std::uint8_t type, std::string_view body) {
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
    EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
    return Segments(Options().dir).back();
  }
  fleet::testing::TempDir dir_;
};


// Records of the tests below: type 1 "accepted" and type 2 "finished",
// each with the batch id as its whole body, and type 4 "finished" with
// ids as items (AppendItem).
constexpr std::uint8_t kAcc = 1;
constexpr std::uint8_t kFin = 2;
constexpr std::uint8_t kItems = 4;
constexpr std::size_t kHeader = Journal::kSegmentHeader;

std::size_t Rec(std::size_t body) { return Journal::kRecordHeader + body; }

JournalOptions WithKeys(JournalOptions o) {
  o.record_key = [](std::uint8_t, std::string_view body) { return body; };
  o.item_types = {kItems};
  return o;
}

Journal::LiveIds NoIds() {
  return [](std::uint64_t) { return std::vector<std::string>{}; };
}

// The items of a record made by AppendItem.
std::vector<std::string> Items(std::string_view body) {
  std::vector<std::string> items;
  EXPECT_TRUE(Journal::ForEachItem(body, [&](std::string_view i) { items.emplace_back(i); }));
  return items;
}

// The batches a start would bring back: accepted and not finished.
std::set<std::string> Unfinished(const JournalOptions& o) {
  std::set<std::string> ids;
  for (const auto& [type, body] : Replay(o)) {
    if (type == kAcc) ids.insert(body);
    if (type == kFin) ids.erase(body);
    if (type == kItems) {
      for (const std::string& id : Items(body)) ids.erase(id);
    }
  }
  return ids;
}

// A batch "stuck" that stays unfinished, then 40 that pass through,
// filling segments of `o.segment_bytes`.
void FillAroundAStuckBatch(Journal& j) {
  j.Append(kAcc, "stuck");
  j.AddLive(j.active_segment(), Rec(5));
  for (int i = 0; i < 40; ++i) {
    const std::string id = "done-" + std::to_string(i) + std::string(40, 'x');
    j.Append(kAcc, id);
    j.Append(kFin, id, false);
    j.Commit();
  }
}

TEST(Crc32cTest, FastAndPortableAgreeOnEveryLengthAndChaining) {
  std::string data;
  std::uint32_t x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 1103515245u + 12345u;
    data.push_back(static_cast<char>(x >> 16));
  }
  for (std::size_t n = 0; n <= data.size(); ++n) {
    const std::string_view d(data.data(), n);
    ASSERT_EQ(Crc32c(d), Crc32cPortable(d)) << n;
    ASSERT_EQ(Crc32c(d.substr(n / 3), Crc32c(d.substr(0, n / 3))), Crc32cPortable(d)) << n;
  }
  EXPECT_EQ(Crc32cPortable("123456789"), 0xE3069283u);
}

TEST(Crc32cTest, KnownVector) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST_F(JournalTest, CommittedRecordsReplayInOrderAcrossRestarts) {
  {
    std::unique_ptr<Journal> j;
    EXPECT_TRUE(Replay(Options(), &j).empty());
    EXPECT_EQ(j->Commit(), Journal::CommitResult::kNothing);
    j->Append(1, "accepted a");
    j->Append(2, std::string("completed\0a", 11));
    EXPECT_TRUE(j->pending());
    EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
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
  EXPECT_EQ(Segments(Options().dir).size(), 3u);  // two runs that wrote, and the active one
}

TEST_F(JournalTest, SegmentStartsWithItsHeaderAndRecordsCarryTheirLengthCheck) {
  std::string data = Slurp(WriteRun(1));
  ASSERT_EQ(data.size(), kHeader + Rec(2));
  EXPECT_EQ(data.substr(0, 8), "fleetj2\n");
}

TEST_F(JournalTest, TornLastRecordIsTruncatedAndTheRestKept) {
  std::string seg = WriteRun(3);
  std::string data = Slurp(seg);
  Spit(seg, data.substr(0, data.size() - 1));  // the power cut
  std::unique_ptr<Journal> j;
  auto seen = Replay(Options(), &j);
  EXPECT_THAT(seen, ::testing::ElementsAre(Record{1, "r0"}, Record{1, "r1"}));
  EXPECT_EQ(j->stats().torn_bytes_truncated, Rec(2) - 1);
  j.reset();
  EXPECT_EQ(Slurp(seg).size(), kHeader + 2 * Rec(2));  // cut at the end of r1, for good
  EXPECT_EQ(Replay(Options()).size(), 2u);
}

TEST_F(JournalTest, RecordHeaderCutShortIsATornTail) {
  std::string seg = WriteRun(2);
  Spit(seg, Slurp(seg) + std::string("\x05\x00\x00", 3));
  EXPECT_EQ(Replay(Options()).size(), 2u);
}

TEST_F(JournalTest, ZeroFilledTailIsATornTail) {
  std::string seg = WriteRun(2);
  Spit(seg, Slurp(seg) + std::string(4096, '\0'));
  std::unique_ptr<Journal> j;
  EXPECT_EQ(Replay(Options(), &j).size(), 2u);
  EXPECT_EQ(j->stats().torn_bytes_truncated, 4096u);
}

// Regression: the checksum left the length out, and a damaged last record
// was taken for a torn write and dropped: an acknowledged batch, lost
// without a word.
TEST_F(JournalTest, DamagedLastCompleteRecordStopsTheStartWithAClearError) {
  std::string seg = WriteRun(3);
  std::string data = Slurp(seg);
  data.back() ^= 0x40;  // in the body of r2, the last record
  Spit(seg, data);
  try {
    Replay(Options());
    FAIL() << "a damaged record was replayed or dropped";
  } catch (const JournalError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("a complete record failing its checksum"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("at offset " + std::to_string(kHeader + 2 * Rec(2))));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(seg));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--journal-recover"));
  }
  EXPECT_EQ(Slurp(seg), data) << "a refused start must not change the files";
}

TEST_F(JournalTest, DamagedLengthFieldIsNotTakenForATornTail) {
  std::string seg = WriteRun(3);
  std::string data = Slurp(seg);
  data[kHeader + 2 * Rec(2)] ^= 0x20;  // the length of r2: now runs past the end
  Spit(seg, data);
  try {
    Replay(Options());
    FAIL() << "a damaged length was taken for a torn tail";
  } catch (const JournalError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("length field is damaged"));
  }
}

TEST_F(JournalTest, CorruptionInTheMiddleRefusesToStart) {
  std::string seg = WriteRun(3);
  std::string data = Slurp(seg);
  data[kHeader + 13] ^= 0x01;  // the body of r0, with r1 and r2 after it
  Spit(seg, data);
  try {
    Replay(Options());
    FAIL() << "a corrupt journal was replayed";
  } catch (const JournalError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("failing its checksum at offset 16"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(seg));
  }
  EXPECT_EQ(Slurp(seg), data) << "a refused start must not change the files";
}

TEST_F(JournalTest, RecoverKeepsEveryIntactRecordAndSaysWhatItDropped) {
  std::string seg = WriteRun(4);
  std::string data = Slurp(seg);
  data[kHeader + Rec(2) + 13] ^= 0x01;  // the body of r1
  Spit(seg, data);
  EXPECT_THROW(Replay(Options()), JournalError);
  JournalOptions o = Options();
  o.recover = true;
  std::unique_ptr<Journal> j;
  EXPECT_THAT(Replay(o, &j),
              ::testing::ElementsAre(Record{1, "r0"}, Record{1, "r2"}, Record{1, "r3"}));
  EXPECT_EQ(j->stats().recovered_ranges, 1u);
  EXPECT_EQ(j->stats().recovered_bytes_dropped, Rec(2));
  j.reset();
  // The damaged segment was rewritten: the next start needs no flag.
  EXPECT_THAT(Replay(Options()),
              ::testing::ElementsAre(Record{1, "r0"}, Record{1, "r2"}, Record{1, "r3"}));
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
  try {
    Replay(Options());
    FAIL() << "damage in an older segment was replayed";
  } catch (const JournalError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("not the newest"));
  }
}

// Whatever happens to the bytes of a segment (a flipped byte, a cut, junk
// appended), a start either refuses with JournalError or replays records
// that were written, in order; with --journal-recover it always starts.
TEST_F(JournalTest, AnyDamageIsRefusedOrReplaysOnlyRecordsThatWereWrittenInOrder) {
  std::vector<Record> written;
  for (int i = 0; i < 20; ++i) written.emplace_back(1 + i % 3, "record " + std::to_string(i));
  {
    std::unique_ptr<Journal> j;
    Replay(Options(), &j);
    for (const auto& [type, body] : written) j->Append(static_cast<std::uint8_t>(type), body);
    j->Commit();
  }
  const std::string seg = Segments(Options().dir).front();
  const std::string clean = Slurp(seg);
  std::uint32_t rng = 12345;
  auto next = [&] { return rng = rng * 1103515245u + 12345u; };
  for (int round = 0; round < 300; ++round) {
    std::string data = clean;
    switch (next() % 3) {
      case 0: data[next() % data.size()] ^= static_cast<char>(1u << (next() % 8)); break;
      case 1: data.resize(next() % data.size()); break;
      default:
        for (int k = 0; k < 20; ++k) data.push_back(static_cast<char>(next() >> 8));
    }
    for (bool recover : {false, true}) {
      Spit(seg, data);
      for (const std::string& f : Segments(Options().dir)) {
        if (f != seg) ::unlink(f.c_str());
      }
      JournalOptions o = Options();
      o.recover = recover;
      o.sync = false;  // 600 starts
      std::vector<Record> got;
      try {
        got = Replay(o);
      } catch (const JournalError&) {
        EXPECT_FALSE(recover) << "round " << round << ": --journal-recover did not start";
        continue;
      }
      std::size_t at = 0;
      for (const Record& r : got) {
        while (at < written.size() && written[at] != r) ++at;
        ASSERT_LT(at, written.size()) << "round " << round << ": replayed a record never "
                                      << "written, or out of order: " << r.second;
        ++at;
      }
    }
  }
}

TEST_F(JournalTest, SegmentsOfTheFormatBeforeTheLengthCheckAreStillRead) {
  // u32 length | u32 CRC-32C of type+body | type | body, no segment header.
  std::string old;
  for (std::string body : {"old a", "old b"}) {
    const std::string typed = std::string(1, '\x01') + body;
    PutLe32(old, static_cast<std::uint32_t>(body.size()));
    PutLe32(old, Crc32c(typed));
    old += typed;
  }
  ::mkdir(Options().dir.c_str(), 0750);
  Spit(Options().dir + "/journal-0000000000000007.log", old);
  {
    std::unique_ptr<Journal> j;
    EXPECT_THAT(Replay(Options(), &j),
                ::testing::ElementsAre(Record{1, "old a"}, Record{1, "old b"}));
    EXPECT_EQ(j->active_segment(), 8u);
    j->Append(1, "new c");
    j->Commit();
  }
  EXPECT_EQ(Replay(Options()).size(), 3u);
}

TEST_F(JournalTest, OnlyRecordsThatMustSyncCostAnFdatasync) {
  std::unique_ptr<Journal> j;
  Replay(Options(), &j);
  j->Append(2, "finished a", /*must_sync=*/false);
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  EXPECT_EQ(j->stats().syncs, 0u);
  j->Append(2, "finished b", false);
  j->Append(1, "accepted c");  // an ack waits for this one
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  EXPECT_EQ(j->stats().syncs, 1u);
  EXPECT_EQ(j->stats().commits, 2u);
  j.reset();
  EXPECT_EQ(Replay(Options()).size(), 3u);  // written all the same
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

// A queue that drains in order keeps the journal at about one segment: a
// segment goes as soon as no batch in it is unfinished.
TEST_F(JournalTest, FinishedSegmentsAreDeletedAsTheQueueDrains) {
  JournalOptions o = WithKeys(Options());
  o.segment_bytes = 1000;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  std::deque<std::pair<std::uint64_t, std::string>> live;
  std::uint64_t most = 0;
  for (int i = 0; i < 400; ++i) {
    const std::string id = "batch-" + std::to_string(i) + std::string(50, 'x');
    j->Append(kAcc, id);
    j->AddLive(j->active_segment(), Rec(id.size()));
    live.emplace_back(j->active_segment(), id);
    if (live.size() > 5) {  // a worker finishes the oldest
      j->Append(kFin, live.front().second, false);
      j->RemoveLive(live.front().first, Rec(live.front().second.size()));
      live.pop_front();
    }
    j->Commit();
    j->Maintain(NoIds());
    most = std::max(most, j->stats().bytes_on_disk);
  }
  EXPECT_GT(j->stats().segments_deleted, 20u);
  EXPECT_LE(j->segment_count(), 3u);
  EXPECT_LT(most, 3 * o.segment_bytes) << "the journal grew with the traffic";
  EXPECT_EQ(j->stats().compactions, 0u) << "in-order draining needs no compaction";
  j.reset();
  // What is left replays the five unfinished batches (and finished ones
  // whose segment is still there, cancelled by their records).
  const std::set<std::string> unfinished = Unfinished(o);
  EXPECT_EQ(unfinished.size(), 5u);
}

// A batch that stays queued while thousands pass keeps its segment, and
// every segment after it would stay too; compaction copies what is live
// into a file of its own, on another thread, while the loop goes on
// writing (here the copy is held until the loop has done more work).
TEST_F(JournalTest, CompactionCopiesLiveBatchesOffTheLoopAndReplacesTheOldSegments) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  o.segment_bytes = 1000;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  j->Append(kAcc, "stuck");
  const std::uint64_t stuck_segment = j->active_segment();
  j->AddLive(stuck_segment, Rec(5));
  for (int i = 0; i < 60; ++i) {
    const std::string id = "done-" + std::to_string(i) + std::string(40, 'x');
    j->Append(kAcc, id);
    j->Append(kFin, id, false);
    j->Commit();
  }
  ASSERT_GE(j->segment_count(), 4u);
  const std::uint64_t before = j->stats().bytes_on_disk;
  io.HoldWrites(".compact");
  std::uint64_t upto_asked = 0;
  j->Maintain([&](std::uint64_t upto) {
    upto_asked = upto;
    return std::vector<std::string>{"stuck"};
  });
  ASSERT_TRUE(j->compacting());
  EXPECT_GE(upto_asked, stuck_segment);
  // The loop goes on while the copy waits on the disk.
  while (io.held_writers() == 0) std::this_thread::yield();
  for (int i = 0; i < 10; ++i) {
    j->Append(kAcc, "later-" + std::to_string(i));
    EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
    j->Maintain(NoIds());
  }
  EXPECT_TRUE(j->compacting());
  io.Release();
  j->WaitForCompaction();
  EXPECT_EQ(j->stats().compactions, 1u);
  EXPECT_LT(j->stats().bytes_on_disk, before);
  // The compacted segment now holds "stuck": when it finishes, it goes.
  j->Append(kFin, "stuck", false);
  j->RemoveLive(stuck_segment, Rec(5));
  j->Commit();
  j.reset();
  std::vector<std::string> accepted;
  std::set<std::string> unfinished;
  for (const auto& [type, body] : Replay(o)) {
    if (type == kAcc) accepted.push_back(body);
    if (type == kAcc) unfinished.insert(body);
    if (type == kFin) unfinished.erase(body);
  }
  ASSERT_FALSE(accepted.empty());
  EXPECT_EQ(accepted.front(), "stuck");
  // Only the finished batches of the segment that was active then remain.
  EXPECT_LT(std::count_if(accepted.begin(), accepted.end(),
                          [](const std::string& s) { return s.rfind("done-", 0) == 0; }),
            20)
      << "finished batches were copied";
  EXPECT_EQ(unfinished.size(), 10u);
  EXPECT_EQ(unfinished.count("stuck"), 0u);
}

// A crash after the compacted file took the place of the last segment but
// before the older ones were removed: they are stale, and replaying them
// would bring back batches that finished.
TEST_F(JournalTest, SegmentsACompactionReplacedAreNotReplayedAfterACrash) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  o.segment_bytes = 500;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  FillAroundAStuckBatch(*j);
  const std::size_t files = Segments(o.dir).size();
  io.FailRemovals(".log");  // the "crash": the old segments stay
  j->Maintain([](std::uint64_t) { return std::vector<std::string>{"stuck"}; });
  j->WaitForCompaction();
  EXPECT_EQ(j->stats().compaction_failures, 1u);
  // Review: while they are there, the compacted file (whose header tells a
  // start to skip them) must not go, even once its batch finished.
  j->Append(kFin, "stuck", false);
  j->RemoveLive(1, Rec(5));
  j->Commit();
  j->Maintain(NoIds());
  EXPECT_EQ(Segments(o.dir).size(), files) << "something was deleted past the leftovers";
  io.FailRemovals("");
  j->Maintain(NoIds());
  EXPECT_LT(Segments(o.dir).size(), files) << "the leftovers were not retried";
  j.reset();
  const std::set<std::string> unfinished = Unfinished(o);
  EXPECT_TRUE(unfinished.empty()) << "finished batches came back";
}

// The same crash, and a start right after it: the replaced segments are
// skipped (and removed), not replayed.
TEST_F(JournalTest, AStartSkipsTheSegmentsACompactionReplaced) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  o.segment_bytes = 500;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  FillAroundAStuckBatch(*j);
  const std::size_t files = Segments(o.dir).size();
  io.FailRemovals(".log");
  j->Maintain([](std::uint64_t) { return std::vector<std::string>{"stuck"}; });
  j->WaitForCompaction();
  j.reset();
  io.FailRemovals("");
  EXPECT_EQ(Segments(o.dir).size(), files);
  const std::set<std::string> unfinished = Unfinished(o);
  EXPECT_EQ(unfinished, std::set<std::string>{"stuck"}) << "finished batches came back";
  EXPECT_LT(Segments(o.dir).size(), files) << "the replaced segments were not removed";
}

TEST_F(JournalTest, FullDiskRefusesTheTurnLeavesNothingHalfWrittenAndResumesWithSpace) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  o.segment_bytes = 4096;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  j->Append(kAcc, "a");
  j->AddLive(j->active_segment(), Rec(1));
  ASSERT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  io.SetFree(20);  // less than the next turn
  j->Append(kFin, "a", false);
  j->RemoveLive(j->active_segment(), Rec(1));
  j->Append(kAcc, std::string(100, 'b'));
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kRefused);
  EXPECT_EQ(j->state(), JournalState::kNoSpace);
  EXPECT_FALSE(j->accepting());
  EXPECT_THAT(j->problem(), ::testing::HasSubstr("No space left on device"));
  EXPECT_EQ(j->stats().unavailable_episodes, 1u);
  // Refused at once while the disk is full; the finished record waits.
  j->Append(kAcc, "c");
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kRefused);
  EXPECT_FALSE(j->Maintain(NoIds()));
  EXPECT_EQ(j->stats().unavailable_episodes, 1u) << "one episode, logged once";
  io.SetFree(1u << 20);
  EXPECT_TRUE(j->Maintain(NoIds()));
  EXPECT_TRUE(j->accepting());
  j->Append(kAcc, "d");
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  j.reset();
  // "a" finished (its record was written once space came back), "b" and
  // "c" were refused, "d" is in.
  const std::set<std::string> unfinished = Unfinished(o);
  EXPECT_EQ(unfinished, (std::set<std::string>{"d"}));
}

// On a full disk a segment whose batches have all finished is the only
// space there is: the journal leaves it and deletes it.
TEST_F(JournalTest, FullDiskFreesTheSegmentWhoseBatchesFinished) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  o.segment_bytes = 256u << 10;  // larger than the disk
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  io.SetFree(205000);
  const std::string payload(10000, 'p');
  std::vector<std::pair<std::uint64_t, std::string>> live;
  for (int i = 0;; ++i) {
    const std::string id = "b" + std::to_string(i);
    j->Append(kAcc, id + ":" + payload);
    j->AddLive(j->active_segment(), Rec(id.size() + 1 + payload.size()));
    live.emplace_back(j->active_segment(), id);
    if (j->Commit() == Journal::CommitResult::kRefused) {
      j->RemoveLive(live.back().first, Rec(id.size() + 1 + payload.size()));
      live.pop_back();
      break;
    }
    ASSERT_LT(i, 100);
  }
  ASSERT_FALSE(j->accepting());
  ASSERT_EQ(live.size(), 20u);
  EXPECT_FALSE(j->Maintain(NoIds())) << "nothing finished: still full";
  for (const auto& [segment, id] : live) {
    j->Append(kFin, id, false);
    j->RemoveLive(segment, Rec(id.size() + 1 + payload.size()));
  }
  j->Commit();
  EXPECT_TRUE(j->Maintain(NoIds())) << j->problem();
  EXPECT_GE(*io.free(), 200000u);
  EXPECT_EQ(j->stats().segments_deleted, 1u);
}

// Regression: a burst larger than the free space was accepted whole in
// memory, failed whole at the write, was refused whole and sent again whole:
// no batch ever got in. Now what fits is accepted and the rest refused.
TEST_F(JournalTest, AdmitsWhatFitsAndRefusesTheRestBeforeAnyWriteFails) {
  FaultyJournalIo io;
  io.SetFree(300000);
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  const std::string big(100000, 'x');
  int admitted = 0;
  for (int i = 0; i < 5; ++i) {
    if (!j->Admit(Rec(big.size()))) break;
    j->Append(kAcc, big);
    j->AddLive(j->active_segment(), Rec(big.size()));
    ++admitted;
  }
  EXPECT_EQ(admitted, 2);
  EXPECT_EQ(j->state(), JournalState::kNoSpace);
  EXPECT_FALSE(j->Admit(10)) << "refusing until space returns";
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten) << "what was admitted is written";
  EXPECT_FALSE(j->Maintain(NoIds()));
  io.SetFree(2u << 20);  // resume_free_bytes() is 1 MiB with 64 MiB segments
  EXPECT_TRUE(j->Maintain(NoIds()));
  EXPECT_TRUE(j->Admit(Rec(big.size())));
  j.reset();
  EXPECT_EQ(Replay(o).size(), 2u);
}

// Review: one batch larger than the room left turned the journal
// unavailable for every producer until that much was free.
TEST_F(JournalTest, ABatchLargerThanTheRoomLeftIsRefusedAloneWhileSmallOnesGetIn) {
  FaultyJournalIo io;
  io.SetFree(3u << 20);  // resume_free_bytes() is 1 MiB with 64 MiB segments
  JournalOptions o = Options();
  o.io = &io;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  EXPECT_FALSE(j->Admit(4u << 20));
  EXPECT_TRUE(j->accepting());
  EXPECT_EQ(j->stats().large_refused, 1u);
  EXPECT_TRUE(j->Admit(10000));
}

TEST_F(JournalTest, FailedSyncRefusesTheTurnAndTheNextWriteRecovers) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  io.FailSyncs(1);
  j->Append(kAcc, "a");
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kRefused);
  EXPECT_EQ(j->state(), JournalState::kFailed);
  EXPECT_THAT(j->problem(), ::testing::HasSubstr("EIO"));
  EXPECT_TRUE(j->Maintain(NoIds()));
  j->Append(kAcc, "b");
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  j.reset();
  // "a" was cut off the file with its failed sync: it was never acknowledged.
  EXPECT_THAT(Replay(o), ::testing::ElementsAre(Record{kAcc, "b"}));
}

TEST_F(JournalTest, OpensOnAFullDiskAndServesWhatItHolds) {
  WriteRun(3);
  FaultyJournalIo io;
  io.SetFree(0);
  JournalOptions o = Options();
  o.io = &io;
  std::unique_ptr<Journal> j;
  EXPECT_EQ(Replay(o, &j).size(), 3u);
  j->Append(kFin, "r0", false);
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kNothing);
  EXPECT_EQ(j->state(), JournalState::kNoSpace);
  EXPECT_TRUE(j->pending()) << "the finished record waits for space";
}

TEST(JournalPacerTest, SyncsStartOnePerIntervalAndRecordsWithoutSyncNeverHoldThemBack) {
  using std::chrono::milliseconds;
  const TimePoint t0 = TimePoint() + std::chrono::hours(1);
  JournalPacer p(milliseconds(2));
  EXPECT_LE(p.Due(true), t0) << "the first write starts at once";
  p.Started(t0, /*had_sync_records=*/true);
  EXPECT_EQ(p.Due(true), t0 + milliseconds(2)) << "the next sync waits out the interval";
  EXPECT_EQ(p.Due(false), t0 + milliseconds(2));
  // Finished and dispatched records written on their own at 2 ms...
  p.Started(t0 + milliseconds(2), /*had_sync_records=*/false);
  EXPECT_EQ(p.Due(false), t0 + milliseconds(4));
  // ...do not push back a new batch's sync: due since 2 ms.
  EXPECT_EQ(p.Due(true), t0 + milliseconds(2));
  p.Started(t0 + milliseconds(3), true);
  EXPECT_EQ(p.Due(true), t0 + milliseconds(5));
  EXPECT_EQ(p.Due(false), t0 + milliseconds(5));
  // After a quiet spell, at once.
  EXPECT_LE(p.Due(true), t0 + milliseconds(100));
  JournalPacer none(Duration::zero());
  none.Started(t0, true);
  EXPECT_EQ(none.Due(true), t0) << "0: as soon as the last one is done";
}

// The writer thread's side of the journal (StartWrite / wake_fd / FinishWrite).
bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

void WaitForHeldWriter(FaultyJournalIo& io) {
  while (io.held_writers() == 0) std::this_thread::yield();
}

// One write off the loop, from StartWrite to FinishWrite.
Journal::CommitResult WriteOffTheLoop(Journal& j) {
  EXPECT_EQ(j.StartWrite(), Journal::StartResult::kStarted);
  return j.FinishWrite();
}

TEST_F(JournalTest, WriteOffTheLoopCarriesWhatCameBeforeItAndTheNextTakesTheRest) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  const int fd = j->wake_fd();
  EXPECT_FALSE(Readable(fd, 0));
  io.HoldWrites(".log");
  j->Append(kAcc, "a");
  ASSERT_EQ(j->StartWrite(), Journal::StartResult::kStarted);
  EXPECT_TRUE(j->writing());
  WaitForHeldWriter(io);
  // The loop goes on: what it appends now waits for the next write, and the
  // disk check counts the bytes that are out.
  j->Append(kAcc, "b");
  j->Append(kFin, "a", false);
  EXPECT_EQ(j->StartWrite(), Journal::StartResult::kNothing) << "one write at a time";
  EXPECT_FALSE(Readable(fd, 0));
  io.Release();
  ASSERT_TRUE(Readable(fd, 10000));
  EXPECT_EQ(j->FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_FALSE(j->writing());
  EXPECT_FALSE(Readable(fd, 0)) << "the wake-up is consumed";
  EXPECT_EQ(j->stats().syncs, 1u);
  EXPECT_TRUE(j->pending());
  ASSERT_EQ(j->StartWrite(), Journal::StartResult::kStarted);
  EXPECT_EQ(j->FinishWrite(), Journal::CommitResult::kWritten);  // waits for it
  EXPECT_EQ(j->stats().syncs, 2u);
  EXPECT_EQ(j->stats().commits, 2u);
  EXPECT_FALSE(j->pending());
  EXPECT_EQ(j->StartWrite(), Journal::StartResult::kNothing);
  j.reset();
  // In each write the records that need no sync come first: "a" finished
  // (its record from the second write) before "b", accepted in it.
  EXPECT_THAT(Replay(o), ::testing::ElementsAre(Record{kAcc, "a"}, Record{kFin, "a"},
                                                Record{kAcc, "b"}));
}

// An id finished, lost its retained result and was sent again before the
// next write: the new batch must come back after a restart.
TEST_F(JournalTest, WriteOffTheLoopPutsAFinishedRecordBeforeTheSameIdAcceptedAgain) {
  JournalOptions o = WithKeys(Options());
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  j->Append(kAcc, "x");
  EXPECT_EQ(WriteOffTheLoop(*j), Journal::CommitResult::kWritten);
  j->Append(kFin, "x", false);  // it ran
  j->Append(kAcc, "x");         // and came again
  EXPECT_EQ(WriteOffTheLoop(*j), Journal::CommitResult::kWritten);
  j->Append(kFin, "last", false);
  j.reset();  // the destructor's write keeps the same order
  EXPECT_EQ(Unfinished(o), std::set<std::string>{"x"});
}

TEST_F(JournalTest, FailedWriteOffTheLoopDropsItsMustSyncRecordsAndKeepsTheOthers) {
  FaultyJournalIo io;
  JournalOptions o = WithKeys(Options());
  o.io = &io;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  io.FailSyncs(1);
  j->Append(kFin, "old", false);
  j->Append(kAcc, "a");
  ASSERT_EQ(j->StartWrite(), Journal::StartResult::kStarted);
  j->Append(kFin, "newer", false);  // while the write is out
  EXPECT_EQ(j->FinishWrite(), Journal::CommitResult::kRefused);
  EXPECT_EQ(j->state(), JournalState::kFailed);
  EXPECT_EQ(j->stats().refused_commits, 1u);
  EXPECT_FALSE(j->Admit(100)) << "no new batch while it cannot write";
  // Records that need no sync are kept, in their order, and written by the
  // retry that makes the journal accept again.
  EXPECT_TRUE(j->Maintain(NoIds()));
  j->Append(kAcc, "b");
  EXPECT_EQ(WriteOffTheLoop(*j), Journal::CommitResult::kWritten);
  j.reset();
  EXPECT_THAT(Replay(o), ::testing::ElementsAre(Record{kFin, "old"}, Record{kFin, "newer"},
                                                Record{kAcc, "b"}));
}

// Items appended one after the other share one record, which keeps their
// place among the other records that need no sync.
TEST_F(JournalTest, ItemsAppendedInARowShareOneRecordInTheirPlace) {
  std::unique_ptr<Journal> j;
  Replay(Options(), &j);
  j->Append(kAcc, "a");
  j->AppendItem(kItems, "a");
  j->AppendItem(kItems, "bb");
  j->Append(kAcc, "c");  // must sync: another buffer, the items record stays open
  j->AppendItem(kItems, std::string("\0d", 2));
  j->Append(3, "x", false);  // closes it
  j->AppendItem(kItems, "e");
  EXPECT_EQ(j->stats().records_appended, 5u);
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  j->AppendItem(kItems, "f");  // the write closed the last one
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  EXPECT_EQ(j->stats().records_appended, 6u);
  j.reset();
  const std::vector<Record> r = Replay(Options());
  ASSERT_EQ(r.size(), 6u);
  EXPECT_EQ(r[0], (Record{kAcc, "a"}));
  EXPECT_EQ(r[1], (Record{kAcc, "c"}));
  EXPECT_EQ(r[2].first, kItems);
  EXPECT_THAT(Items(r[2].second), ::testing::ElementsAre("a", "bb", std::string("\0d", 2)));
  EXPECT_EQ(r[3], (Record{3, "x"}));
  EXPECT_EQ(r[4].first, kItems);
  EXPECT_THAT(Items(r[4].second), ::testing::ElementsAre("e"));
  EXPECT_EQ(r[5].first, kItems);
  EXPECT_THAT(Items(r[5].second), ::testing::ElementsAre("f"));
}

TEST_F(JournalTest, AWriteOffTheLoopClosesTheItemsRecordAndSoDoesItsSize) {
  std::unique_ptr<Journal> j;
  Replay(Options(), &j);
  j->AppendItem(kItems, "d");
  ASSERT_EQ(j->StartWrite(), Journal::StartResult::kStarted);
  j->AppendItem(kItems, "e");  // while the write is out: the next record
  EXPECT_EQ(j->FinishWrite(), Journal::CommitResult::kWritten);
  const std::string big((600u << 10), 'y');
  j->AppendItem(kItems, big);
  j->AppendItem(kItems, big);  // past kMaxItemsBytes together: a record each
  EXPECT_EQ(WriteOffTheLoop(*j), Journal::CommitResult::kWritten);
  EXPECT_EQ(j->stats().records_appended, 3u);
  EXPECT_THROW(j->AppendItem(kItems, std::string(Journal::kMaxItemsBytes - 3, 'z')),
               JournalError);
  EXPECT_EQ(j->stats().records_appended, 3u) << "nothing appended";
  EXPECT_FALSE(j->pending());
  j.reset();
  const std::vector<Record> r = Replay(Options());
  ASSERT_EQ(r.size(), 3u);
  EXPECT_THAT(Items(r[0].second), ::testing::ElementsAre("d"))
      << "the open record went with the write";
  // What came meanwhile opened the next record, and the first big item
  // joined it; the second did not fit.
  const std::vector<std::string> second = Items(r[1].second);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0], "e");
  EXPECT_TRUE(second[1] == big);
  const std::vector<std::string> third = Items(r[2].second);
  ASSERT_EQ(third.size(), 1u);
  EXPECT_TRUE(third[0] == big);
}

TEST_F(JournalTest, AnItemOfAnotherTypeStartsARecordAndTheLargestItemFitsAlone) {
  std::unique_ptr<Journal> j;
  Replay(Options(), &j);
  j->AppendItem(kItems, "a");
  j->AppendItem(5, "b");
  j->AppendItem(kItems, "c");
  const std::string largest(Journal::kMaxItemsBytes - 4, 'L');
  j->AppendItem(kItems, largest);
  EXPECT_EQ(j->stats().records_appended, 4u);
  EXPECT_EQ(j->Commit(), Journal::CommitResult::kWritten);
  j.reset();
  const std::vector<Record> r = Replay(Options());
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].first, kItems);
  EXPECT_THAT(Items(r[0].second), ::testing::ElementsAre("a"));
  EXPECT_EQ(r[1].first, 5);
  EXPECT_THAT(Items(r[1].second), ::testing::ElementsAre("b"));
  EXPECT_THAT(Items(r[2].second), ::testing::ElementsAre("c"));
  EXPECT_EQ(r[3].second.size(), Journal::kMaxItemsBytes);
  const std::vector<std::string> last = Items(r[3].second);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_TRUE(last[0] == largest);
}

// A write that fails gives its records that need no sync back, ahead of
// those appended since: a record of items open meanwhile is completed
// where it was, and the next item starts a new one.
TEST_F(JournalTest, FailedWriteOffTheLoopKeepsARecordOfItemsOpenMeanwhileWhole) {
  FaultyJournalIo io;
  JournalOptions o = Options();
  o.io = &io;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  io.FailSyncs(1);
  j->AppendItem(kItems, "old");
  j->Append(kAcc, "a");
  ASSERT_EQ(j->StartWrite(), Journal::StartResult::kStarted);
  j->AppendItem(kItems, "newer");  // while the write is out
  j->AppendItem(kItems, "newest");
  EXPECT_EQ(j->FinishWrite(), Journal::CommitResult::kRefused);
  j->AppendItem(kItems, "after");
  EXPECT_TRUE(j->Maintain(NoIds()));
  j->Append(kAcc, "b");
  EXPECT_EQ(WriteOffTheLoop(*j), Journal::CommitResult::kWritten);
  j.reset();
  const std::vector<Record> r = Replay(o);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_THAT(Items(r[0].second), ::testing::ElementsAre("old"));
  EXPECT_THAT(Items(r[1].second), ::testing::ElementsAre("newer", "newest"));
  EXPECT_THAT(Items(r[2].second), ::testing::ElementsAre("after"));
  EXPECT_EQ(r[3], (Record{kAcc, "b"}));
}

TEST(JournalItemsTest, ForEachItemReadsUpToWhatRunsPastTheEnd) {
  std::vector<std::string> seen;
  auto collect = [&](std::string_view i) { seen.emplace_back(i); };
  EXPECT_TRUE(Journal::ForEachItem("", collect));
  EXPECT_TRUE(seen.empty());
  EXPECT_TRUE(Journal::ForEachItem(std::string("\0\0\0\0", 4), collect));
  EXPECT_THAT(seen, ::testing::ElementsAre(""));
  seen.clear();
  EXPECT_FALSE(Journal::ForEachItem(std::string("\1\0\0\0a\2\0\0\0b", 10), collect));
  EXPECT_THAT(seen, ::testing::ElementsAre("a"));
  EXPECT_FALSE(Journal::ForEachItem(std::string("\1\0\0", 3), collect));
}

// Compaction keeps the items of live batches (here an id that finished and
// was accepted again), in a record of their own, and drops a record of
// items none of which is live.
TEST_F(JournalTest, CompactionKeepsOnlyTheItemsOfLiveBatches) {
  JournalOptions o = WithKeys(Options());
  o.segment_bytes = 1000;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  j->Append(kAcc, "again");
  j->Append(kAcc, "gone1");
  j->Append(kAcc, "gone2");
  j->AppendItem(kItems, "other");
  j->AppendItem(kItems, "again");
  j->AppendItem(kItems, "more");
  j->Commit();
  j->AppendItem(kItems, "gone1");
  j->AppendItem(kItems, "gone2");
  j->Append(kAcc, "again");
  j->AddLive(j->active_segment(), Rec(5));
  j->Commit();
  for (int i = 0; i < 40; ++i) {
    const std::string id = "done-" + std::to_string(i) + std::string(40, 'x');
    j->Append(kAcc, id);
    j->AppendItem(kItems, id);
    j->Commit();
  }
  ASSERT_GE(j->segment_count(), 4u);
  j->Maintain([](std::uint64_t) { return std::vector<std::string>{"again"}; });
  ASSERT_TRUE(j->compacting());
  j->WaitForCompaction();
  EXPECT_EQ(j->stats().compactions, 1u);
  j.reset();
  std::vector<Record> kept;
  for (const Record& r : Replay(o)) {
    if (r.second.find("done-") == std::string::npos) kept.push_back(r);
  }
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0], (Record{kAcc, "again"}));
  EXPECT_EQ(kept[1].first, kItems);
  EXPECT_THAT(Items(kept[1].second), ::testing::ElementsAre("again"));
  EXPECT_EQ(kept[2], (Record{kAcc, "again"}));
  EXPECT_EQ(Unfinished(o), (std::set<std::string>{"again"}));
}

TEST_F(JournalTest, WriteOffTheLoopGoesToTheActiveSegmentAndTheNextOneStartsAfterIt) {
  JournalOptions o = WithKeys(Options());
  o.segment_bytes = 256;
  std::unique_ptr<Journal> j;
  Replay(o, &j);
  const std::uint64_t first = j->active_segment();
  j->Append(kAcc, std::string(300, 'a'));
  ASSERT_EQ(j->StartWrite(), Journal::StartResult::kStarted);
  EXPECT_EQ(j->active_segment(), first) << "the segment the write goes to, while it is out";
  j->Append(kAcc, "b");
  EXPECT_EQ(j->FinishWrite(), Journal::CommitResult::kWritten);
  EXPECT_EQ(j->active_segment(), first + 1) << "past segment_bytes: a new one";
  EXPECT_EQ(WriteOffTheLoop(*j), Journal::CommitResult::kWritten);
  j.reset();
  std::vector<std::pair<std::uint64_t, std::string>> seen;
  Journal::Open(o, [&](std::uint64_t segment, std::uint8_t, std::string_view body) {
    seen.emplace_back(segment, std::string(body.substr(0, 1)));
  });
  EXPECT_THAT(seen, ::testing::ElementsAre(std::pair<std::uint64_t, std::string>{first, "a"},
                                           std::pair<std::uint64_t, std::string>{first + 1, "b"}));
}

}  // namespace
}  // namespace fleet::broker

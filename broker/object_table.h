// ObjectTable: the object requests (docs/protocol.md section 5a) the broker
// has passed on to producers and not yet answered. The broker stores no
// object: an entry is who asked (a worker's connection and tag), whom it
// asked (the batch's owner), and until when it waits.
//
// Pure state: callers pass `now`. Not thread-safe; the broker loop owns it.
// Bounded: kMaxPerSlot entries per slot of a worker, kMaxTotal in all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/string_map.h"

namespace fleet::broker {

struct PendingObject {
  std::string worker;    // routing id of the asking worker's connection
  std::string owner;     // routing id of the producer asked
  std::string batch_id;  // for error texts
  std::uint64_t tag = 0;      // the worker's, echoed in OBJECT_DATA
  std::uint64_t offset = 0;   // of the request, echoed too
  std::uint32_t length = 0;   // asked for (after shortening)
  TimePoint deadline;
};

class ObjectTable {
 public:
  static constexpr std::size_t kMaxPerSlot = 16;
  static constexpr std::size_t kMaxTotal = 1024;

  // True when `worker`, which runs `slots` batches at once, may have one
  // more request pending: kMaxPerSlot per slot (one handler each), and
  // kMaxTotal in all.
  bool HasRoom(std::string_view worker, std::uint32_t slots) const;
  // Records a request; returns its token (never 0, never reused).
  // Requires: HasRoom(p.worker, its slots).
  std::uint64_t Add(PendingObject p);
  // Takes the entry of `token` out, if there is one.
  bool Take(std::uint64_t token, PendingObject* out);
  // Puts back an entry Take took out, under the same token.
  void Restore(std::uint64_t token, PendingObject p);
  // Takes out every entry past its deadline.
  std::vector<PendingObject> TakeExpired(TimePoint now);
  // Takes out every entry asked of `owner`.
  std::vector<PendingObject> TakeOwnedBy(std::string_view owner);
  // Takes out every entry of the worker connection `worker` (its worker
  // was removed). Their late replies are dropped as unknown tokens.
  std::vector<PendingObject> TakeWorker(std::string_view worker);

  std::size_t size() const { return by_token_.size(); }

 private:
  template <typename Pred>
  std::vector<PendingObject> TakeIf(Pred pred);
  void Uncount(const std::string& worker);

  std::unordered_map<std::uint64_t, PendingObject> by_token_;
  StringMap<std::size_t> per_worker_;
  std::uint64_t next_token_ = 1;
};

}  // namespace fleet::broker

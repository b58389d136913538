// JournalPacer: when the broker's next journal write may start
// (--journal-sync-interval-ms). A write with a must-sync record starts at
// least `interval` after the last such write started; a write of only
// records that need no sync at least `interval` after the last write of
// any kind, so it never holds a new batch's sync back. A write that comes
// after a quiet spell starts at once.
//
// Pure state: callers pass `now`. Not thread-safe; the broker loop owns it.
#pragma once

#include "common/clock.h"

namespace fleet::broker {

class JournalPacer {
 public:
  explicit JournalPacer(Duration interval) : interval_(interval) {}

  // The earliest time the next write may start (<= now: at once).
  TimePoint Due(bool has_sync_records) const {
    return (has_sync_records ? last_sync_ : last_write_) + interval_;
  }
  // A write started at `now`.
  void Started(TimePoint now, bool had_sync_records) {
    last_write_ = now;
    if (had_sync_records) last_sync_ = now;
  }

 private:
  Duration interval_;
  // The first write is due at once, whatever the clock's epoch.
  TimePoint last_write_ = TimePoint::min();
  TimePoint last_sync_ = TimePoint::min();
};

}  // namespace fleet::broker

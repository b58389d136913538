// MetricsReader: runs a MetricsSource's reads on a thread of its own, so the
// autoscaler's loop never waits for a slow broker page or Prometheus server.
// The loop starts a read, goes on polling (its own timers, the broker's
// wait-demand answers), and takes the result when the thread is done: fd()
// turns readable, and the loop polls it with its sockets.
//
// The deadline (--metrics-timeout) is kept twice. The source stops its own
// HTTP at it (real time, one deadline for all of a read's queries), which
// frees the thread for the next read; and Take(now) reports a read still
// running `timeout` after Start(now) as timed out, on the loop's clock, so a
// source that overruns its deadline cannot hold a decision either. A read
// reported that way is abandoned: its answer, whenever it comes, is dropped,
// so a timed-out read changes nothing. One read runs at a time.
//
// Owns its thread and an eventfd; borrows the source, which only the
// thread calls (Describe() aside) while the reader lives. The public
// methods are for one thread, the loop's; the thread and the loop share
// only a mutex-guarded request flag and result slot. Rejected: an inproc
// socket pair for the hand-over (the style of the worker's slots): it
// needs the loop's ZeroMQ context here and a serialised Observation, for a
// value that never leaves the process; an eventfd wakes zmq::poll as well.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "autoscaler/metrics_source.h"
#include "common/clock.h"

namespace fleet::autoscaler {

class MetricsReader {
 public:
  // Starts the thread. `timeout`: a read not done this long after Start is
  // reported timed out (50 ms .. 60 s in practice). Throws
  // std::system_error when the eventfd or the thread cannot be made.
  MetricsReader(MetricsSource& source, Duration timeout);
  // Waits for a read in progress (the source's own deadline bounds it),
  // then stops the thread.
  ~MetricsReader();
  MetricsReader(const MetricsReader&) = delete;
  MetricsReader& operator=(const MetricsReader&) = delete;

  // Starts a read at `now`. False (nothing started) while one is running,
  // an abandoned one included.
  bool Start(TimePoint now);
  // Never blocks. A finished read not taken yet; else, once per read, a
  // timed-out result (fresh false, timed_out true) for a read still running
  // at `now` past its deadline; else nothing.
  std::optional<MetricsRead> Take(TimePoint now);
  bool running() const { return running_; }
  // When Take(now) will report the running read timed out; TimePoint::max()
  // when no read is running or it was reported already.
  TimePoint deadline() const;
  // When the running read started (meaningful while running()).
  TimePoint started() const { return started_; }
  // Readable while a finished read waits to be taken.
  int fd() const { return event_fd_; }
  Duration timeout() const { return timeout_; }

 private:
  void Run();

  MetricsSource& source_;
  const Duration timeout_;
  int event_fd_ = -1;
  // The loop's side.
  bool running_ = false;
  bool abandoned_ = false;
  TimePoint started_{};
  // Shared with the thread.
  std::mutex mu_;
  std::condition_variable cv_;
  bool requested_ = false;
  bool stop_ = false;
  std::optional<MetricsRead> done_;
  std::thread thread_;  // last: starts after everything it uses
};

}  // namespace fleet::autoscaler

// BrokerCore: the broker's whole state machine without sockets. It takes
// decoded messages with the routing id of their sender and `now`, and fills
// an Outbox with what must be sent; BrokerServer owns the sockets, decodes,
// calls in, and flushes the Outbox once per loop turn. Everything bound for
// one peer in a turn leaves in one message (coalescing), so a busy broker
// sends fewer, larger messages and an idle one adds no delay.
//
// Guarantees kept here: a worker never holds more batches than the credit
// it granted; a retiring worker gets nothing new; a batch is run until some
// worker reports it or it has been dispatched max_attempts times; the
// producer gets one result per batch id (first result wins, later ones are
// counted as duplicates).
//
// Not thread-safe: the broker loop is its only caller.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "broker/batch_store.h"
#include "broker/blacklist.h"
#include "broker/broker_options.h"
#include "broker/counters.h"
#include "broker/journal.h"
#include "broker/object_table.h"
#include "broker/result_store.h"
#include "broker/worker_registry.h"
#include "common/histogram.h"
#include "common/protocol.h"
#include "common/string_map.h"

namespace fleet::broker {

enum class Socket { kFrontend, kBackend, kControl };
const char* SocketName(Socket s);

// What the loop must send after a turn. Producer messages are grouped per
// routing id; dispatches live in Worker::outgoing.
struct Outbox {
  struct OwnedRejection {
    std::string id;
    proto::ErrorCode code;
    std::string message;
  };
  struct ProducerOut {
    std::vector<std::string> accepted;
    std::vector<OwnedRejection> rejected;
    // Results to send, in the ResultStore, which keeps them until the
    // server's AfterFlush.
    std::vector<std::pair<std::string, const StoredResult*>> results;
    std::vector<std::string> unknown;  // fetched ids the broker does not know
  };
  struct Frame {
    Socket socket;
    std::string identity;
    std::string body;  // encoded message
  };

  Outbox() = default;
  Outbox(const Outbox&) = delete;  // For's cache points into `producers`
  Outbox& operator=(const Outbox&) = delete;

  StringMap<ProducerOut> producers;  // added to through For, emptied by clear
  std::vector<std::string> dispatch_workers;  // ids with outgoing batches
  std::vector<Frame> frames;                  // everything else, in order

  // The part for the producer `identity`, added if new. Calls for one
  // producer in a row (its acks after a journal write, its results in a
  // DONE) find it without hashing the identity again.
  ProducerOut& For(std::string_view identity) {
    if (last_ != nullptr && last_identity_ == identity) return *last_;
    auto it = producers.find(identity);
    if (it == producers.end()) it = producers.emplace(std::string(identity), ProducerOut{}).first;
    last_identity_ = it->first;  // the map's nodes stay put until clear
    last_ = &it->second;
    return *last_;
  }
  bool empty() const {
    return producers.empty() && dispatch_workers.empty() && frames.empty();
  }
  void clear() {
    producers.clear();
    last_ = nullptr;
    dispatch_workers.clear();
    frames.clear();
  }

 private:
  std::string_view last_identity_;  // of the last For; a key in `producers`
  ProducerOut* last_ = nullptr;
};

class BrokerCore {
 public:
  // A HELLO for an id registered on another connection replaces that
  // registration once the old connection has been silent this many
  // heartbeat intervals (a live worker is heard from every interval).
  static constexpr int kDuplicateSilence = 2;

  explicit BrokerCore(const BrokerOptions& options);

  // A decoded message from `identity` on `socket`.
  void OnMessage(Socket socket, std::string_view identity,
                 const proto::Message& message, TimePoint now);
  // A frame that did not decode (or had the wrong frame count): counted and
  // answered with ERROR; on the control socket, with a CONTROL_REPLY
  // carrying the code when the frame's request id could be read.
  void OnBadInput(Socket socket, std::string_view identity,
                  proto::ErrorCode code, std::string_view detail,
                  std::optional<std::uint64_t> request_id = std::nullopt);

  // Hands queued batches to workers with credit, within their credit, by
  // the dispatch rule (broker/dispatch_rule.cc: most recently busy worker
  // with a free slot first, prefetch credit last and spread).
  void Pump(TimePoint now);
  // Periodic housekeeping: heartbeats to workers, dead workers (their
  // batches requeued), blacklist.
  void Tick(TimePoint now);
  // After the outbox was sent and cleared: drops retained results past
  // their retention or --max-retained-results (the outbox's result
  // pointers are not valid after this).
  void AfterFlush(TimePoint now);

  // The loop could not send all of the dispatch in Worker::outgoing of
  // `worker_id` (peer gone or its queue full): the first `sent` batches
  // went out in messages that may have reached the worker and keep their
  // attempt; the rest go back to their queue with theirs given back. The
  // worker is dropped (it will re-register if it is alive) and everything
  // it held is requeued.
  void OnDispatchFailed(std::string_view worker_id, std::size_t sent, TimePoint now);
  // A message to `identity` on `socket` could not be sent (the peer is gone,
  // or its queue is full). Counted as undeliverable; a worker it was for is
  // declared dead (counted as such) and what it held requeued (it
  // registers again if it is alive).
  void OnUndeliverable(Socket socket, std::string_view identity, TimePoint now);

  // Durable mode: every accepted batch and every finished one is appended
  // to `journal` (the loop commits it before it flushes the Outbox, so no
  // producer hears "accepted" before the batch is on disk), and the journal
  // is told which segment holds each unfinished batch. While the journal
  // cannot be written, new batches are refused with disk_full; everything
  // else goes on. Null: in memory.
  //
  // `off_loop`: the loop commits with Journal::StartWrite/FinishWrite
  // (SealCommit when a write starts, AfterCommit when it is done) and goes
  // on meanwhile. New batches then wait outside their queues, and their
  // "accepted" in the core, until AfterCommit says their write is on disk;
  // a re-sent id of such a batch is answered with it.
  void SetJournal(Journal* journal, bool off_loop = false) {
    journal_ = journal;
    off_loop_ = off_loop;
  }
  const Journal* journal() const { return journal_; }
  // Off-loop commit: a journal write holding every record appended so far
  // has started; the batches accepted since the last one are in it.
  void SealCommit();
  // Off-loop commit: appends the dispatched records that wait for the next
  // write (NoteAttempts); the loop calls it just before StartWrite.
  void AppendDueRecords();
  bool has_due_records() const { return !attempts_due_.empty(); }
  // Off-loop commit: what Journal::StartWrite answered. kStarted seals the
  // write's batches; kRefused refuses them at once (disk_full).
  void AfterStartWrite(Journal::StartResult result, TimePoint now);
  // Replay of one journal record (from `segment`) at start, before
  // SetJournal. Throws JournalError on a record it cannot read.
  void Restore(std::uint64_t segment, std::uint8_t type, std::string_view body, TimePoint now);
  // After the replay and SetJournal: tells the journal where the restored
  // batches are, and dead-letters every batch whose attempts the replay
  // found used up (it was on its last when the broker stopped). Returns how
  // many were dead-lettered.
  std::size_t FinishRestore(TimePoint now);
  // The loop committed the journal with `result` (off the loop: the write
  // of the last SealCommit is done). kRefused: the batches accepted since
  // the last commit (in the sealed write) are not on disk; they are taken
  // back (from the queue, or from the worker they were assigned to but not
  // yet sent to) and refused with disk_full, so their producers send them
  // again. Otherwise, off the loop, they join their queues and their
  // producers are told "accepted".
  void AfterCommit(Journal::CommitResult result, TimePoint now);
  // Ids of the unfinished batches accepted in journal segments <= `upto`
  // (what a compaction keeps).
  std::vector<std::string> LiveIds(std::uint64_t upto) const;


  Outbox& outbox() { return outbox_; }
  const Counters& counters() const { return counters_; }
  const BatchStore& batches() const { return batches_; }
  BatchStore& mutable_batches() { return batches_; }
  const ResultStore& results() const { return results_; }
  WorkerRegistry& workers() { return workers_; }
  const WorkerRegistry& worker_registry() const { return workers_; }
  const Blacklist& blacklist() const { return blacklist_; }
  const ObjectTable& objects() const { return objects_; }
  // The largest object chunk asked of a producer: --max-message-bytes less
  // room for the envelope, so OBJECT_REPLY and OBJECT_DATA both fit.
  std::uint32_t ObjectChunkBytes() const;
  // Queue wait (accepted -> dispatched) and processing (dispatched -> first
  // result) since the metrics exporter last drained them.
  BucketCounts& wait_seconds() { return wait_seconds_; }
  BucketCounts& processing_seconds() { return processing_seconds_; }
  const BrokerOptions& options() const { return options_; }

 private:
  void OnSubmit(std::string_view identity, const proto::Submit& m, TimePoint now);
  void OnFetch(std::string_view identity, const proto::Fetch& m);
  void OnHello(std::string_view identity, const proto::Hello& m, TimePoint now);
  void OnDone(std::string_view identity, const proto::Done& m, TimePoint now);
  void OnDrain(std::string_view identity, TimePoint now);
  void OnBye(std::string_view identity, TimePoint now);
  void OnControl(std::string_view identity, const proto::Control& m, TimePoint now);
  void OnRetire(std::string_view identity, const proto::Control& m, bool if_idle,
                TimePoint now);
  void OnUnretire(std::string_view identity, const proto::Control& m);
  void OnWaitDemand(std::string_view identity, const proto::Control& m, TimePoint now);
  // Answers every wait-demand request with the queue depth.
  void AnswerDemand();
  void ReplyWorkers(std::string_view identity, std::uint64_t request_id, TimePoint now);
  void ReplyStats(std::string_view identity, std::uint64_t request_id);

  // Objects (broker/object_ops.cc, docs/protocol.md section 5a): the broker
  // relays OBJECT_GET to the batch's owner and its OBJECT_REPLY back.
  void OnObjectGet(std::string_view identity, const proto::ObjectGet& m, TimePoint now);
  void OnObjectReply(std::string_view identity, const proto::ObjectReply& m, TimePoint now);
  // Sends one OBJECT_DATA to the worker connection `worker` and counts it.
  void AnswerObject(std::string_view worker, std::uint64_t tag, std::uint64_t offset,
                    proto::ObjectStatus status, std::string_view error, TimePoint now,
                    std::uint64_t total = 0, std::string_view data = {});
  // Answers each of `pending` with `status`; `why` follows the batch id.
  void FailObjects(const std::vector<PendingObject>& pending, proto::ObjectStatus status,
                   std::string_view why, TimePoint now);

  // Gives queued batch `seq` (popped) to `w`, spending one credit.
  void Assign(Worker& w, BatchSeq seq, TimePoint now);
  // Records the first result of a batch and routes it to its producer.
  void Complete(const proto::DoneItem& item, Worker* reporter, TimePoint now);
  // Removes `seq` from the worker holding it and handles "now idle".
  void Release(Worker& w, BatchSeq seq, TimePoint now);
  // Puts a batch whose worker went away back in its queue, or dead-letters
  // it after max_attempts.
  void Requeue(BatchSeq seq, std::string_view why, TimePoint now);
  // Drops a worker a message could not reach (see OnDispatchFailed).
  void Unreachable(Worker& w, std::size_t sent, std::string_view why, TimePoint now);
  // Requeues everything `w` holds and forgets it.
  void DropWorker(Worker& w, std::string_view why, TimePoint now);
  void FinishFailed(BatchSeq seq, std::string error, TimePoint now);
  void StopIfDrained(Worker& w, TimePoint now);

  Outbox::ProducerOut& Out(std::string_view identity);
  void Send(Socket socket, std::string_view identity, const proto::Message& m);
  void SendToWorker(Worker& w, const proto::Message& m, TimePoint now);
  void Reply(std::string_view identity, std::uint64_t request_id,
             proto::ErrorCode code, std::string message);
  void Reject(std::string_view identity, std::string_view id,
              proto::ErrorCode code, std::string message);

  BrokerOptions options_;
  BatchStore batches_;
  ResultStore results_;
  WorkerRegistry workers_;
  Blacklist blacklist_;
  Counters counters_;
  ObjectTable objects_;
  BucketCounts wait_seconds_{LatencyBuckets()};
  BucketCounts processing_seconds_{LatencyBuckets()};
  Outbox outbox_;
  void JournalAccepted(Batch& b);
  // Adds the batch's id to the journal's shared finished record
  // (kFinishedIds) and releases its accepted one.
  void JournalFinished(const Batch& b);
  void JournalDispatched(const Batch& b, Journal& journal) const;
  // The batch's attempt count changed: its dispatched record is appended
  // now, or off the loop with the next write (AppendDueRecords).
  void NoteAttempts(Batch& b, BatchSeq seq);
  static std::uint64_t JournalBytes(const Batch& b);
  // Takes back a batch whose accepted record did not reach the disk.
  void TakeBack(BatchSeq seq, TimePoint now);
  // The message of a disk_full refusal for a batch whose write failed.
  std::string DiskFullWhy() const;

  // wait-demand requests not answered yet: each is answered when a batch
  // waits in a queue, or with "no demand" once its deadline has passed.
  struct DemandWaiter {
    std::string identity;
    std::uint64_t request_id = 0;
    TimePoint deadline;
  };
  std::vector<DemandWaiter> demand_waiters_;

  Journal* journal_ = nullptr;
  mutable std::string journal_scratch_;  // reused record buffer
  std::vector<BatchSeq> uncommitted_;    // accepted since the last commit
  // Off-loop commit: "accepted" owed to a producer once the batch's record
  // is on disk, for the batches accepted since the last SealCommit and for
  // those in the write that is out.
  struct HeldAck {
    std::string identity;
    BatchSeq seq;
  };
  bool off_loop_ = false;
  std::vector<HeldAck> open_acks_;
  std::vector<BatchSeq> sealed_;  // the batches of the write that is out
  std::vector<HeldAck> sealed_acks_;
  // Off-loop commit: batches whose dispatched record waits for the next
  // write. It is appended then, with the count the batch has then, and only
  // if the batch is still held: most finish before the next write starts,
  // and a finished record makes their dispatched one useless. The record is
  // never synced on its own, so the next write is when it would have gone
  // to disk anyway.
  std::vector<BatchSeq> attempts_due_;
  std::uint64_t bad_input_logged_ = 0;
};

}  // namespace fleet::broker

#include "broker/broker_server.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <tuple>

#include "broker/broker_metrics.h"
#include "broker/journal_records.h"
#include "common/endpoint.h"
#include "common/zmq_util.h"

namespace fleet::broker {
namespace {

// Messages read from one socket per turn before the others get a look:
// enough to batch work under load, small enough to stay fair.
constexpr int kBurst = 256;

// Most time between activity and the /metrics gauges showing it. A refresh
// walks every queue and worker (a few microseconds per hundred), so under
// load this costs well under 1% of the loop.
constexpr Millis kMetricsLag{20};

// Bounds on one outgoing message, far under every peer's decode limits, so a
// busy turn is split instead of producing a frame a peer must refuse.
constexpr std::size_t kMaxItemsPerMessage = 4096;
constexpr std::size_t kMaxBytesPerMessage = 8u << 20;

// How long closing a socket at exit may wait for messages still queued to
// peers.
constexpr int kShutdownLingerMs = 200;

// Sends `items` in as few messages as the bounds allow. `make` builds a
// message from a slice; `size_of` is an item's byte weight; `send` sends.
template <typename Item, typename Make, typename SizeOf, typename SendFn>
void SendChunked(std::vector<Item>& items, Make make, SizeOf size_of, SendFn send) {
  std::size_t begin = 0;
  while (begin < items.size()) {
    std::size_t end = begin;
    std::size_t bytes = 0;
    while (end < items.size() && end - begin < kMaxItemsPerMessage &&
           (end == begin || bytes + size_of(items[end]) <= kMaxBytesPerMessage)) {
      bytes += size_of(items[end]);
      ++end;
    }
    send(make(begin, end));
    begin = end;
  }
}

}  // namespace

namespace {

ZapHandler::Allowlists ReadAllowlists(const BrokerOptions& options) {
  return {{"producers", ReadAllowlist(options.curve_producers_file)},
          {"workers", ReadAllowlist(options.curve_workers_file)},
          {"control", ReadAllowlist(options.curve_control_file)}};
}

}  // namespace

bool BrokerServer::ReloadAllowlists() {
  if (zap_ == nullptr) {
    spdlog::info("SIGHUP: no CURVE allowlists to reload (the broker runs without CURVE)");
    return false;
  }
  ZapHandler::Allowlists fresh;
  try {
    fresh = ReadAllowlists(options_);
  } catch (const std::exception& e) {
    spdlog::error("SIGHUP: CURVE allowlists not reloaded, the old ones stay in force: {}",
                  e.what());
    return false;
  }
  std::string changes;
  for (const auto& [domain, keys] : fresh) {
    const std::set<std::string>& old = allowlists_[domain];
    std::size_t added = 0, removed = 0;
    for (const std::string& k : keys) added += old.count(k) == 0 ? 1 : 0;
    for (const std::string& k : old) removed += keys.count(k) == 0 ? 1 : 0;
    changes += fmt::format("{}{} {} keys (+{} -{})", changes.empty() ? "" : ", ", domain,
                           keys.size(), added, removed);
  }
  zap_->Replace(fresh);
  allowlists_ = std::move(fresh);
  spdlog::info("SIGHUP: CURVE allowlists reloaded: {}; removed keys are refused from their "
               "next handshake on, their open connections stay",
               changes);
  return true;
}

void CheckBrokerEndpoints(const BrokerOptions& options) {
  CheckEndpoint("--frontend", options.frontend, EndpointUse::kBind);
  CheckEndpoint("--backend", options.backend, EndpointUse::kBind);
  CheckEndpoint("--control", options.control, EndpointUse::kBind);
}

BrokerServer::BrokerServer(const BrokerOptions& options, const Clock& clock)
    : options_(options),
      clock_(clock),
      core_(options),
      context_(1),
      frontend_(context_, zmq::socket_type::router),
      backend_(context_, zmq::socket_type::router),
      control_(context_, zmq::socket_type::router) {
  CheckBrokerEndpoints(options);
  if (!options.data_dir.empty()) {
    if (options.max_batch_bytes + 2 * options.max_id_bytes + 16 > Journal::kMaxRecordBytes) {
      throw std::invalid_argument(
          "--data-dir keeps batches of at most " +
          std::to_string((Journal::kMaxRecordBytes >> 20) - 1) +
          " MiB: lower --max-batch-bytes (now " + std::to_string(options.max_batch_bytes) + ")");
    }
    if (options.max_id_bytes + 4 > Journal::kMaxItemsBytes) {  // a finished id is an item
      throw std::invalid_argument("--data-dir keeps batch ids of at most " +
                                  std::to_string(Journal::kMaxItemsBytes - 4) + " bytes");
    }
    JournalOptions jo;
    jo.dir = options.data_dir;
    jo.segment_bytes = options.journal_segment_bytes;
    jo.recover = options.journal_recover;
    jo.io = options.journal_io;
    jo.record_key = records::BatchId;
    jo.item_types = {records::kFinishedIds};
    const TimePoint now = clock_.Now();
    journal_ = Journal::Open(
        jo, [&](std::uint64_t segment, std::uint8_t type, std::string_view body) {
          core_.Restore(segment, type, body, now);
        });
    core_.SetJournal(journal_.get(), /*off_loop=*/true);
    core_.FinishRestore(now);
  }
  const std::size_t max_message_bytes = MaxMessageBytes(options);
  limits_.max_message_bytes = max_message_bytes;
  // Payload size is checked per batch by the core, so that one oversized
  // batch is refused alone instead of failing its whole message.
  limits_.max_payload_bytes = max_message_bytes;
  limits_.max_id_bytes = options.max_id_bytes;
  // A worker's error text is cut by the core, not refused with its DONE
  // (refusing the DONE would leave its batches held).
  limits_.max_text_bytes = std::min<std::size_t>(max_message_bytes, 1u << 20);
  SocketLimits sl;
  // Linger bounds the exit: what a live peer is owed leaves within
  // microseconds; only a peer that stopped reading holds messages back, and
  // for it a restart must not wait (the producer library re-sends whatever
  // has no result when it reconnects).
  sl.linger_ms = kShutdownLingerMs;
  // Frames over the transport limit make libzmq drop the connection; keep it
  // a little above the codec's limit so a message just over it gets a clear
  // ERROR. Only a little: until it has the whole frame, libzmq holds up to
  // this much per connection, out of the broker's sight (ConnectionGuard).
  sl.max_message_bytes =
      static_cast<int>(std::min<std::size_t>(TransportFrameLimit(options), 0x7fffffff));
  for (zmq::socket_t* s : {&frontend_, &backend_, &control_}) {
    ApplySocketOptions(*s, sl, /*router=*/true);
  }
  const bool curve = !options.curve_secret_key_file.empty();
  CurveKeyPair probe_keys;
  if (curve) {
    if (options.curve_producers_file.empty() || options.curve_workers_file.empty() ||
        options.curve_control_file.empty()) {
      throw std::invalid_argument(
          "--curve-secret-key needs an allowlist for each endpoint: --curve-producers, "
          "--curve-workers and --curve-control (files of public keys; an empty file lets "
          "nobody in)");
    }
    curve_keys_ = ReadKeyFile(options.curve_secret_key_file, /*need_secret=*/true);
    // The role of a client is the endpoint whose allowlist has its key: a
    // worker key cannot submit, a producer key cannot pull work or retire.
    // The self-check below connects with this unlisted key; the handler
    // refuses it like any other but does not report it as an intruder.
    probe_keys = GenerateKeyPair();
    allowlists_ = ReadAllowlists(options);
    zap_ = std::make_unique<ZapHandler>(context_, allowlists_, probe_keys.public_key);
    ApplyCurveServer(frontend_, curve_keys_, "producers");
    ApplyCurveServer(backend_, curve_keys_, "workers");
    ApplyCurveServer(control_, curve_keys_, "control");
  } else if (!options.curve_producers_file.empty() || !options.curve_workers_file.empty() ||
             !options.curve_control_file.empty()) {
    throw std::invalid_argument("the --curve-* allowlists need --curve-secret-key");
  }
  frontend_endpoint_ = BindSocket(frontend_, options.frontend);
  backend_endpoint_ = BindSocket(backend_, options.backend);
  control_endpoint_ = BindSocket(control_, options.control);
  if (options.max_inbound_bytes > 0) {
    // With CURVE the CurveMonitor below owns the monitors and shares them.
    guard_ = std::make_unique<ConnectionGuard>(context_, options.max_inbound_bytes,
                                               options.unproven_grace);
    const std::uint64_t charge = static_cast<std::uint64_t>(sl.max_message_bytes);
    for (auto [socket, endpoint, name] :
         {std::tuple{&frontend_, &frontend_endpoint_, "producers"},
          std::tuple{&backend_, &backend_endpoint_, "workers"},
          std::tuple{&control_, &control_endpoint_, "control"}}) {
      if (curve) {
        guard_->Track(*endpoint, name, charge);
      } else {
        guard_->Watch(*socket, *endpoint, name, charge);
      }
    }
  }
  if (curve) {
    // libzmq lets every key in when no ZAP handler answers: prove ours does,
    // on each endpoint, with a real handshake from a key nobody listed.
    for (const std::string* ep : {&frontend_endpoint_, &backend_endpoint_, &control_endpoint_}) {
      std::string detail;
      if (!VerifyUnknownKeyRefused(context_, *ep, curve_keys_.public_key, probe_keys,
                                   std::chrono::milliseconds(5000), &detail)) {
        throw std::runtime_error("CURVE self-check failed on " + *ep + ": " + detail +
                                 "; refusing to start unauthenticated");
      }
    }
    // After the self-check, so its refusals are not counted.
    curve_monitor_ = std::make_unique<CurveMonitor>(context_);
    if (guard_ != nullptr) {
      ConnectionGuard* guard = guard_.get();
      curve_monitor_->Share(ConnectionGuard::kEvents,
                            [guard](std::size_t i, std::uint16_t event, std::uint32_t value,
                                    TimePoint now) { guard->OnEvent(i, event, value, now); });
    }
    curve_monitor_->Watch(frontend_, "producers");
    curve_monitor_->Watch(backend_, "workers");
    curve_monitor_->Watch(control_, "control");
  }
}

zmq::socket_t& BrokerServer::SocketFor(Socket which) {
  switch (which) {
    case Socket::kFrontend: return frontend_;
    case Socket::kBackend: return backend_;
    case Socket::kControl: return control_;
  }
  return control_;
}

void BrokerServer::Run(const std::function<bool()>& stop, const std::function<bool()>& reload) {
  // The three endpoints (indices 0-2, in the order of Socket), then (with
  // CURVE) their handshake monitors, then the guard's connection monitors.
  waiter_ = SocketWaiter();
  waiter_.Add(frontend_);
  waiter_.Add(backend_);
  waiter_.Add(control_);
  const std::size_t curve_first = waiter_.size();
  const std::size_t monitors = curve_monitor_ != nullptr ? curve_monitor_->size() : 0;
  for (std::size_t i = 0; i < monitors; ++i) waiter_.Add(curve_monitor_->socket(i));
  const std::size_t guard_first = waiter_.size();
  const std::size_t guards = guard_ != nullptr ? guard_->monitors() : 0;
  for (std::size_t i = 0; i < guards; ++i) waiter_.Add(guard_->socket(i));
  // Durable mode: the journal's writer says a write (and its sync) is done.
  const std::size_t journal_item = waiter_.size();
  if (journal_ != nullptr) waiter_.AddFd(journal_->wake_fd());
  // Housekeeping runs twice per heartbeat so a heartbeat is never late by
  // more than half an interval.
  const Duration tick = options_.heartbeat / 2;
  TimePoint next_tick = clock_.Now() + tick;
  // The gauges also follow activity within kMetricsLag, so an autoscaler
  // polling /metrics sees a burst arrive in tens of milliseconds, not half
  // a heartbeat later. An idle broker does not wake for them.
  TimePoint metrics_due = TimePoint::max();
  std::size_t published_queued = 0;  // fleet_queue_depth as last refreshed
  // Memory freed under load (libzmq's receive buffers, batches done) stays
  // with malloc; the first tick with no message since the one before hands
  // it back to the system, once per quiet spell, so a broker holding a big
  // queue shows what it holds, and no busy loop ever pays for a trim.
  bool busy_since_tick = false;
  bool trimmed = true;
  while (!stop()) {
    // Between turns, never inside one: the swap is the ZAP handler's
    // (thread-safe); the loop only reads the files.
    if (reload && reload()) ReloadAllowlists();
    TimePoint now = clock_.Now();
    auto wait = std::chrono::ceil<Millis>(std::min({next_tick, metrics_due, journal_due_}) - now);
    if (wait.count() < 0) wait = Millis(0);
    waiter_.Wait(wait);
    now = clock_.Now();
    for (std::size_t i = 0; i < monitors; ++i) {
      const std::size_t k = curve_first + i;
      if (waiter_.ready(k)) waiter_.Drained(k, curve_monitor_->Drain(i, now));
    }
    for (std::size_t i = 0; i < guards; ++i) {
      const std::size_t k = guard_first + i;
      if (waiter_.ready(k)) waiter_.Drained(k, guard_->Drain(i, now));
    }
    // First, so that a write's batches are queued and answered this turn,
    // and the next write (what came meanwhile) can start at its end.
    if (journal_ != nullptr && waiter_.ready(journal_item) && journal_->writing()) {
      core_.AfterCommit(journal_->FinishWrite(), now);
    }
    // Received messages, not readiness: a socket is also ready after a
    // send (a heartbeat), which is no activity.
    const int received = Drain(Socket::kFrontend, now) + Drain(Socket::kBackend, now) +
                         Drain(Socket::kControl, now);
    const bool active = received > 0;
    busy_since_tick |= active;
    core_.Pump(now);
    FlushAndRedispatch(now);
    if (metrics_ != nullptr) {
      if (active && metrics_due == TimePoint::max()) metrics_due = now + kMetricsLag;
      // Work waiting where none was (no worker took it this turn): shown at
      // once, since an autoscaler at zero workers starts one on it.
      if (published_queued == 0 && core_.batches().queued() > 0) metrics_due = now;
      if (now >= metrics_due) {
        metrics_->Update(core_, now);
        published_queued = core_.batches().queued();
        metrics_due = TimePoint::max();
      }
    }
    if (now >= next_tick) {
      core_.Tick(now);
      if (curve_monitor_ != nullptr) curve_monitor_->Tick(now);
      if (busy_since_tick) {
        trimmed = false;
      } else if (!trimmed) {
        malloc_trim(0);
        trimmed = true;
      }
      busy_since_tick = false;
      core_.Pump(now);  // batches requeued from dead workers
      FlushAndRedispatch(now);
      if (metrics_ != nullptr) {
        metrics_->Update(core_, now);
        published_queued = core_.batches().queued();
        if (journal_ != nullptr) metrics_->UpdateJournal(journal_->stats());
        if (curve_monitor_ != nullptr) metrics_->UpdateCurve(*curve_monitor_);
        if (guard_ != nullptr) metrics_->UpdateGuard(*guard_);
      }
      // Deletes finished segments, starts or collects a compaction (off
      // the loop), and retries a journal that could not be written.
      if (journal_ != nullptr) {
        journal_->Maintain([&](std::uint64_t upto) { return core_.LiveIds(upto); });
      }
      next_tick = now + tick;
    }
  }
  // The journal writes what it buffers when it closes; the dispatched
  // records still waiting for a write go with it.
  if (journal_ != nullptr) core_.AppendDueRecords();
}

int BrokerServer::Drain(Socket which, TimePoint now) {
  const std::size_t k = static_cast<std::size_t>(which);
  if (!waiter_.ready(k)) return 0;
  zmq::socket_t& socket = SocketFor(which);
  int n = 0;
  for (; n < kBurst; ++n) {
    if (!RecvMultipart(socket, &frames_)) {
      waiter_.Drained(k, false);
      return n;
    }
    if (frames_.size() < 2) continue;  // a ROUTER always prepends the routing id
    std::string_view identity(static_cast<const char*>(frames_[0].data()), frames_[0].size());
    if (frames_.size() != 2) {
      core_.OnBadInput(which, identity, proto::ErrorCode::kFrames,
                       "expected one frame per message, got " +
                           std::to_string(frames_.size() - 1));
      continue;
    }
    proto::Decoded d = proto::Decode(frames_[1].data(), frames_[1].size(), limits_);
    if (!d.ok()) {
      core_.OnBadInput(which, identity, d.error, d.detail, d.request_id);
      continue;
    }
    if (guard_ != nullptr && guard_->watching()) guard_->OnValidMessage(frames_[1]);
    // `d.message` borrows from frames_[1], which lives until the next recv.
    core_.OnMessage(which, identity, *d.message, now);
  }
  // Stopped at the bound: the socket stays ready, so the next wait does
  // not block.
  return n;
}

void BrokerServer::FlushAndRedispatch(TimePoint now) {
  // A worker found unreachable while flushing is dropped and its batches
  // requeued: they go to another worker now, not at the next message or
  // tick (half a heartbeat away).
  const std::uint64_t dead = core_.counters().workers_dead;
  Flush(now);
  if (core_.counters().workers_dead != dead) {
    core_.Pump(now);
    Flush(now);
  }
}

void BrokerServer::StartJournalWrite(TimePoint now) {
  // Group commit off the loop: what was appended since the last write (every
  // turn's since then) goes to disk in one write + fdatasync on the
  // journal's writer thread while the loop goes on. Its new batches join
  // their queues, and their producers hear "accepted", only once it is done
  // (Run: AfterCommit); when it fails (a full disk) they are refused with
  // disk_full instead: nothing unwritten is acknowledged or dispatched.
  // Syncs start at most one per --journal-sync-interval-ms (JournalPacer):
  // under load each then carries more batches (a sync costs mostly per
  // sync, not per byte), and a batch after a quiet spell is written at once.
  journal_due_ = TimePoint::max();  // the writer's eventfd wakes the loop meanwhile
  if (journal_->writing() || (!journal_->pending() && !core_.has_due_records())) return;
  const bool sync = journal_->has_sync_records();
  if (const TimePoint due = pacer_.Due(sync); now < due) {
    journal_due_ = due;
    return;
  }
  core_.AppendDueRecords();
  const Journal::StartResult started = journal_->StartWrite();
  if (started == Journal::StartResult::kStarted) pacer_.Started(now, sync);
  core_.AfterStartWrite(started, now);
}

void BrokerServer::Flush(TimePoint now) {
  if (journal_ != nullptr) StartJournalWrite(now);
  Outbox& out = core_.outbox();
  if (out.empty()) {
    core_.AfterFlush(now);
    return;
  }

  // Frames first: a WELCOME must reach a worker before its first DISPATCH.
  // By index, with what the core needs copied: a failed send calls into
  // the core, which may add frames (object answers to workers whose
  // producer is gone), sent here too or after the producers' messages.
  std::size_t frames_sent = 0;
  auto send_frames = [&] {
    for (; frames_sent < out.frames.size(); ++frames_sent) {
      const std::size_t i = frames_sent;
      waiter_.Touched(static_cast<std::size_t>(out.frames[i].socket));
      if (!SendRouted(SocketFor(out.frames[i].socket), out.frames[i].identity,
                      out.frames[i].body)) {
        const Socket socket = out.frames[i].socket;
        const std::string identity = out.frames[i].identity;
        core_.OnUndeliverable(socket, identity, now);
      }
    }
  };
  send_frames();

  // Then dispatches: workers idle until they get them. (A send processes
  // the socket's commands, which may take the wake-up of input that came
  // meanwhile: SocketWaiter.)
  if (!out.dispatch_workers.empty()) waiter_.Touched(static_cast<std::size_t>(Socket::kBackend));
  std::vector<proto::DispatchItem> dispatch;
  for (const std::string& worker_id : out.dispatch_workers) {
    Worker* w = core_.workers().Find(worker_id);
    if (w == nullptr || w->outgoing.empty()) continue;
    dispatch.clear();
    for (BatchSeq seq : w->outgoing) {
      const Batch* b = core_.batches().Get(seq);
      if (b != nullptr) dispatch.push_back({b->id, b->queue, b->attempts, b->payload});
    }
    bool sent = true;
    std::size_t sent_items = 0;  // of `dispatch`, in messages libzmq took
    SendChunked(
        dispatch,
        [&](std::size_t b, std::size_t e) {
          return proto::Dispatch{{dispatch.begin() + b, dispatch.begin() + e}};
        },
        [](const proto::DispatchItem& d) { return d.payload.size() + d.id.size() + 16; },
        [&](const proto::Dispatch& m) {
          if (!sent) return;
          proto::EncodeTo(m, &scratch_);
          sent = SendRouted(backend_, w->identity, scratch_);
          if (sent) sent_items += m.batches.size();
        });
    if (sent) {
      w->outgoing.clear();
    } else {
      // The messages before the failed one may reach the worker: their
      // batches keep their attempt. The worker is dropped and everything it
      // held requeued; results of what did arrive are still accepted.
      std::size_t k = 0;
      for (std::size_t n = 0; k < w->outgoing.size() && n < sent_items; ++k) {
        n += core_.batches().Get(w->outgoing[k]) != nullptr;
      }
      core_.OnDispatchFailed(worker_id, k, now);
    }
  }

  std::vector<std::string_view> accepted;
  std::vector<proto::Rejection> rejected;
  std::vector<proto::ResultItem> results;
  if (!out.producers.empty()) waiter_.Touched(static_cast<std::size_t>(Socket::kFrontend));
  for (auto& [identity, po] : out.producers) {
    accepted.assign(po.accepted.begin(), po.accepted.end());
    rejected.clear();
    for (const auto& r : po.rejected) rejected.push_back({r.id, r.code, r.message});
    // Rejections ride with the first ack message.
    std::size_t acks_sent = 0;
    auto send_ack = [&](const proto::Ack& m) {
      proto::EncodeTo(m, &scratch_);
      if (!SendRouted(frontend_, identity, scratch_)) {
        core_.OnUndeliverable(Socket::kFrontend, identity, now);
      }
      ++acks_sent;
    };
    SendChunked(
        accepted,
        [&](std::size_t b, std::size_t e) {
          proto::Ack m{{accepted.begin() + b, accepted.begin() + e}, {}};
          if (b == 0) m.rejected = rejected;
          return m;
        },
        [](std::string_view id) { return id.size() + 2; }, send_ack);
    if (acks_sent == 0 && !rejected.empty()) send_ack(proto::Ack{{}, rejected});

    results.clear();
    for (const auto& [id, r] : po.results) {
      if (r != nullptr) results.push_back({id, r->outcome, r->attempts, r->result, r->error});
    }
    for (const std::string& id : po.unknown) {
      results.push_back({id, proto::Outcome::kUnknown, 0, "", "no such batch"});
    }
    // A producer that went away fetches its results after reconnecting.
    SendChunked(
        results,
        [&](std::size_t b, std::size_t e) {
          return proto::Result{{results.begin() + b, results.begin() + e}};
        },
        [](const proto::ResultItem& r) { return r.result.size() + r.error.size() + r.id.size() + 16; },
        [&](const proto::Result& m) {
          proto::EncodeTo(m, &scratch_);
          if (!SendRouted(frontend_, identity, scratch_)) {
            core_.OnUndeliverable(Socket::kFrontend, identity, now);
          }
        });
  }

  send_frames();
  out.clear();
  core_.AfterFlush(now);
}

void WriteReadyFile(const std::string& path, const BrokerServer& server) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << "frontend=" << server.frontend_endpoint() << "\n"
      << "backend=" << server.backend_endpoint() << "\n"
      << "control=" << server.control_endpoint() << "\n";
    for (const std::string& line : server.ready_lines()) f << line << "\n";
    if (!f) throw std::runtime_error("cannot write ready file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot rename ready file to " + path);
  }
}

}  // namespace fleet::broker

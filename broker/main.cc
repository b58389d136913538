// fleet-broker: queues batches from producers and dispatches them to workers
// on credit. See DESIGN.md and docs/protocol.md.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <iostream>
#include <optional>

#include "broker/broker_metrics.h"
#include "broker/broker_server.h"
#include "common/curve.h"
#include "common/flags.h"
#include "common/huge_pages.h"
#include "common/log.h"
#include "common/metrics_server.h"
#include "common/signals.h"

int main(int argc, char** argv) {
  fleet::UseHugePageMalloc(argv);  // first: it may re-execute this program
  using namespace fleet;
  broker::BrokerOptions o;
  std::string log_level = "info";
  std::string metrics = "0.0.0.0:9750";
  double blacklist_ttl_s = 120, heartbeat_ms = 1000, retention_s = 300, retire_linger_ms = 1000;
  int journal_segment_mb = 64;
  double journal_sync_interval_ms = 2;

  CLI::App app("fleet-broker: queues batches from producers and dispatches them to "
               "workers on credit");
  app.add_option("--frontend", o.frontend, "endpoint for producers")->capture_default_str();
  app.add_option("--backend", o.backend, "endpoint for workers")->capture_default_str();
  app.add_option("--control", o.control, "endpoint for fleet-ctl and the autoscaler")
      ->capture_default_str();
  app.add_option("--max-queue", o.max_queue,
                 "batches waiting for a worker, all queues; past it producers get 'queue full'")
      ->capture_default_str()->check(CLI::Range(1ul, 100000000ul));
  app.add_option("--max-queue-bytes", o.max_queue_bytes,
                 "payload bytes held (queued and running); past it producers get \"queue "
                 "full\"")->capture_default_str()->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40));
  app.add_option("--max-inflight-per-producer", o.max_inflight_per_producer,
                 "unfinished batches one producer may hold before its submits get \"queue "
                 "full\" (0: only --max-queue and --max-queue-bytes)")->capture_default_str();
  app.add_option("--max-attempts", o.max_attempts,
                 "dispatches of one batch before it is dead-lettered with a failed result")
      ->capture_default_str()->check(CLI::Range(1u, 100u));
  app.add_option("--blacklist-ttl-seconds", blacklist_ttl_s,
                 "how long a retired worker id gets no work if it comes back")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  app.add_option("--retire-linger-ms", retire_linger_ms,
                 "a retired idle worker is told to stop this long after its retirement, so a "
                 "burst arriving meanwhile can take it back (unretire)")
      ->capture_default_str()->check(CLI::Range(0.0, 60000.0));
  double object_timeout_s = std::chrono::duration<double>(o.object_timeout).count();
  app.add_option("--object-timeout-seconds", object_timeout_s,
                 "how long a worker's object request waits for the batch's producer to "
                 "answer before the worker is told 'timeout' (docs/protocol.md section 5a)")
      ->capture_default_str()->check(CLI::Range(0.1, 3600.0));
  app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat interval to workers")
      ->capture_default_str()->check(CLI::Range(10.0, 60000.0));
  app.add_option("--liveness", o.liveness,
                 "missed heartbeats before a worker is declared dead and its batches requeued")
      ->capture_default_str()->check(CLI::Range(2u, 100u));
  app.add_option("--result-retention-seconds", retention_s,
                 "how long finished results are kept for re-submits and fetches")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  app.add_option("--max-retained-results", o.max_retained_results,
                 "results kept at most for re-submits and fetches")
      ->capture_default_str()->check(CLI::Range(1ul, 100000000ul));
  app.add_option("--max-batch-bytes", o.max_batch_bytes, "largest payload of one batch")
      ->capture_default_str()->check(CLI::Range(1ul, 1ul << 30));
  app.add_option("--max-message-bytes", o.max_message_bytes,
                 "largest message (one frame) accepted from any peer; 0: --max-batch-bytes + "
                 "68 KiB (one batch of the largest size and its envelope)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 30));
  std::uint64_t max_inbound_mb = o.max_inbound_bytes >> 20;
  CLI::Option* max_inbound_flag = app.add_option("--max-inbound-mb", max_inbound_mb,
                 "MiB that connections which have not yet sent a valid message may make the "
                 "broker hold (each is charged one frame of --max-message-bytes + 64 KiB); "
                 "past it new connections are refused and counted. 0: no limit; by default "
                 "raised to 4 frames when --max-message-bytes is that large")
      ->capture_default_str()->check(CLI::Range(std::uint64_t{0}, std::uint64_t{1} << 20));
  app.add_option("--metrics", metrics,
                 "ADDRESS:PORT to bind Prometheus /metrics on (0.0.0.0: every interface, "
                 "127.0.0.1: this host only; port 0 picks one; \"\" turns it off); only "
                 "/metrics is served")
      ->capture_default_str();
  std::string metrics_auth_file;
  AddMetricsAuthFlag(app, &metrics_auth_file);
  app.add_option("--curve-secret-key", o.curve_secret_key_file,
                 "CURVE on all three endpoints with this key pair file (fleet-ctl keygen; "
                 "mode 0600: refused if group or others may read it); needs the three "
                 "allowlists");
  app.add_option("--curve-producers", o.curve_producers_file,
                 "CURVE: public keys allowed on the frontend (one per line); SIGHUP reloads "
                 "all three allowlists");
  app.add_option("--curve-workers", o.curve_workers_file,
                 "CURVE: public keys allowed on the backend (SIGHUP reloads it)");
  app.add_option("--curve-control", o.curve_control_file,
                 "CURVE: public keys allowed on the control endpoint (SIGHUP reloads it)");
  app.add_option("--data-dir", o.data_dir,
                 "keep accepted batches in an append-only journal here (fsync before "
                 "\"accepted\"); replayed on start. Empty: in memory only");
  app.add_option("--journal-segment-mb", journal_segment_mb,
                 "--data-dir: start a new journal segment past this size; finished segments "
                 "are deleted, so the journal holds about the unfinished batches plus one "
                 "segment")
      ->capture_default_str()->check(CLI::Range(1, 16384));
  app.add_option("--journal-sync-interval-ms", journal_sync_interval_ms,
                 "--data-dir: start at most one journal write + fdatasync per this many ms; "
                 "what is accepted meanwhile goes to disk with the next (group commit: fewer, "
                 "larger syncs under load; a batch after a quiet spell is written at once). "
                 "Nothing is acknowledged before its sync. 0: sync as soon as the last ends")
      ->capture_default_str()->check(CLI::Range(0.0, 1000.0));
  app.add_flag("--journal-recover", o.journal_recover,
               "--data-dir: start even if a journal record is damaged, keeping every record "
               "that checks out and dropping (and logging) the damaged bytes; batches in them "
               "are lost. Without it a damaged journal stops the start");
  app.add_option("--ready-file", o.ready_file,
                 "write the bound endpoints (key=value lines) to this file once listening");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  if (int rc = ParseFlags(app, argc, argv); rc >= 0) return rc;
  std::optional<BasicAuth> metrics_auth;
  try {
    broker::CheckBrokerEndpoints(o);
    metrics_auth = LoadMetricsFlags(metrics, metrics_auth_file);
    // Read here too, so that a key or allowlist the broker cannot use is a
    // usage error (exit 2) like any other bad setting.
    if (!o.curve_secret_key_file.empty()) ReadKeyFile(o.curve_secret_key_file, true);
    for (const std::string* f :
         {&o.curve_producers_file, &o.curve_workers_file, &o.curve_control_file}) {
      if (!f->empty()) ReadAllowlist(*f);
    }
  } catch (const std::exception& e) {
    std::cerr << "fleet-broker: " << e.what() << "\n";
    return kUsageError;
  }

  try {
    SetupLogging("fleet-broker", log_level);
    if (o.max_message_bytes != 0 && o.max_message_bytes < o.max_batch_bytes + 1024) {
      // (which also keeps it at 1 KiB or more)
      throw std::invalid_argument("--max-message-bytes must exceed --max-batch-bytes");
    }
    if (max_inbound_flag->count() == 0) {
      // Not chosen: room for at least four silent connections however large
      // --max-message-bytes is.
      max_inbound_mb = std::max<std::uint64_t>(
          max_inbound_mb, (4 * broker::TransportFrameLimit(o) + (1u << 20) - 1) >> 20);
    }
    o.max_inbound_bytes = max_inbound_mb << 20;
    if (o.max_inbound_bytes != 0 && o.max_inbound_bytes < broker::TransportFrameLimit(o)) {
      throw std::invalid_argument(fmt::format(
          "--max-inbound-mb {} does not hold one frame of {} bytes (--max-message-bytes + 64 "
          "KiB): raise it, or 0 for no limit",
          max_inbound_mb, broker::TransportFrameLimit(o)));
    }
    o.blacklist_ttl = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(blacklist_ttl_s));
    o.heartbeat = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double, std::milli>(heartbeat_ms));
    o.retire_linger = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double, std::milli>(retire_linger_ms));
    o.result_retention = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(retention_s));
    o.object_timeout = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(object_timeout_s));
    o.journal_segment_bytes = static_cast<std::uint64_t>(journal_segment_mb) << 20;
    o.journal_sync_interval = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double, std::milli>(journal_sync_interval_ms));
    InstallStopSignals();
    InstallReloadSignal();  // SIGHUP: reload the CURVE allowlists
    SteadyClock clock;
    broker::BrokerServer server(o, clock);
    std::string durability = "in-memory queue (accepted batches are lost if the broker "
                             "stops; --data-dir keeps them)";
    if (const broker::Journal* j = server.journal()) {
      durability = fmt::format(
          "durable queue in {} (replayed {} records from {} segments: {} unfinished batches "
          "back in their queues{}{})",
          o.data_dir, j->stats().records_replayed, j->stats().segments_replayed,
          server.core().batches().size(),
          j->stats().recovered_ranges > 0
              ? fmt::format("; --journal-recover dropped {} damaged bytes in {} places",
                            j->stats().recovered_bytes_dropped, j->stats().recovered_ranges)
              : std::string(),
          j->accepting() ? std::string()
                         : "; REFUSING new batches: " + j->problem());
    }
    std::shared_ptr<prometheus::Registry> registry;
    std::unique_ptr<broker::BrokerMetrics> metrics_state;
    MetricsServer served;
    std::string metrics_url = "off";
    if (!metrics.empty()) {
      registry = std::make_shared<prometheus::Registry>();
      metrics_state = std::make_unique<broker::BrokerMetrics>(*registry);
      metrics_state->Update(server.core(), clock.Now());
      served = ServeMetrics(metrics, registry, metrics_auth);
      metrics_url = served.url();
      server.set_metrics(metrics_state.get());
      server.add_ready_line("metrics=" + metrics_url);
      if (metrics_auth) metrics_url += " (basic auth)";
    }
    spdlog::info(
        "listening: frontend {} backend {} control {} metrics {}; max-queue {} max-attempts {} "
        "blacklist-ttl {} s; max-message-bytes {} max-inbound-mb {}; {}; {}",
        server.frontend_endpoint(), server.backend_endpoint(), server.control_endpoint(),
        metrics_url, o.max_queue, o.max_attempts, blacklist_ttl_s, broker::MaxMessageBytes(o),
        max_inbound_mb == 0 ? std::string("off") : std::to_string(max_inbound_mb), durability,
        server.curve_public_key().empty()
            ? std::string("no authentication (anyone who reaches the ports gets in; "
                          "--curve-secret-key turns CURVE on)")
            : "CURVE with allowlists, server key " + server.curve_public_key() +
                  " (an unknown key was refused on every endpoint)");
    // After the start line, so whoever waits for the file can read the line.
    if (!o.ready_file.empty()) broker::WriteReadyFile(o.ready_file, server);
    server.Run([] { return StopRequested(); }, [] { return TakeReloadRequest(); });
    const auto& b = server.core().batches();
    spdlog::info("stopping on signal {}: {} batches queued and {} in flight {}; submitted {} "
                 "completed {}",
                 StopSignal(), b.queued(), b.running(),
                 server.journal() != nullptr ? "stay in the journal for the next start"
                                             : "are dropped (producers re-submit them)",
                 server.core().counters().submitted,
                 server.core().counters().completed_ok +
                     server.core().counters().completed_failed);
    return 0;
  } catch (const std::invalid_argument& e) {  // contradictory settings
    spdlog::error("fleet-broker: {}", e.what());
    return kUsageError;
  } catch (const std::exception& e) {
    spdlog::error("fleet-broker: {}", e.what());
    return 1;
  }
}

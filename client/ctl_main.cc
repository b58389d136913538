// fleet-ctl: operator commands over the broker's control endpoint: list
// workers, show stats, retire or unretire a worker. Exit 0 on success, 1
// when the broker refuses, 2 on no answer or bad usage, 3 when the broker
// refused the handshake ("authentication failed").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/control_client.h"
#include "common/curve.h"
#include "common/flags.h"
#include "common/log.h"
#include "fleet/errors.h"

namespace {

using fleet::client::ControlClient;
using fleet::client::ControlResponse;
namespace proto = fleet::proto;
using Json = nlohmann::ordered_json;

struct Config {
  std::string control = "tcp://127.0.0.1:5557";
  int timeout_ms = 5000;
  bool json = false;
  std::string log_level = "warn";
  std::string worker_id;
  bool if_idle = false;
  std::string curve_server_key, curve_key;
  std::string keygen_name;
};

std::string Str(std::string_view s) { return std::string(s); }

std::string FormatNumber(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f", v);
  }
  return buf;
}

// Prints rows as left-aligned columns two spaces apart.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (std::size_t i = 0; i < row.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    std::cout << line << '\n';
  }
}

// Slots a worker runs at once; an older broker does not say (0): then
// all of its concurrency counts as slots.
std::uint32_t SlotsOf(const proto::WorkerInfo& w) {
  return w.slots == 0 || w.slots > w.concurrency ? w.concurrency : w.slots;
}

int PrintWorkers(const proto::WorkersReply& reply, bool json) {
  if (json) {
    Json out = Json::array();
    for (const auto& w : reply.workers) {
      out.push_back({{"id", Str(w.id)},
                     {"state", Str(w.state)},
                     {"held", w.held},
                     {"slots", SlotsOf(w)},
                     {"prefetch", w.concurrency - SlotsOf(w)},
                     {"concurrency", w.concurrency},
                     {"idle_seconds", w.idle_seconds},
                     {"processed", w.processed},
                     {"failed", w.failed}});
    }
    std::cout << Json{{"workers", out}}.dump(
                     -1, ' ', false, Json::error_handler_t::replace)
              << '\n';
    return 0;
  }
  std::vector<std::vector<std::string>> rows{
      {"ID", "STATE", "HELD", "SLOTS", "PREFETCH", "IDLE_S", "PROCESSED", "FAILED"}};
  for (const auto& w : reply.workers) {
    char idle[32];
    std::snprintf(idle, sizeof idle, "%.1f", w.idle_seconds);
    rows.push_back({Str(w.id), Str(w.state), std::to_string(w.held),
                    std::to_string(SlotsOf(w)), std::to_string(w.concurrency - SlotsOf(w)),
                    idle, std::to_string(w.processed), std::to_string(w.failed)});
  }
  PrintTable(rows);
  return 0;
}

int PrintStats(const proto::StatsReply& reply, bool json) {
  auto queues = reply.queues;
  auto values = reply.values;
  std::sort(queues.begin(), queues.end());
  std::sort(values.begin(), values.end());
  if (json) {
    Json q = Json::object();
    for (const auto& [name, depth] : queues) q[Str(name)] = depth;
    Json v = Json::object();
    for (const auto& [name, value] : values) v[Str(name)] = value;
    std::cout << Json{{"queues", q}, {"values", v}}.dump(
                     -1, ' ', false, Json::error_handler_t::replace)
              << '\n';
    return 0;
  }
  std::vector<std::vector<std::string>> rows{{"QUEUE", "DEPTH"}};
  for (const auto& [name, depth] : queues) {
    rows.push_back({Str(name), std::to_string(depth)});
  }
  PrintTable(rows);
  std::cout << '\n';
  rows = {{"NAME", "VALUE"}};
  for (const auto& [name, value] : values) {
    rows.push_back({Str(name), FormatNumber(value)});
  }
  PrintTable(rows);
  return 0;
}

int Refused(proto::ErrorCode code, std::string_view message, bool json) {
  if (json) {
    std::cout << Json{{"ok", false},
                      {"code", proto::ErrorCodeName(code)},
                      {"message", Str(message)}}
                     .dump(-1, ' ', false, Json::error_handler_t::replace)
              << '\n';
  }
  std::cerr << "refused: " << proto::ErrorCodeName(code) << ": " << message
            << '\n';
  return 1;
}

int PrintReply(const std::string& op, const ControlResponse& response,
               bool json) {
  const proto::Message& m = response.message;
  if (const auto* r = std::get_if<proto::ControlReply>(&m)) {
    if (r->code != proto::ErrorCode::kOk) {
      return Refused(r->code, r->message, json);
    }
    if (json) {
      std::cout << Json{{"ok", true}, {"message", Str(r->message)}}.dump(
                       -1, ' ', false, Json::error_handler_t::replace)
                << '\n';
    } else {
      std::cout << (r->message.empty() ? std::string("ok") : Str(r->message))
                << '\n';
    }
    return 0;
  }
  if (const auto* w = std::get_if<proto::WorkersReply>(&m);
      w != nullptr && op == "workers") {
    return PrintWorkers(*w, json);
  }
  if (const auto* s = std::get_if<proto::StatsReply>(&m);
      s != nullptr && op == "stats") {
    return PrintStats(*s, json);
  }
  std::cerr << "unexpected reply (command "
            << static_cast<int>(proto::CommandOf(m)) << ") to " << op << '\n';
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app{"fleet-ctl: inspect and steer a fleet broker.\nExit 0 on success, 1 when the "
               "broker refuses the request, 2 on no answer or bad usage, 3 when the broker "
               "refuses the handshake (authentication failed)."};
  app.add_option("--control", config.control, "broker control endpoint")
      ->capture_default_str();
  app.add_option("--timeout-ms", config.timeout_ms,
                 "give up when the broker has not answered by then")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  app.add_flag("--json", config.json, "machine-readable output");
  app.add_option("--log-level", config.log_level,
                 "trace, debug, info, warn, error, off")
      ->capture_default_str();
  app.require_subcommand(1);
  // The program's own flags work after the subcommand too
  // (`fleet-ctl workers --json` as well as `fleet-ctl --json workers`):
  // subcommands created below inherit this and hand what they do not know
  // to the program.
  app.fallthrough();
  CLI::App* workers = app.add_subcommand("workers", "list workers");
  CLI::App* stats = app.add_subcommand("stats", "queue depths and counters");
  CLI::App* retire =
      app.add_subcommand("retire", "stop sending a worker work; it drains");
  retire->add_option("id", config.worker_id, "worker id")->required();
  retire->add_flag("--if-idle", config.if_idle,
                   "refuse if the worker holds work right now");
  CLI::App* unretire =
      app.add_subcommand("unretire", "take back a retiring worker");
  unretire->add_option("id", config.worker_id, "worker id")->required();
  CLI::App* keygen = app.add_subcommand(
      "keygen", "write a CURVE key pair: NAME.key (secret, mode 0600) and NAME.pub");
  keygen->add_option("name", config.keygen_name, "path and name of the files, e.g. keys/worker")
      ->required();
  fleet::AddCurveClientFlags(app, &config.curve_server_key, &config.curve_key);
  int rc = fleet::ParseFlags(app, argc, argv);
  if (rc >= 0) return rc == 0 ? 0 : 2;

  if (keygen->parsed()) {
    try {
      fleet::CurveKeyPair keys = fleet::GenerateKeyPair();
      fleet::WriteKeyPair(config.keygen_name, keys);
      std::cout << "wrote " << config.keygen_name << ".key (secret) and " << config.keygen_name
                << ".pub (public " << keys.public_key << ")\n";
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "fleet-ctl keygen: " << e.what() << '\n';
      return 2;
    }
  }

  std::string op;
  std::vector<std::string_view> args;
  if (workers->parsed()) op = "workers";
  if (stats->parsed()) op = "stats";
  if (retire->parsed()) op = config.if_idle ? "retire-if-idle" : "retire";
  if (unretire->parsed()) op = "unretire";
  if (retire->parsed() || unretire->parsed()) args.push_back(config.worker_id);

  try {
    fleet::SetupLogging("fleet-ctl", config.log_level);
    zmq::context_t context(1);
    ControlClient::Options options;
    options.endpoint = config.control;
    options.socket.linger_ms = 0;  // a request nobody took is not worth a wait
    options.socket.curve = fleet::LoadCurveClient(config.curve_server_key, config.curve_key);
    ControlClient client(context, options);
    proto::Control request;
    request.op = op;
    request.args = args;
    auto response =
        client.Call(request, std::chrono::milliseconds(config.timeout_ms));
    if (!response) {
      std::cerr << "no answer from " << config.control << " within "
                << config.timeout_ms << " ms: is fleet-broker running?\n";
      return 2;
    }
    return PrintReply(op, *response, config.json);
  } catch (const fleet::AuthenticationError& e) {
    std::cerr << "fleet-ctl: " << e.what() << '\n';
    return fleet::kAuthFailed;
  } catch (const std::exception& e) {
    std::cerr << "fleet-ctl: " << e.what() << '\n';
    return 2;
  }
}

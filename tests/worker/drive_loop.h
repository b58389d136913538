// Drives a ProcessHandler as the worker's loop does (Submit, PollItems,
// Service), for the process handler's tests.
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "worker/process_handler.h"

namespace fleet::worker {

// Runs `tasks` until `want` batches are done or `limit` passes; returns the
// completions by id. `each_turn`, when given, runs on every turn after the
// completions so far are collected and before the loop decides to stop
// (the objects tests answer the handlers' gets there).
inline std::map<std::string, Completion> DriveLoop(
    ProcessHandler& h, std::vector<Task> tasks, std::size_t want,
    const ProcessHandler::Limits& limits = {},
    std::chrono::seconds limit = std::chrono::seconds(30),
    const std::function<void()>& each_turn = {}) {
  std::map<std::string, Completion> got;
  std::vector<Completion> done;
  h.Submit(tasks, limits, &done);
  const auto end = std::chrono::steady_clock::now() + limit;
  std::vector<zmq::pollitem_t> items;
  while (true) {
    for (Completion& c : done) got.emplace(std::string(c.id()), std::move(c));
    done.clear();
    if (each_turn) each_turn();
    if (got.size() >= want || std::chrono::steady_clock::now() >= end) break;
    items.clear();
    items.push_back({nullptr, h.ready_fd(), ZMQ_POLLIN, 0});
    h.PollItems(&items);
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(20));
    if (items[0].revents != 0) h.AckReady();
    h.Service(items.data() + 1, items.size() - 1, limits, &done);
  }
  return got;
}

}  // namespace fleet::worker

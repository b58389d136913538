// Waiting on a condition with a bound, never a fixed sleep.
#pragma once

#include <chrono>
#include <functional>

namespace fleet::testing {

// Polls `cond` until it is true or `timeout` passes; returns its last value.
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace fleet::testing

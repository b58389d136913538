// Helpers the launcher tests share.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "autoscaler/docker_launcher.h"

namespace fleet::autoscaler::testing {

// What `f` throws, or "(nothing thrown)".
inline std::string ThrownBy(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// Engine calls run on the launcher's own threads: lets them finish what
// they were asked, then polls, `rounds` times (a Poll applies what finished
// and may queue more: the list, then a reap). Returns every exit reported.
inline std::vector<Exited> Settle(DockerLauncher& l, TimePoint now, int rounds = 3) {
  std::vector<Exited> out;
  for (int i = 0; i < rounds; ++i) {
    EXPECT_TRUE(l.WaitIdle(std::chrono::seconds(20)));
    for (Exited& e : l.Poll(now)) out.push_back(std::move(e));
  }
  EXPECT_TRUE(l.WaitIdle(std::chrono::seconds(20)));
  return out;
}

}  // namespace fleet::autoscaler::testing

// Logging set-up shared by every program: spdlog to stderr, one line per
// event, level from --log-level (trace, debug, info, warn, error).
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace fleet {

// Configures the default logger for program `name`. Throws
// std::invalid_argument on an unknown level.
void SetupLogging(const std::string& name, const std::string& level);

}  // namespace fleet

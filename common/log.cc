#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <stdexcept>

namespace fleet {

void SetupLogging(const std::string& name, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  // from_str maps anything it does not know to "off"; only "off" may mean off.
  if (lvl == spdlog::level::off && level != "off") {
    throw std::invalid_argument("unknown log level '" + level +
                                "' (trace, debug, info, warn, error, off)");
  }
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %n %^%l%$ %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

}  // namespace fleet

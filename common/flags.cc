#include "common/flags.h"

#include <cctype>

namespace fleet {

void AddEnvNames(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (!opt->get_envname().empty() || opt->get_lnames().empty()) continue;
    if (opt->get_lnames().front() == "help") continue;
    std::string env = "FLEET_";
    for (char c : opt->get_lnames().front()) {
      env += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    opt->envname(env);
  }
  for (CLI::App* sub : app.get_subcommands({})) AddEnvNames(*sub);
}

int ParseFlags(CLI::App& app, int argc, char** argv) {
  AddEnvNames(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Prints the message (help to stdout, errors to stderr). CLI11's own
    // codes (105 for a bad value, 109 for an unknown flag, ...) become the
    // usual usage error, 2, for every program.
    return app.exit(e) == 0 ? 0 : kUsageError;
  }
  return -1;
}

}  // namespace fleet

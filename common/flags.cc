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
    return app.exit(e);
  }
  return -1;
}

}  // namespace fleet

// longctx: the command-line front end. Subcommands live one per file (see command.h).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "command.h"
#include "longctx/core/error.h"

namespace longctx::cli {

std::vector<std::pair<std::string, CommandAdder>>& command_registry() {
  static std::vector<std::pair<std::string, CommandAdder>> r;
  return r;
}

CommandRegistration::CommandRegistration(const std::string& name, CommandAdder adder) {
  command_registry().emplace_back(name, std::move(adder));
}

}  // namespace longctx::cli

int main(int argc, char** argv) {
  CLI::App app{"longctx: long-context transformer inference (CPU reference + CUDA)"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version", std::string("longctx ") + LONGCTX_VERSION + " (" + LONGCTX_BUILD_FLAVOR + ")");
  auto& reg = longctx::cli::command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [name, add] : reg) add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const longctx::Error& e) {
    std::fprintf(stderr, "longctx: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

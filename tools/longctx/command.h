// Subcommands register themselves: each tools/longctx/cmd_<name>.cpp defines
//   static CommandRegistration reg("name", [](CLI::App& app) { ... });
// so adding a subcommand never edits main.cpp. The callback adds the subcommand to `app`
// (with its own options and a final_callback/callback that runs it).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace longctx::cli {

using CommandAdder = std::function<void(CLI::App& app)>;

struct CommandRegistration {
  CommandRegistration(const std::string& name, CommandAdder adder);
};

std::vector<std::pair<std::string, CommandAdder>>& command_registry();

}  // namespace longctx::cli

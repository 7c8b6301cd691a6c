// Runs the built `longctx` binary from the CLI tests. It is found next to the tests' build
// folder (build/tests/test_cli -> build/longctx), or at $LONGCTX_CLI.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace longctx::testing {

inline std::string cli_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("LONGCTX_CLI")) return env;
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "longctx").string();
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct CliResult {
  int rc = -1;      // exit status (-1: killed)
  std::string out;  // stdout
  std::string err;  // stderr
};

// `longctx <args>` (args are shell words: quote paths).
inline CliResult run_cli(const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("longctx_cli_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string cmd = "'" + cli_path() + "' " + args + " > '" + (dir / "out").string() +
                          "' 2> '" + (dir / "err").string() + "'";
  const int rc = std::system(cmd.c_str());
  CliResult r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(dir / "out"), slurp(dir / "err")};
  fs::remove_all(dir);
  return r;
}

}  // namespace longctx::testing

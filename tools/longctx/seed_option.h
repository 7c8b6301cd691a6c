// --seed and --engine-seed: a signed 64-bit integer, the range vLLM accepts for a request's seed
// (the server's `seed` field takes the same); anything else (past the range, not a number) is
// an error naming the flag instead of a value wrapped modulo 2^64.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace longctx::cli {

// The generator's 64-bit seed of `text` (its two's-complement bits); Error(kInvalidArgument)
// naming `flag` otherwise.
uint64_t parse_seed(std::string_view text, const std::string& flag);

CLI::Option* add_seed_option(CLI::App& cmd, const std::string& name, std::optional<uint64_t>& seed,
                             const std::string& help);
CLI::Option* add_seed_option(CLI::App& cmd, const std::string& name, uint64_t& seed,
                             const std::string& help);

}  // namespace longctx::cli

#include "seed_option.h"

#include <charconv>

#include "longctx/core/error.h"

namespace longctx::cli {

uint64_t parse_seed(std::string_view text, const std::string& flag) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range) {
    LONGCTX_THROW(ErrorCode::kInvalidArgument,
                  "{} '{}' is outside the signed 64-bit range [-2^63, 2^63 - 1]", flag, text);
  }
  if (ec != std::errc() || p != end || text.empty()) {
    LONGCTX_THROW(ErrorCode::kInvalidArgument, "{} '{}' is not an integer", flag, text);
  }
  return static_cast<uint64_t>(v);
}

CLI::Option* add_seed_option(CLI::App& cmd, const std::string& name, std::optional<uint64_t>& seed,
                             const std::string& help) {
  return cmd.add_option_function<std::string>(
      name, [&seed, name](const std::string& s) { seed = parse_seed(s, name); },
      help + " (a signed 64-bit integer)");
}

CLI::Option* add_seed_option(CLI::App& cmd, const std::string& name, uint64_t& seed,
                             const std::string& help) {
  return cmd.add_option_function<std::string>(
      name, [&seed, name](const std::string& s) { seed = parse_seed(s, name); },
      help + " (a signed 64-bit integer)");
}

}  // namespace longctx::cli

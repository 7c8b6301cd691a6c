#include "longctx/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <optional>

#include "longctx/core/error.h"

namespace longctx {

namespace {

// spdlog::level::from_str maps an unknown name to "off", which would silently hide every
// warning after a typo, so names are checked here.
std::optional<spdlog::level::level_enum> parse_level(const std::string& name) {
  static const std::pair<const char*, spdlog::level::level_enum> kNames[] = {
      {"trace", spdlog::level::trace},  {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},    {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"err", spdlog::level::err},      {"critical", spdlog::level::critical},
      {"off", spdlog::level::off}};
  for (const auto& [n, level] : kNames)
    if (name == n) return level;
  return std::nullopt;
}

const char* const kLevelNames = "trace, debug, info, warn, error, critical, off";

}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = spdlog::stderr_color_mt("longctx");
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    l->set_level(spdlog::level::warn);
    if (const char* env = std::getenv("LONGCTX_LOG_LEVEL")) {
      if (auto level = parse_level(env))
        l->set_level(*level);
      else  // no throwing from here (first use of the logger); say it and keep the default
        l->warn("LONGCTX_LOG_LEVEL='{}' is not a log level ({}); using warn", env, kLevelNames);
    }
    return l;
  }();
  return *log;
}

void set_log_level(const std::string& level) {
  auto parsed = parse_level(level);
  LONGCTX_CHECK(parsed.has_value(), ErrorCode::kInvalidArgument,
                "unknown log level '{}' (use one of: {})", level, kLevelNames);
  logger().set_level(*parsed);
}

}  // namespace longctx

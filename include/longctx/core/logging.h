// Logging through spdlog (header-only). One named logger, level from LONGCTX_LOG_LEVEL
// (trace, debug, info, warn, error, critical, off; default warn so CLI output stays clean).
#pragma once

#include <spdlog/spdlog.h>

namespace longctx {

spdlog::logger& logger();
// Throws Error(kInvalidArgument) for a name that is not a level (rather than turning logging off).
void set_log_level(const std::string& level);

}  // namespace longctx

#define LONGCTX_LOG_DEBUG(...) ::longctx::logger().debug(__VA_ARGS__)
#define LONGCTX_LOG_INFO(...) ::longctx::logger().info(__VA_ARGS__)
#define LONGCTX_LOG_WARN(...) ::longctx::logger().warn(__VA_ARGS__)
#define LONGCTX_LOG_ERROR(...) ::longctx::logger().error(__VA_ARGS__)

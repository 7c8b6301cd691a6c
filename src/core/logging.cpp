#include "longctx/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace longctx {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = spdlog::stderr_color_mt("longctx");
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    const char* env = std::getenv("LONGCTX_LOG_LEVEL");
    l->set_level(env ? spdlog::level::from_str(env) : spdlog::level::warn);
    return l;
  }();
  return *log;
}

void set_log_level(const std::string& level) { logger().set_level(spdlog::level::from_str(level)); }

}  // namespace longctx

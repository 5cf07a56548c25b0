#include "meshlearn/base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace meshlearn {

Status SetLogLevel(std::string_view level) {
  static const std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [name, lvl] : kLevels) {
    if (name == level) {
      spdlog::set_level(lvl);
      return Status::Ok();
    }
  }
  return InvalidArgument("--log-level: unknown level '" + std::string(level) +
                         "'; use one of trace, debug, info, warn, error, off");
}

void InitLogging(std::string_view level) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("meshlearn");
    logger->set_pattern("%^%L%$ %H:%M:%S.%e %v");
    spdlog::set_default_logger(logger);
  });
  Status s = SetLogLevel(level);
  CHECK(s.ok()) << s.ToString();
}

}  // namespace meshlearn

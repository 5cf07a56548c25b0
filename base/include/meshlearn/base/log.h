// Logging through spdlog. Library code logs with ML_LOG_* (level-checked, cheap when off):
//
//   ML_LOG_INFO("round {} finished: loss {:.4f}", round, loss);
//
// Logs go to stderr so stdout stays clean for command output and --json.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

#include "meshlearn/base/status.h"

namespace meshlearn {

// level: trace, debug, info, warn, error, off. Error names the flag and the accepted values.
Status SetLogLevel(std::string_view level);
// Stderr logger with a compact pattern; idempotent.
void InitLogging(std::string_view level = "info");

}  // namespace meshlearn

#define ML_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define ML_LOG_DEBUG(...) spdlog::debug(__VA_ARGS__)
#define ML_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define ML_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define ML_LOG_ERROR(...) spdlog::error(__VA_ARGS__)

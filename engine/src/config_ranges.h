// Positional builders for base/config.h's IntRange / DoubleRange, shared by the engine's spec
// parsers (model, optimizer, task): IRange(1, std::nullopt) reads better than a designated
// initializer at the many call sites that set both bounds.
#pragma once

#include <cstdint>
#include <optional>

#include "meshlearn/base/config.h"

namespace meshlearn::engine {

inline IntRange IRange(std::optional<int64_t> min, std::optional<int64_t> max) {
  IntRange r;
  r.min = min;
  r.max = max;
  return r;
}

inline DoubleRange DRange(std::optional<double> min, std::optional<double> max,
                          bool min_exclusive, bool max_exclusive) {
  DoubleRange r;
  r.min = min;
  r.max = max;
  r.min_exclusive = min_exclusive;
  r.max_exclusive = max_exclusive;
  return r;
}

}  // namespace meshlearn::engine

// Which kernel path runs and on how many threads. The choice never changes results (that is the
// determinism contract); it exists so tests and users can prove it.
//
// Environment (read once at start-up, overridable in code):
//   MESHLEARN_SIMD    = auto | scalar | avx2 | avx512   (auto: the widest the CPU supports)
//   MESHLEARN_THREADS = N                                (default: hardware threads)
//
// A future CUDA backend plugs in here: the kernel table (KernelTable) is the seam; a backend
// provides the same functions with the same bits.
#pragma once

#include <string>

#include "meshlearn/base/status.h"

namespace meshlearn::engine {

enum class SimdPath { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view SimdPathName(SimdPath p);
Result<SimdPath> ParseSimdPath(std::string_view name);  // "auto" resolves to the best supported
bool SimdPathSupported(SimdPath p);

struct KernelConfig {
  SimdPath simd = SimdPath::kScalar;
  int threads = 1;
};

// The active configuration (process-wide). Thread-safe to read; set it before running kernels.
const KernelConfig& GetKernelConfig();
// Fails if the CPU lacks the path or threads < 1.
Status SetKernelConfig(KernelConfig config);
// Applies MESHLEARN_SIMD / MESHLEARN_THREADS; errors name the variable and the accepted values.
Status ConfigureFromEnv();

}  // namespace meshlearn::engine

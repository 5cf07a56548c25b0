// What the CPU can do, detected at run time. The engine picks its kernels from this.
#pragma once

#include <string>

namespace meshlearn {

struct CpuFeatures {
  bool sse42 = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  // "avx2 fma avx512f ..." in a fixed order; "none" when empty.
  std::string ToString() const;
};

const CpuFeatures& GetCpuFeatures();
// The CPU's model name from /proc/cpuinfo, "unknown" if it cannot be read.
std::string CpuModelName();

}  // namespace meshlearn

// The avx512 build of the fast kernels (kernels_impl.h). Compiled with ISA flags (CMakeLists.txt);
// backend.cc only selects this table after checking the CPU supports them.
#define MESHLEARN_SIMD_LEVEL 2
#define MESHLEARN_SIMD_NS avx512
// clang-format off
#include "simd.h"
#include "math_impl.h"
#include "kernels_impl.h"
// clang-format on

namespace meshlearn::engine::internal {

const KernelTable& Avx512KernelTable() {
  static const KernelTable table = avx512::MakeTable();
  return table;
}

}  // namespace meshlearn::engine::internal

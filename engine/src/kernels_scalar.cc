// The scalar build of the fast kernels (kernels_impl.h).
#define MESHLEARN_SIMD_LEVEL 0
#define MESHLEARN_SIMD_NS scalar
// clang-format off
#include "simd.h"
#include "math_impl.h"
#include "kernels_impl.h"
// clang-format on

namespace meshlearn::engine::internal {

const KernelTable& ScalarKernelTable() {
  static const KernelTable table = scalar::MakeTable();
  return table;
}

}  // namespace meshlearn::engine::internal

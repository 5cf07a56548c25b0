// Scalar entry points of math.h. The polynomials live in math_impl.h, shared with the SIMD
// kernel TUs, so ExpArray on AVX-512 and Exp here run the same operation sequence.
#define MESHLEARN_SIMD_LEVEL 0
#define MESHLEARN_SIMD_NS mathscalar
#include "meshlearn/engine/math.h"

#include "kernels_internal.h"
// clang-format off
#include "simd.h"
#include "math_impl.h"
// clang-format on

namespace meshlearn::engine {

float Exp(float x) { return mathscalar::ExpV({x}).v; }
float Log(float x) { return mathscalar::LogV({x}).v; }
float Tanh(float x) { return mathscalar::TanhV({x}).v; }
float Erf(float x) { return mathscalar::ErfV({x}).v; }

void ExpArray(float* y, const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  internal::ActiveKernelTable().exp_array(y, x, n);
}
void LogArray(float* y, const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  internal::ActiveKernelTable().log_array(y, x, n);
}
void TanhArray(float* y, const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  internal::ActiveKernelTable().tanh_array(y, x, n);
}
void ErfArray(float* y, const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  internal::ActiveKernelTable().erf_array(y, x, n);
}

}  // namespace meshlearn::engine

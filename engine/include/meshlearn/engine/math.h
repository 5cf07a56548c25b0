// The engine's own transcendental functions. libm differs between libc versions and CPUs, so no
// kernel calls it: these are fixed polynomial sequences with explicit fused multiply-adds, and the
// scalar and SIMD (AVX2, AVX-512) builds give identical bits for every input.
//
// Accuracy in float32 ulps against double-precision libm, measured by math_test.cc over dense
// sweeps (see the test for the exact ranges):
//   Exp   |x| <= 87        <= 2 ulp    (x > 88.7228 -> +inf, x < -103.97 -> 0)
//   Log   x in (0, inf)    <= 2 ulp
//   Tanh  all x            <= 3 ulp
//   Erf   all x            <= 4 ulp
// Special values: NaN propagates; Log(0) = -inf, Log(x<0) = NaN.
#pragma once

#include <cstdint>

namespace meshlearn::engine {

float Exp(float x);
float Log(float x);
float Tanh(float x);
float Erf(float x);

// y[i] = f(x[i]) on the active SIMD path (backend.h); bitwise equal to the scalar functions.
// y and x may be the same buffer.
void ExpArray(float* y, const float* x, int64_t n);
void LogArray(float* y, const float* x, int64_t n);
void TanhArray(float* y, const float* x, int64_t n);
void ErfArray(float* y, const float* x, int64_t n);

}  // namespace meshlearn::engine

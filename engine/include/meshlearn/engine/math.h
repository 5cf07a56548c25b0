// The engine's own transcendental functions. libm differs between libc versions and CPUs, so no
// kernel calls it: these are fixed polynomial sequences with explicit fused multiply-adds, and the
// scalar and SIMD (AVX2, AVX-512) builds give identical bits for every input.
//
// Accuracy in float32 ulps against double-precision libm, measured by math_test.cc over dense
// sweeps plus random points (measured max / bound the test enforces):
//   Exp   x in [-87, 88.7]        1.01 / 2 ulp  (subnormal results [-103.9, -87]: 0.75 ulp)
//   Log   all positive floats     0.83 / 2 ulp  (subnormal inputs included)
//   Tanh  x in [-12, 12]          1.29 / 3 ulp
//   Erf   x in [-6, 6]            2.24 / 4 ulp
// x > 88.7228 -> Exp = +inf, x < -103.97 -> Exp = 0.
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

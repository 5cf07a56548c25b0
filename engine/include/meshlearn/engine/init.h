// Deterministic parameter initialisation and the few transcendentals the training side needs
// outside the kernels (normal sampling, cosine learning-rate schedule).
//
// Every value is a pure function of (seed, stream, index) through Philox4x32 (base/rng.h), and
// every transcendental is a fixed sequence of IEEE double operations (+ - * / sqrt only; no libm),
// so the same seed gives the same bits on every machine, compiler and C library.
//
//   FillNormal(w.data(), w.size(), /*std=*/0.02f, seed, /*stream=*/param_index);
#pragma once

#include <cstdint>

namespace meshlearn::engine {

// Natural log for x > 0 (finite). Accurate to a few ulp of double.
double DetLog(double x);
// cos(2*pi*u) for u in [0, 1). Accurate to a few ulp of double.
double DetCos2Pi(double u);
// cos(x) for any finite x (reduces by 2*pi in double first).
double DetCos(double x);

// Standard normal sample number `index` of stream (seed, stream): Box-Muller on one Philox block.
float NormalSample(uint64_t seed, uint64_t stream, uint64_t index);

// x[i] = std * NormalSample(seed, stream, i).
void FillNormal(float* x, int64_t n, float std, uint64_t seed, uint64_t stream);
// x[i] uniform in [-bound, bound): bound * (2u - 1), u from the top 24 bits of Philox.
void FillUniform(float* x, int64_t n, float bound, uint64_t seed, uint64_t stream);

}  // namespace meshlearn::engine

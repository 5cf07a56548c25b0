// Internal: the per-SIMD-path kernel tables and the constants shared by reference and fast
// kernels (one definition, so both compute the same expressions).
#pragma once

#include <cstdint>

#include "meshlearn/engine/kernels.h"

namespace meshlearn::engine::internal {

inline constexpr float kLayerNormEps = 1e-5f;
inline constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluK1 = 0.044715f;
inline constexpr float kGelu3K1 = 3.0f * 0.044715f;

// One entry per fast kernel; a SIMD path provides the whole table.
struct KernelTable {
  void (*linear_forward)(float*, const float*, const float*, const float*, int64_t, int64_t,
                         int64_t);
  void (*linear_backward)(float*, float*, float*, const float*, const float*, const float*, int64_t,
                          int64_t, int64_t);
  void (*linear_relu_forward)(float*, const float*, const float*, const float*, int64_t, int64_t,
                              int64_t);
  void (*linear_relu_backward)(float*, float*, float*, const float*, const float*, const float*,
                               int64_t, int64_t, int64_t);
  void (*linear_backward_overwrite)(float*, float*, float*, const float*, const float*,
                                    const float*, int64_t, int64_t, int64_t);
  void (*conv2d_forward)(float*, const float*, const float*, const float*, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
  void (*conv2d_backward)(float*, float*, float*, const float*, const float*, const float*, int64_t,
                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
  void (*conv2d_backward_overwrite)(float*, float*, float*, const float*, const float*,
                                    const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                    int64_t, int64_t, int64_t, int64_t);
  void (*conv2d_relu_forward)(float*, const float*, const float*, const float*, int64_t, int64_t,
                              int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
  void (*maxpool2d_forward)(float*, int32_t*, const float*, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int64_t);
  void (*maxpool2d_backward)(float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                             int64_t);
  void (*maxpool2d_relu_backward)(float*, float*, const float*, const int32_t*, const float*,
                                  int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
  void (*relu_forward)(float*, const float*, int64_t);
  void (*relu_backward)(float*, const float*, const float*, int64_t);
  void (*gelu_forward)(float*, const float*, int64_t);
  void (*gelu_backward)(float*, const float*, const float*, int64_t);
  void (*gelu_backward_overwrite)(float*, const float*, const float*, int64_t);
  float (*softmax_ce_forward)(float*, float*, const float*, const int32_t*, int64_t, int64_t);
  void (*softmax_ce_backward)(float*, const float*, const int32_t*, float, int64_t, int64_t);
  void (*layernorm_forward)(float*, float*, float*, const float*, const float*, const float*,
                            int64_t, int64_t);
  void (*layernorm_backward)(float*, float*, float*, const float*, const float*, const float*,
                             const float*, const float*, int64_t, int64_t);
  void (*embedding_forward)(float*, const int32_t*, const float*, int64_t, int64_t);
  void (*embedding_backward)(float*, const float*, const int32_t*, int64_t, int64_t, int64_t);
  void (*attention_forward)(float*, float*, float*, const float*, int64_t, int64_t, int64_t,
                            int64_t);
  void (*attention_backward)(float*, float*, float*, const float*, const float*, const float*,
                             int64_t, int64_t, int64_t, int64_t);
  void (*residual_forward)(float*, const float*, const float*, int64_t);
  void (*residual_backward)(float*, float*, const float*, int64_t);
  void (*residual_backward_overwrite)(float*, float*, const float*, int64_t);
  void (*dropout_forward)(float*, float*, const float*, int64_t, float, uint64_t, uint64_t);
  void (*dropout_backward)(float*, const float*, const float*, int64_t);
  void (*adamw_update)(float*, float*, float*, float*, int64_t, const AdamWStep&);
  float (*sum_tree)(const float*, int64_t);
  float (*sum_squares_tree)(const float*, int64_t);
  void (*sum_squares_blocks)(const float*, int64_t, float*);
  void (*exp_array)(float*, const float*, int64_t);
  void (*log_array)(float*, const float*, int64_t);
  void (*tanh_array)(float*, const float*, int64_t);
  void (*erf_array)(float*, const float*, int64_t);
};

const KernelTable& ScalarKernelTable();
#if defined(MESHLEARN_ENGINE_X86)
const KernelTable& Avx2KernelTable();
const KernelTable& Avx512KernelTable();
#endif
// The table of the active SIMD path (backend.h).
const KernelTable& ActiveKernelTable();
// The active thread count (backend.h); a plain function so SIMD TUs need no STL.
int ActiveThreads();

// The dropout draw of element i: U32ToUnitFloat(Philox4x32({i_lo, i_hi, stream_lo, stream_hi},
// {seed_lo, seed_hi})[0]). Out of line in a baseline TU so SIMD TUs need no STL or base inlines.
float DropoutUniform(uint64_t i, uint64_t seed, uint64_t stream);
// Element i's dropout mask (kernels.h's DropoutForward): keep_scale = 1 / (1 - p) where its draw
// is >= p, else 0. Every dropout kernel and the tile rule's recompute of one tile (tile_rule.h)
// draw it here, so a tile's mask is the whole tensor's, element by element.
inline float DropoutMaskAt(uint64_t i, float p, float keep_scale, uint64_t seed, uint64_t stream) {
  return DropoutUniform(i, seed, stream) >= p ? keep_scale : 0.0f;
}

// Puts the calling thread's floating-point environment in the state every kernel assumes (x86:
// MXCSR round-to-nearest, no flush-to-zero, no denormals-are-zero) for the guard's lifetime and
// restores it afterwards. Another library (or user code) that enables FTZ/DAZ would otherwise
// change results silently.
class FpEnvGuard {
 public:
  FpEnvGuard();
  ~FpEnvGuard();
  FpEnvGuard(const FpEnvGuard&) = delete;
  FpEnvGuard& operator=(const FpEnvGuard&) = delete;

 private:
  unsigned saved_;
};
// Sets the calling thread's floating-point control state to the canonical one (no restore).
void SetCanonicalFpEnv();

// The fixed pairwise tree over n >= 1 block partials, in place (the last step of SumTree and
// SumSquaresTree, kernels.h): level by level p[i] = p[2i] + p[2i+1], an odd last element moving
// up unchanged; returns the root. Inline: the SIMD TUs run it too. The one copy of that order.
inline float CombinePartialsTree(float* p, int64_t n) {
  while (n > 1) {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; ++i) p[i] = p[2 * i] + p[2 * i + 1];
    if (n % 2 == 1) p[half] = p[n - 1];
    n = half + n % 2;
  }
  return p[0];
}

// Checks shared by reference and fast kernels; abort with a message on a broken precondition.
void CheckTargets(const int32_t* targets, int64_t B, int64_t V);
void CheckIds(const int32_t* ids, int64_t N, int64_t V);

}  // namespace meshlearn::engine::internal

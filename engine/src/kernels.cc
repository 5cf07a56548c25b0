// The public fast kernels: each forwards to the table of the active SIMD path (backend.h).
#include <array>
#include "kernels_internal.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

#include "meshlearn/base/check.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/kernels.h"

namespace meshlearn::engine {

using internal::ActiveKernelTable;

float SumTree(const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  return ActiveKernelTable().sum_tree(x, n);
}
float SumSquaresTree(const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  return ActiveKernelTable().sum_squares_tree(x, n);
}
void SumSquaresBlocks(const float* x, int64_t n, float* partials) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().sum_squares_blocks(x, n, partials);
}

void LinearForward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                   int64_t C, int64_t OC) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().linear_forward(out, inp, weight, bias, B, C, OC);
}
void LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t B, int64_t C, int64_t OC) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().linear_backward(dinp, dweight, dbias, dout, inp, weight, B, C, OC);
}
void LinearReluForward(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t OC) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().linear_relu_forward(out, inp, weight, bias, B, C, OC);
}
void LinearReluBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int64_t B, int64_t C, int64_t OC) {
  internal::FpEnvGuard fp_guard;
  CHECK(dinp != nullptr) << "LinearReluBackward: dinp is written, it may not be null";
  ActiveKernelTable().linear_relu_backward(dinp, dweight, dbias, dout, inp, weight, B, C, OC);
}
void LinearBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, int64_t B, int64_t C,
                             int64_t OC) {
  internal::FpEnvGuard fp_guard;
  CHECK(dinp != nullptr) << "LinearBackwardOverwrite: dinp is written, it may not be null";
  ActiveKernelTable().linear_backward_overwrite(dinp, dweight, dbias, dout, inp, weight, B, C, OC);
}
void Conv2dForward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                   int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH, int64_t KW,
                   int64_t stride, int64_t pad) {
  internal::FpEnvGuard fp_guard;
  CHECK(stride >= 1 && pad >= 0 && H + 2 * pad >= KH && W + 2 * pad >= KW)
      << "conv2d: bad geometry";
  ActiveKernelTable().conv2d_forward(out, inp, weight, bias, B, C, H, W, OC, KH, KW, stride, pad);
}
void Conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC,
                    int64_t KH, int64_t KW, int64_t stride, int64_t pad) {
  internal::FpEnvGuard fp_guard;
  CHECK(stride >= 1 && pad >= 0 && H + 2 * pad >= KH && W + 2 * pad >= KW)
      << "conv2d: bad geometry";
  CHECK(C * H * W < (int64_t{1} << 31)) << "conv2d: one image must have < 2^31 elements";
  ActiveKernelTable().conv2d_backward(dinp, dweight, dbias, dout, inp, weight, B, C, H, W, OC, KH,
                                      KW, stride, pad);
}
void Conv2dBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, int64_t B, int64_t C, int64_t H,
                             int64_t W, int64_t OC, int64_t KH, int64_t KW, int64_t stride,
                             int64_t pad) {
  internal::FpEnvGuard fp_guard;
  CHECK(dinp != nullptr) << "Conv2dBackwardOverwrite: dinp is written, it may not be null";
  CHECK(stride >= 1 && pad >= 0 && H + 2 * pad >= KH && W + 2 * pad >= KW)
      << "conv2d: bad geometry";
  CHECK(C * H * W < (int64_t{1} << 31)) << "conv2d: one image must have < 2^31 elements";
  ActiveKernelTable().conv2d_backward_overwrite(dinp, dweight, dbias, dout, inp, weight, B, C, H, W,
                                                OC, KH, KW, stride, pad);
}
void Conv2dReluForward(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH,
                       int64_t KW, int64_t stride, int64_t pad) {
  internal::FpEnvGuard fp_guard;
  CHECK(stride >= 1 && pad >= 0 && H + 2 * pad >= KH && W + 2 * pad >= KW)
      << "conv2d: bad geometry";
  ActiveKernelTable().conv2d_relu_forward(out, inp, weight, bias, B, C, H, W, OC, KH, KW, stride,
                                          pad);
}
void MaxPool2dForward(float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C,
                      int64_t H, int64_t W, int64_t k, int64_t s) {
  internal::FpEnvGuard fp_guard;
  CHECK(k >= 1 && s >= 1 && H >= k && W >= k) << "maxpool2d: bad geometry";
  ActiveKernelTable().maxpool2d_forward(out, argmax, inp, B, C, H, W, k, s);
}
void MaxPool2dBackward(float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                       int64_t OH, int64_t OW) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().maxpool2d_backward(dinp, dout, argmax, B, C, OH, OW);
}
void MaxPool2dReluBackward(float* dinp, float* dbias, const float* dout, const int32_t* argmax,
                           const float* out, int64_t B, int64_t C, int64_t H, int64_t W, int64_t OH,
                           int64_t OW) {
  internal::FpEnvGuard fp_guard;
  CHECK(dinp != nullptr) << "MaxPool2dReluBackward: dinp is written, it may not be null";
  ActiveKernelTable().maxpool2d_relu_backward(dinp, dbias, dout, argmax, out, B, C, H, W, OH, OW);
}
void ReluForward(float* out, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().relu_forward(out, inp, n);
}
void ReluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().relu_backward(dinp, dout, inp, n);
}
void GeluForward(float* out, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().gelu_forward(out, inp, n);
}
void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().gelu_backward(dinp, dout, inp, n);
}
void GeluBackwardOverwrite(float* dinp, const float* dout, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().gelu_backward_overwrite(dinp, dout, inp, n);
}
float SoftmaxCrossEntropyForward(float* probs, float* losses, const float* logits,
                                 const int32_t* targets, int64_t B, int64_t V) {
  internal::FpEnvGuard fp_guard;
  internal::CheckTargets(targets, B, V);
  return ActiveKernelTable().softmax_ce_forward(probs, losses, logits, targets, B, V);
}
void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int64_t B, int64_t V) {
  internal::FpEnvGuard fp_guard;
  internal::CheckTargets(targets, B, V);
  ActiveKernelTable().softmax_ce_backward(dlogits, probs, targets, dloss, B, V);
}
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
}
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t N, int64_t C) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().embedding_forward(out, ids, table, N, C);
}
void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                       int64_t V) {
  internal::FpEnvGuard fp_guard;
  internal::CheckIds(ids, N, V);
  ActiveKernelTable().embedding_backward(dtable, dout, ids, N, C, V);
}
void AttentionForward(float* out, float* preatt, float* att, const float* qkv, int64_t B, int64_t T,
                      int64_t C, int64_t NH) {
  internal::FpEnvGuard fp_guard;
  CHECK(NH >= 1 && C % NH == 0) << "attention: C=" << C << " not divisible by NH=" << NH;
  ActiveKernelTable().attention_forward(out, preatt, att, qkv, B, T, C, NH);
}
void AttentionBackward(float* dqkv, float* dpreatt, float* datt, const float* dout,
                       const float* qkv, const float* att, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  internal::FpEnvGuard fp_guard;
  CHECK(NH >= 1 && C % NH == 0) << "attention: C=" << C << " not divisible by NH=" << NH;
  ActiveKernelTable().attention_backward(dqkv, dpreatt, datt, dout, qkv, att, B, T, C, NH);
}
void ResidualForward(float* out, const float* a, const float* b, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().residual_forward(out, a, b, n);
}
void ResidualBackward(float* da, float* db, const float* dout, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().residual_backward(da, db, dout, n);
}
void ResidualBackwardOverwrite(float* da, float* db, const float* dout, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().residual_backward_overwrite(da, db, dout, n);
}
void DropoutForward(float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed,
                    uint64_t stream) {
  internal::FpEnvGuard fp_guard;
  CHECK(p >= 0.0f && p < 1.0f) << "dropout: p must be in [0, 1), got " << p;
  ActiveKernelTable().dropout_forward(out, mask, inp, n, p, seed, stream);
}
void DropoutBackward(float* dinp, const float* dout, const float* mask, int64_t n) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().dropout_backward(dinp, dout, mask, n);
}
void AdamWUpdate(float* w, float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  internal::FpEnvGuard fp_guard;
  ActiveKernelTable().adamw_update(w, g, m, v, n, s);
}

namespace internal {

namespace {
constexpr unsigned kCanonicalMxcsr = 0x1F80;    // all exceptions masked, round to nearest
constexpr unsigned kMxcsrControlMask = 0xFFC0;  // everything but the sticky status flags
}  // namespace

#if defined(__x86_64__) || defined(_M_X64)
FpEnvGuard::FpEnvGuard() : saved_(_mm_getcsr()) {
  if ((saved_ & kMxcsrControlMask) != kCanonicalMxcsr) _mm_setcsr(kCanonicalMxcsr);
}
FpEnvGuard::~FpEnvGuard() {
  if ((saved_ & kMxcsrControlMask) != kCanonicalMxcsr) _mm_setcsr(saved_);
}
void SetCanonicalFpEnv() {
  if ((_mm_getcsr() & kMxcsrControlMask) != kCanonicalMxcsr) _mm_setcsr(kCanonicalMxcsr);
}
#else
FpEnvGuard::FpEnvGuard() : saved_(0) {}
FpEnvGuard::~FpEnvGuard() {}
void SetCanonicalFpEnv() {}
#endif

float DropoutUniform(uint64_t i, uint64_t seed, uint64_t stream) {
  const std::array<uint32_t, 4> r =
      Philox4x32({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32),
                  static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return U32ToUnitFloat(r[0]);
}

void CheckTargets(const int32_t* targets, int64_t B, int64_t V) {
  for (int64_t b = 0; b < B; ++b) {
    CHECK(targets[b] >= 0 && targets[b] < V) << "softmax cross-entropy: target[" << b
                                             << "] = " << targets[b] << " not in [0, " << V << ")";
  }
}

void CheckIds(const int32_t* ids, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    CHECK(ids[n] >= 0 && ids[n] < V)
        << "embedding: id[" << n << "] = " << ids[n] << " not in [0, " << V << ")";
  }
}

}  // namespace internal
}  // namespace meshlearn::engine

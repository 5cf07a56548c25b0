// Reference kernels: plain single-threaded loops that DEFINE the canonical order of every
// floating-point operation. The fast kernels (kernels_impl.h) must match them bit for bit; when
// in doubt about what an op computes, this file is the specification.
//
// Conventions used below (and by the fast kernels):
//  * a "chain" is acc = init; for k in order: acc = fma(a_k, b_k, acc) (or acc = acc + x_k for
//    plain sums). Zero-padding positions of a convolution and masked positions of attention are
//    PART of the chain with a 0 operand: fma(0, w, acc). For finite inputs this changes nothing
//    (round-to-nearest never produces -0 from a +0 start), and it lets the fast kernels run
//    dense GEMM tiles.
//  * "d += chain" forms the whole chain first, then does one add into d.
#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "kernels_internal.h"
#include "meshlearn/base/check.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/kernels.h"
#include "meshlearn/engine/math.h"

namespace meshlearn::engine::ref {
namespace {

inline float Fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

}  // namespace

namespace {
// The block partials of ref::SumTree / ref::SumSquaresTree (kernels.h), one per kSumBlock block.
std::vector<float> BlockPartialsRef(const float* x, int64_t n, bool squares) {
  std::vector<float> partials;
  for (int64_t b0 = 0; b0 < n; b0 += kSumBlock) {
    int64_t b1 = b0 + kSumBlock < n ? b0 + kSumBlock : n;
    float acc = 0.0f;
    for (int64_t i = b0; i < b1; ++i) acc = squares ? Fma(x[i], x[i], acc) : acc + x[i];
    partials.push_back(acc);
  }
  return partials;
}
}  // namespace

float SumTreeRef(const float* x, int64_t n, bool squares) {
  std::vector<float> partials = BlockPartialsRef(x, n, squares);
  return partials.empty() ? 0.0f
                          : internal::CombinePartialsTree(partials.data(),
                                                          static_cast<int64_t>(partials.size()));
}

using internal::kGelu3K1;
using internal::kGeluK0;
using internal::kGeluK1;
using internal::kLayerNormEps;

void LinearForward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                   int64_t C, int64_t OC) {
  internal::FpEnvGuard fp_guard;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t o = 0; o < OC; ++o) {
      float acc = bias != nullptr ? bias[o] : 0.0f;
      for (int64_t c = 0; c < C; ++c) acc = Fma(inp[b * C + c], weight[o * C + c], acc);
      out[b * OC + o] = acc;
    }
  }
}

void LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t B, int64_t C, int64_t OC) {
  internal::FpEnvGuard fp_guard;
  if (dinp != nullptr) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.0f;
        for (int64_t o = 0; o < OC; ++o) acc = Fma(dout[b * OC + o], weight[o * C + c], acc);
        dinp[b * C + c] += acc;
      }
    }
  }
  if (dweight != nullptr) {
    for (int64_t o = 0; o < OC; ++o) {
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.0f;
        for (int64_t b = 0; b < B; ++b) acc = Fma(dout[b * OC + o], inp[b * C + c], acc);
        dweight[o * C + c] += acc;
      }
    }
  }
  if (dbias != nullptr) {
    for (int64_t o = 0; o < OC; ++o) {
      float acc = 0.0f;
      for (int64_t b = 0; b < B; ++b) acc = acc + dout[b * OC + o];
      dbias[o] += acc;
    }
  }
}

// The fused kernels are specified as the two ops they fuse, in the buffers the model used to give
// them (the linear layer's output, or its input gradient in a zeroed buffer, then the ReLU's).
void LinearReluForward(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t OC) {
  LinearForward(out, inp, weight, bias, B, C, OC);
  ReluForward(out, out, B * OC);
}

void LinearReluBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int64_t B, int64_t C, int64_t OC) {
  std::vector<float> linear_dinp(static_cast<size_t>(B * C), 0.0f);
  LinearBackward(linear_dinp.data(), dweight, dbias, dout, inp, weight, B, C, OC);
  std::fill(dinp, dinp + B * C, 0.0f);
  ReluBackward(dinp, linear_dinp.data(), inp, B * C);
}

// The kernels that write an input gradient are specified as the accumulating kernel into a zeroed
// buffer.
void LinearBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, int64_t B, int64_t C,
                             int64_t OC) {
  std::fill(dinp, dinp + B * C, 0.0f);
  LinearBackward(dinp, dweight, dbias, dout, inp, weight, B, C, OC);
}

void Conv2dBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, int64_t B, int64_t C, int64_t H,
                             int64_t W, int64_t OC, int64_t KH, int64_t KW, int64_t stride,
                             int64_t pad) {
  std::fill(dinp, dinp + B * C * H * W, 0.0f);
  Conv2dBackward(dinp, dweight, dbias, dout, inp, weight, B, C, H, W, OC, KH, KW, stride, pad);
}

void Conv2dForward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                   int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH, int64_t KW,
                   int64_t stride, int64_t pad) {
  internal::FpEnvGuard fp_guard;
  const int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t oc = 0; oc < OC; ++oc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          float acc = bias != nullptr ? bias[oc] : 0.0f;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                int64_t ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
                float x = (ih >= 0 && ih < H && iw >= 0 && iw < W)
                              ? inp[((b * C + c) * H + ih) * W + iw]
                              : 0.0f;
                acc = Fma(x, weight[((oc * C + c) * KH + kh) * KW + kw], acc);
              }
          out[((b * OC + oc) * OH + oh) * OW + ow] = acc;
        }
}

void Conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC,
                    int64_t KH, int64_t KW, int64_t stride, int64_t pad) {
  internal::FpEnvGuard fp_guard;
  const int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
  if (dinp != nullptr) {
    // dinp[b,c,ih,iw] += chain over (oc,kh,kw) of fma(g, w[oc,c,kh,kw]) where g is
    // dout[b,oc,oh,ow] when ih = oh*stride - pad + kh (and same for w) has a solution in range,
    // else 0.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t ih = 0; ih < H; ++ih)
          for (int64_t iw = 0; iw < W; ++iw) {
            float acc = 0.0f;
            for (int64_t oc = 0; oc < OC; ++oc)
              for (int64_t kh = 0; kh < KH; ++kh)
                for (int64_t kw = 0; kw < KW; ++kw) {
                  int64_t th = ih + pad - kh, tw = iw + pad - kw;
                  float g = 0.0f;
                  if (th >= 0 && tw >= 0 && th % stride == 0 && tw % stride == 0 &&
                      th / stride < OH && tw / stride < OW) {
                    g = dout[((b * OC + oc) * OH + th / stride) * OW + tw / stride];
                  }
                  acc = Fma(g, weight[((oc * C + c) * KH + kh) * KW + kw], acc);
                }
            dinp[((b * C + c) * H + ih) * W + iw] += acc;
          }
  }
  if (dweight != nullptr) {
    for (int64_t oc = 0; oc < OC; ++oc)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            float acc = 0.0f;
            for (int64_t b = 0; b < B; ++b)
              for (int64_t oh = 0; oh < OH; ++oh)
                for (int64_t ow = 0; ow < OW; ++ow) {
                  int64_t ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
                  float x = (ih >= 0 && ih < H && iw >= 0 && iw < W)
                                ? inp[((b * C + c) * H + ih) * W + iw]
                                : 0.0f;
                  acc = Fma(dout[((b * OC + oc) * OH + oh) * OW + ow], x, acc);
                }
            dweight[((oc * C + c) * KH + kh) * KW + kw] += acc;
          }
  }
  if (dbias != nullptr) {
    for (int64_t oc = 0; oc < OC; ++oc) {
      float acc = 0.0f;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t p = 0; p < OH * OW; ++p) acc = acc + dout[(b * OC + oc) * OH * OW + p];
      dbias[oc] += acc;
    }
  }
}

// As LinearReluForward: the convolution, then the ReLU in place.
void Conv2dReluForward(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH,
                       int64_t KW, int64_t stride, int64_t pad) {
  Conv2dForward(out, inp, weight, bias, B, C, H, W, OC, KH, KW, stride, pad);
  const int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
  ReluForward(out, out, B * OC * OH * OW);
}

void MaxPool2dForward(float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C,
                      int64_t H, int64_t W, int64_t k, int64_t s) {
  internal::FpEnvGuard fp_guard;
  const int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  for (int64_t bc = 0; bc < B * C; ++bc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t best_i = (bc * H + oh * s) * W + ow * s;
        float best = inp[best_i];
        for (int64_t kh = 0; kh < k; ++kh)
          for (int64_t kw = 0; kw < k; ++kw) {
            int64_t i = (bc * H + oh * s + kh) * W + ow * s + kw;
            if (inp[i] > best) {
              best = inp[i];
              best_i = i;
            }
          }
        out[(bc * OH + oh) * OW + ow] = best;
        argmax[(bc * OH + oh) * OW + ow] = static_cast<int32_t>(best_i);
      }
}

void MaxPool2dBackward(float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                       int64_t OH, int64_t OW) {
  internal::FpEnvGuard fp_guard;
  // Overlapping windows add into dinp one output at a time, in increasing output index.
  for (int64_t i = 0; i < B * C * OH * OW; ++i) dinp[argmax[i]] += dout[i];
}

// As LinearReluBackward: the max pool's backward into a zeroed buffer, then the ReLU's into dinp
// zeroed; dbias is the bias gradient of a 1x1 convolution whose output gradient is dinp. The
// ReLU's mask is the pool's output placed at its argmax, 0 elsewhere (where the pool's gradient
// is 0 and any mask gives +0).
void MaxPool2dReluBackward(float* dinp, float* dbias, const float* dout, const int32_t* argmax,
                           const float* out, int64_t B, int64_t C, int64_t H, int64_t W, int64_t OH,
                           int64_t OW) {
  std::vector<float> pool_dinp(static_cast<size_t>(B * C * H * W), 0.0f);
  MaxPool2dBackward(pool_dinp.data(), dout, argmax, B, C, OH, OW);
  std::vector<float> mask(static_cast<size_t>(B * C * H * W), 0.0f);
  for (int64_t i = 0; i < B * C * OH * OW; ++i) mask[static_cast<size_t>(argmax[i])] = out[i];
  std::fill(dinp, dinp + B * C * H * W, 0.0f);
  ReluBackward(dinp, pool_dinp.data(), mask.data(), B * C * H * W);
  if (dbias != nullptr) {
    Conv2dBackward(nullptr, nullptr, dbias, dinp, nullptr, nullptr, B, 1, H, W, C, 1, 1, 1, 0);
  }
}

void ReluForward(float* out, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}
void ReluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) dinp[i] = dinp[i] + (inp[i] > 0.0f ? dout[i] : 0.0f);
}

void GeluForward(float* out, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float cube = (x * x) * x;
    float inner = kGeluK0 * (x + kGeluK1 * cube);
    out[i] = (0.5f * x) * (1.0f + Tanh(inner));
  }
}
void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float cube = (x * x) * x;
    float inner = kGeluK0 * (x + kGeluK1 * cube);
    float t = Tanh(inner);
    float sech2 = 1.0f - t * t;
    float grad = 0.5f * (1.0f + t) + (((0.5f * x) * sech2) * kGeluK0) * (1.0f + (kGelu3K1 * x) * x);
    dinp[i] = dinp[i] + grad * dout[i];
  }
}
// The kernels that write an input gradient are specified as the accumulating kernel into a zeroed
// buffer.
void GeluBackwardOverwrite(float* dinp, const float* dout, const float* inp, int64_t n) {
  std::fill(dinp, dinp + n, 0.0f);
  GeluBackward(dinp, dout, inp, n);
}

float SoftmaxCrossEntropyForward(float* probs, float* losses, const float* logits,
                                 const int32_t* targets, int64_t B, int64_t V) {
  internal::FpEnvGuard fp_guard;
  for (int64_t b = 0; b < B; ++b) {
    const float* x = logits + b * V;
    float* p = probs + b * V;
    float m = x[0];
    for (int64_t v = 1; v < V; ++v) m = x[v] > m ? x[v] : m;
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) {
      p[v] = Exp(x[v] - m);
      sum = sum + p[v];
    }
    for (int64_t v = 0; v < V; ++v) p[v] = p[v] / sum;
    losses[b] = Log(sum) - (x[targets[b]] - m);
  }
  return SumTreeRef(losses, B, false) / static_cast<float>(B);
}
void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int64_t B, int64_t V) {
  internal::FpEnvGuard fp_guard;
  const float scale = dloss / static_cast<float>(B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t v = 0; v < V; ++v) {
      float ind = v == targets[b] ? 1.0f : 0.0f;
      dlogits[b * V + v] = dlogits[b * V + v] + (probs[b * V + v] - ind) * scale;
    }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  internal::FpEnvGuard fp_guard;
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float m = 0.0f;
    for (int64_t c = 0; c < C; ++c) m = m + x[c];
    m = m / static_cast<float>(C);
    float v = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      float xm = x[c] - m;
      v = Fma(xm, xm, v);
    }
    v = v / static_cast<float>(C);
    float s = 1.0f / __builtin_sqrtf(v + kLayerNormEps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = Fma((x[c] - m) * s, weight[c], bias[c]);
    mean[n] = m;
    rstd[n] = s;
  }
}
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t N, int64_t C) {
  internal::FpEnvGuard fp_guard;
  if (dinp != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* g = dout + n * C;
      const float m = mean[n], s = rstd[n];
      float dmean = 0.0f, dnmean = 0.0f;
      for (int64_t c = 0; c < C; ++c) {
        float norm = (x[c] - m) * s;
        float dnorm = weight[c] * g[c];
        dmean = dmean + dnorm;
        dnmean = Fma(dnorm, norm, dnmean);
      }
      dmean = dmean / static_cast<float>(C);
      dnmean = dnmean / static_cast<float>(C);
      for (int64_t c = 0; c < C; ++c) {
        float norm = (x[c] - m) * s;
        float dnorm = weight[c] * g[c];
        float dval = ((dnorm - dmean) - norm * dnmean) * s;
        dinp[n * C + c] = dinp[n * C + c] + dval;
      }
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    float dw = 0.0f, db = 0.0f;
    for (int64_t n = 0; n < N; ++n) {
      float norm = (inp[n * C + c] - mean[n]) * rstd[n];
      dw = Fma(norm, dout[n * C + c], dw);
      db = db + dout[n * C + c];
    }
    if (dweight != nullptr) dweight[c] += dw;
    if (dbias != nullptr) dbias[c] += db;
  }
}

void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
  internal::FpEnvGuard fp_guard;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = table[ids[n] * C + c];
}
void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                       int64_t V) {
  internal::FpEnvGuard fp_guard;
  // Rows that no id hits are left untouched.
  for (int64_t v = 0; v < V; ++v) {
    bool hit = false;
    for (int64_t n = 0; n < N && !hit; ++n) hit = ids[n] == v;
    if (!hit) continue;
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t n = 0; n < N; ++n)
        if (ids[n] == v) acc = acc + dout[n * C + c];
      dtable[v * C + c] += acc;
    }
  }
}

void AttentionForward(float* out, float* preatt, float* att, const float* qkv, int64_t B, int64_t T,
                      int64_t C, int64_t NH) {
  internal::FpEnvGuard fp_guard;
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * C3 + h * hs;
        float* pre = preatt + ((b * NH + h) * T + t) * T;
        float* a = att + ((b * NH + h) * T + t) * T;
        for (int64_t t2 = 0; t2 < T; ++t2) {
          const float* k = qkv + (b * T + t2) * C3 + C + h * hs;
          float dot = 0.0f;
          for (int64_t i = 0; i < hs; ++i) dot = Fma(q[i], k[i], dot);
          pre[t2] = t2 <= t ? dot * scale : 0.0f;
        }
        float m = pre[0];
        for (int64_t t2 = 1; t2 <= t; ++t2) m = pre[t2] > m ? pre[t2] : m;
        float sum = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          a[t2] = Exp(pre[t2] - m);
          sum = sum + a[t2];
        }
        const float inv = 1.0f / sum;
        for (int64_t t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
        float* o = out + (b * T + t) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) {
          float acc = 0.0f;
          for (int64_t t2 = 0; t2 < T; ++t2)
            acc = Fma(a[t2], qkv[(b * T + t2) * C3 + 2 * C + h * hs + i], acc);
          o[i] = acc;
        }
      }
}

void AttentionBackward(float* dqkv, float* dpreatt, float* datt, const float* dout,
                       const float* qkv, const float* att, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  internal::FpEnvGuard fp_guard;
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const float* A = att + (b * NH + h) * T * T;
      float* dA = datt + (b * NH + h) * T * T;
      float* dP = dpreatt + (b * NH + h) * T * T;
      auto q = [&](int64_t t, int64_t i) { return qkv[(b * T + t) * C3 + h * hs + i]; };
      auto k = [&](int64_t t, int64_t i) { return qkv[(b * T + t) * C3 + C + h * hs + i]; };
      auto v = [&](int64_t t, int64_t i) { return qkv[(b * T + t) * C3 + 2 * C + h * hs + i]; };
      auto g = [&](int64_t t, int64_t i) { return dout[(b * T + t) * C + h * hs + i]; };
      // datt (overwritten): chain over i of dout[t,i] * v[t2,i]; 0 where masked.
      for (int64_t t = 0; t < T; ++t)
        for (int64_t t2 = 0; t2 < T; ++t2) {
          float acc = 0.0f;
          for (int64_t i = 0; i < hs; ++i) acc = Fma(g(t, i), v(t2, i), acc);
          dA[t * T + t2] = t2 <= t ? acc : 0.0f;
        }
      // dv += chain over t of att[t,t2] * dout[t,i].
      for (int64_t t2 = 0; t2 < T; ++t2)
        for (int64_t i = 0; i < hs; ++i) {
          float acc = 0.0f;
          for (int64_t t = 0; t < T; ++t) acc = Fma(A[t * T + t2], g(t, i), acc);
          dqkv[(b * T + t2) * C3 + 2 * C + h * hs + i] += acc;
        }
      // Softmax backward (dpreatt overwritten): att * (datt - chain over t2 of att*datt).
      for (int64_t t = 0; t < T; ++t) {
        float s = 0.0f;
        for (int64_t t2 = 0; t2 < T; ++t2) s = Fma(A[t * T + t2], dA[t * T + t2], s);
        for (int64_t t2 = 0; t2 < T; ++t2)
          dP[t * T + t2] = t2 <= t ? A[t * T + t2] * (dA[t * T + t2] - s) : 0.0f;
      }
      // dq += scale * chain over t2 of dpreatt[t,t2] k[t2,i]; dk += scale * chain over t of
      // dpreatt[t,t2] q[t,i].
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < hs; ++i) {
          float acc = 0.0f;
          for (int64_t t2 = 0; t2 < T; ++t2) acc = Fma(dP[t * T + t2], k(t2, i), acc);
          dqkv[(b * T + t) * C3 + h * hs + i] += acc * scale;
        }
      for (int64_t t2 = 0; t2 < T; ++t2)
        for (int64_t i = 0; i < hs; ++i) {
          float acc = 0.0f;
          for (int64_t t = 0; t < T; ++t) acc = Fma(dP[t * T + t2], q(t, i), acc);
          dqkv[(b * T + t2) * C3 + C + h * hs + i] += acc * scale;
        }
    }
}

void ResidualForward(float* out, const float* a, const float* b, int64_t n) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
void ResidualBackward(float* da, float* db, const float* dout, int64_t n) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}
void ResidualBackwardOverwrite(float* da, float* db, const float* dout, int64_t n) {
  std::fill(da, da + n, 0.0f);
  if (db == nullptr) {
    std::vector<float> unused(static_cast<size_t>(n), 0.0f);
    ResidualBackward(da, unused.data(), dout, n);
  } else {
    std::fill(db, db + n, 0.0f);
    ResidualBackward(da, db, dout, n);
  }
}

void DropoutForward(float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed,
                    uint64_t stream) {
  internal::FpEnvGuard fp_guard;
  const float keep_scale = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < n; ++i) {
    mask[i] = internal::DropoutMaskAt(static_cast<uint64_t>(i), p, keep_scale, seed, stream);
    out[i] = inp[i] * mask[i];
  }
}
void DropoutBackward(float* dinp, const float* dout, const float* mask, int64_t n) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) dinp[i] = dinp[i] + dout[i] * mask[i];
}

void AdamWUpdate(float* w, float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  internal::FpEnvGuard fp_guard;
  for (int64_t i = 0; i < n; ++i) {
    if (s.scale_grad) g[i] = g[i] * s.grad_scale;
    const float wi = s.decay_weight ? w[i] * s.decay : w[i];
    const float mi = s.b1 * m[i] + s.one_minus_b1 * g[i];
    const float vi = s.b2 * v[i] + s.one_minus_b2 * (g[i] * g[i]);
    m[i] = mi;
    v[i] = vi;
    const float denom = __builtin_sqrtf(vi) / s.bc2_sqrt + s.eps;
    w[i] = wi - s.step_size * (mi / denom);
  }
}

float SumTree(const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  return SumTreeRef(x, n, false);
}
float SumSquaresTree(const float* x, int64_t n) {
  internal::FpEnvGuard fp_guard;
  return SumTreeRef(x, n, true);
}
void SumSquaresBlocks(const float* x, int64_t n, float* partials) {
  internal::FpEnvGuard fp_guard;
  const std::vector<float> p = BlockPartialsRef(x, n, true);
  std::copy(p.begin(), p.end(), partials);
}

}  // namespace meshlearn::engine::ref

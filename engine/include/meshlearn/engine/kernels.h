// The engine's kernels: free functions on plain float buffers, in Forward/Backward pairs
// (llm.c style). Shapes are in the comments; all buffers are row-major and contiguous.
//
// DETERMINISM CONTRACT (see docs/engine.md). For every op, the bits of every output depend only
// on the inputs — not on the thread count, not on the SIMD width, not on the machine:
//  * Each output element is computed by one thread; threads split independent outputs only.
//  * Unless an op's comment says otherwise, a reduction over k is a sequential chain in increasing
//    k: acc = fma(a[k], b[k], acc), starting from the stated initial value (0 or the bias). SIMD
//    lanes hold *different outputs*, never parts of one sum. std::fma / _mm*_fmadd_ps are used
//    explicitly; -ffp-contract=off forbids the compiler from inventing others.
//  * Long reductions with a single output (norms, means over a whole buffer) use SumTree(): blocks
//    of kSumBlock elements summed sequentially (acc = 0; acc = acc + x[i]; SumSquaresTree uses
//    acc = fma(x[i], x[i], acc)), then the block partials are combined level by level,
//    p[i] = p[2i] + p[2i+1], an odd last partial moving up unchanged. n = 0 gives 0.
//  * Transcendentals come from engine/math.h (own polynomials), never from libm.
//  * Every kernel (fast and ref) runs under the canonical floating-point environment (round to
//    nearest, no flush-to-zero, no denormals-are-zero) whatever the caller set, and restores the
//    caller's environment on return.
//
// Backward kernels ACCUMULATE into gradient buffers: d += (full sum), so callers zero gradients
// before a step and residual branches add naturally. The full sum is formed first and added once.
//
// Each op has a reference kernel (namespace ref, plain loops, the canonical order) and a fast
// kernel (namespace meshlearn::engine, blocked + SIMD + threads) that must equal it bit for bit.
// The fast kernels dispatch on the active KernelConfig (see backend.h).
#pragma once

#include <cstdint>

namespace meshlearn::engine {

inline constexpr int64_t kSumBlock = 1024;

// Fixed-order sum of n floats (see contract above).
float SumTree(const float* x, int64_t n);
// Fixed-order sum of squares (for global gradient norms).
float SumSquaresTree(const float* x, int64_t n);
// The first half of SumSquaresTree: partials[b] = the sequential sum of squares of block b of x
// (acc = fma(x[i], x[i], acc) from 0, blocks of kSumBlock elements, the last cut short) for
// b < ceil(n / kSumBlock), on the calling thread (a caller splits blocks over threads).
// SumSquaresTree(x, n) is these partials combined by the tree.
void SumSquaresBlocks(const float* x, int64_t n, float* partials);

// The scalars of one AdamW step (optim.cc computes them; AdamWUpdate applies them per element).
struct AdamWStep {
  float b1 = 0, b2 = 0, one_minus_b1 = 0, one_minus_b2 = 0;
  float step_size = 0;  // lr / (1 - b1^t)
  float bc2_sqrt = 1;   // sqrt(1 - b2^t)
  float eps = 0;
  float decay = 1;            // 1 - lr * weight_decay, applied when decay_weight
  float grad_scale = 1;       // gradient clipping factor, applied when scale_grad
  bool decay_weight = false;  // weight decay applies to this tensor (matrices, not vectors)
  bool scale_grad = false;
};

#define MESHLEARN_KERNEL_DECLS                                                                     \
  /* out(B,OC) = inp(B,C) @ weight(OC,C)^T + bias(OC). bias may be null (then init 0).           \
     out[b,o] = chain over c of fma(inp[b,c], weight[o,c], .) starting at bias[o]. */            \
  void LinearForward(float* out, const float* inp, const float* weight, const float* bias,       \
                     int64_t B, int64_t C, int64_t OC);                                           \
  /* dinp(B,C) += dout @ weight  : chain over o of fma(dout[b,o], weight[o,c], .) from 0          \
     dweight(OC,C) += dout^T @ inp: chain over b of fma(dout[b,o], inp[b,c], .) from 0            \
     dbias(OC) += chain over b of dout[b,o] (plain adds) from 0. dinp/dweight/dbias may be null. */ \
  void LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout,              \
                      const float* inp, const float* weight, int64_t B, int64_t C, int64_t OC);   \
  /* A linear layer and the ReLU after it (out = ReluForward of LinearForward's result), the      \
     ReLU applied where the GEMM writes each tile instead of in a second pass over out. */        \
  void LinearReluForward(float* out, const float* inp, const float* weight, const float* bias,    \
                         int64_t B, int64_t C, int64_t OC);                                       \
  /* LinearBackward of a linear layer whose input inp is a ReLU's output, with that ReLU's        \
     backward folded in: dinp(B,C) = inp > 0 ? 0 + chain : 0 (the chain as LinearBackward's) is   \
     *written*, not added: the bits LinearBackward and then ReluBackward (whose mask is the same: \
     relu(x) > 0 exactly when x > 0) leave in two zeroed buffers, so dinp needs no zeroing.       \
     dweight and dbias accumulate as in LinearBackward; either may be null, dinp may not. */      \
  void LinearReluBackward(float* dinp, float* dweight, float* dbias, const float* dout,           \
                          const float* inp, const float* weight, int64_t B, int64_t C,            \
                          int64_t OC);                                                            \
  /* LinearBackward with dinp *written* as 0 + chain (the bits LinearBackward leaves in a zeroed  \
     buffer: -0 becomes +0), so dinp needs no zeroing; dweight and dbias accumulate as in         \
     LinearBackward; either may be null, dinp may not. */                                         \
  void LinearBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,      \
                               const float* inp, const float* weight, int64_t B, int64_t C,       \
                               int64_t OC);                                                       \
                                                                                                  \
  /* inp(B,C,H,W), weight(OC,C,KH,KW), bias(OC) -> out(B,OC,OH,OW); zero padding `pad`, stride.   \
     OH = (H + 2*pad - KH)/stride + 1. out = chain over (c,kh,kw) in that nesting order, from bias \
     (0 if bias is null); padding positions are in the chain as fma(0, w, acc).                   \
     Backward: dinp, dweight, dbias accumulate (each may be null); dweight chains over (b,oh,ow)   \
     (padding as fma(dout, 0, acc)); dinp[b,c,ih,iw] chains over every (oc,kh,kw) in increasing   \
     order, the term being fma(g, w[oc,c,kh,kw], acc) with g = dout[b,oc,oh,ow] where             \
     ih = oh*stride - pad + kh (and iw likewise) has a solution in range, else g = 0;              \
     dbias over (b,oh,ow). */                                                                     \
  void Conv2dForward(float* out, const float* inp, const float* weight, const float* bias,       \
                     int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH,          \
                     int64_t KW, int64_t stride, int64_t pad);                                    \
  void Conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout,               \
                      const float* inp, const float* weight, int64_t B, int64_t C, int64_t H,     \
                      int64_t W, int64_t OC, int64_t KH, int64_t KW, int64_t stride, int64_t pad); \
  /* Conv2dBackward with dinp *written* as 0 + chain (the bits Conv2dBackward leaves in a zeroed  \
     buffer), so dinp needs no zeroing; dweight and dbias accumulate (either may be null, dinp    \
     may not). */                                                                                 \
  void Conv2dBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,      \
                               const float* inp, const float* weight, int64_t B, int64_t C,       \
                               int64_t H, int64_t W, int64_t OC, int64_t KH, int64_t KW,          \
                               int64_t stride, int64_t pad);                                      \
  /* A convolution and the ReLU after it (out = ReluForward of Conv2dForward's result), the ReLU  \
     applied where the convolution writes each tile instead of in a second pass over out. */      \
  void Conv2dReluForward(float* out, const float* inp, const float* weight, const float* bias,    \
                         int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH,      \
                         int64_t KW, int64_t stride, int64_t pad);                                \
                                                                                                  \
  /* Max pool, window k, stride s, no padding: inp(B,C,H,W) -> out(B,C,OH,OW), argmax(B,C,OH,OW)  \
     holds the flat index into inp of the first maximum (ties: lowest index; a NaN is skipped     \
     unless it is the window's first element). Backward: dinp[argmax[i]] += dout[i] one output at  \
     a time in increasing i (matters only for overlapping windows, s < k). */                     \
  void MaxPool2dForward(float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C,      \
                        int64_t H, int64_t W, int64_t k, int64_t s);                              \
  void MaxPool2dBackward(float* dinp, const float* dout, const int32_t* argmax, int64_t B,        \
                         int64_t C, int64_t OH, int64_t OW);                                      \
  /* MaxPool2dBackward of a max pool whose input inp(B,C,H,W) is a ReLU's output, with that       \
     ReLU's backward folded in: dinp(B,C,H,W) = inp > 0 ? 0 + g : 0, g being what                 \
     MaxPool2dBackward adds into a zeroed buffer, is *written*, not added: the bits               \
     MaxPool2dBackward and then ReluBackward (whose mask is the same: relu(x) > 0 exactly when    \
     x > 0) leave in two zeroed buffers, so dinp needs no zeroing. The mask is read from the      \
     pool's output out(B,C,OH,OW) (MaxPool2dForward's, with this argmax), not from inp (4x its   \
     size for 2x2 windows): inp at an output's argmax is that output, and elsewhere g is 0, which \
     either mask writes as +0.                                                                    \
     dbias(C), unless null, += chain over (b,h,w) of the dinp written (plain adds from 0):        \
     Conv2dBackward's dbias of the convolution before that ReLU, whose output gradient dinp is    \
     (the convolution's backward then need not read dinp for it). */                              \
  void MaxPool2dReluBackward(float* dinp, float* dbias, const float* dout,                        \
                             const int32_t* argmax, const float* out, int64_t B, int64_t C,       \
                             int64_t H, int64_t W, int64_t OH, int64_t OW);                       \
                                                                                                  \
  void ReluForward(float* out, const float* inp, int64_t n);                                      \
  void ReluBackward(float* dinp, const float* dout, const float* inp, int64_t n);                 \
  /* GELU, tanh form: 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))), tanh from math.h. */               \
  void GeluForward(float* out, const float* inp, int64_t n);                                      \
  void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n);                 \
  /* GeluBackward into a zeroed buffer, written without reading it: dinp = 0 + grad * dout.      \
     ResidualBackwardOverwrite likewise: da = 0 + dout, and db unless it is null. */              \
  void GeluBackwardOverwrite(float* dinp, const float* dout, const float* inp, int64_t n);       \
                                                                                                  \
  /* logits(B,V), targets(B) in [0,V) -> probs(B,V), losses(B); returns mean loss (SumTree / B).  \
     Row max, then e = Exp(x-max) from math.h, row sum is a sequential chain over v, probs = e/sum, \
     losses[b] = Log(sum) - (x[target] - max). Backward: dlogits(B,V) += (probs - onehot) * s with \
     s = dloss / B (float). REQUIRES: 0 <= targets[b] < V (checked). */                           \
  float SoftmaxCrossEntropyForward(float* probs, float* losses, const float* logits,             \
                                   const int32_t* targets, int64_t B, int64_t V);                 \
  void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,   \
                                   float dloss, int64_t B, int64_t V);                            \
                                                                                                  \
  /* inp(N,C) -> out(N,C), mean(N), rstd(N); weight(C), bias(C); eps 1e-5.                        \
     mean = chain of adds / C; var = chain of (x-mean)^2 via fma / C; rstd = 1/sqrt(var+eps);     \
     out = fma((x-mean)*rstd, weight, bias). Backward (llm.c formula) accumulates dinp, dweight    \
     (chain over n), dbias (chain over n); any of them may be null. */                            \
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,                   \
                        const float* weight, const float* bias, int64_t N, int64_t C);            \
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,           \
                         const float* inp, const float* weight, const float* mean,                \
                         const float* rstd, int64_t N, int64_t C);                                \
                                                                                                  \
  /* out(N,C) = table[ids[n], :], table(V,C). Backward: dtable[v,c] += chain over n (increasing)  \
     of dout[n,c] for ids[n]==v, added once; rows no id hits are untouched. Threads split rows v.  \
     REQUIRES: 0 <= ids[n] < V (checked in backward). */                                          \
  void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C); \
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N,        \
                         int64_t C, int64_t V);                                                   \
                                                                                                  \
  /* Multi-head causal self-attention (llm.c layout). qkv(B,T,3C) with q,k,v in that order,       \
     NH heads of size hs=C/NH -> out(B,T,C); saves preatt(B,NH,T,T) and att(B,NH,T,T).            \
     scale = 1/sqrt(hs); preatt = (chain over i of q.k) * scale, 0 where masked (t2 > t); att =    \
     Exp(preatt - rowmax) / chain-sum (as e * (1/sum)), 0 where masked; out[t] = chain over ALL t2 \
     of fma(att[t,t2], v[t2], .) (masked terms are fma(0, v, acc)). Backward: dqkv accumulates;   \
     datt and dpreatt are scratch (B,NH,T,T) outputs, OVERWRITTEN (0 where masked). dq = chain     \
     over t2 of dpreatt*k, then * scale, then added to dqkv; dk likewise over t. */               \
  void AttentionForward(float* out, float* preatt, float* att, const float* qkv, int64_t B,      \
                        int64_t T, int64_t C, int64_t NH);                                        \
  void AttentionBackward(float* dqkv, float* dpreatt, float* datt, const float* dout,            \
                         const float* qkv, const float* att, int64_t B, int64_t T, int64_t C,     \
                         int64_t NH);                                                             \
                                                                                                  \
  /* out = a + b. Backward: da += dout, db += dout. */                                            \
  void ResidualForward(float* out, const float* a, const float* b, int64_t n);                   \
  void ResidualBackward(float* da, float* db, const float* dout, int64_t n);                     \
  void ResidualBackwardOverwrite(float* da, float* db, const float* dout, int64_t n);            \
                                                                                                  \
  /* Inverted dropout with probability p: keep element i iff                                      \
     U32ToUnitFloat(Philox4x32({i_lo, i_hi, stream_lo, stream_hi}, seed)[0]) >= p; kept values    \
     scaled by 1/(1-p). mask(n) stores the scale (0 or 1/(1-p)). seed/stream from the caller      \
     (task seed, unit, step, layer), so a replay draws the same mask. */                          \
  void DropoutForward(float* out, float* mask, const float* inp, int64_t n, float p,             \
                      uint64_t seed, uint64_t stream);                                            \
  void DropoutBackward(float* dinp, const float* dout, const float* mask, int64_t n);           \
                                                                                                  \
  /* One AdamW step of n parameters, each element on its own, in this order (IEEE multiplies,    \
     adds, divisions and sqrt; no fma): if s.scale_grad, g = g * grad_scale (stored back to g);    \
     wi = s.decay_weight ? w * decay : w; m = b1*m + one_minus_b1*g;                                \
     v = b2*v + one_minus_b2*(g*g); w = wi - step_size * (m / (sqrt(v) / bc2_sqrt + eps)). */      \
  void AdamWUpdate(float* w, float* g, float* m, float* v, int64_t n, const AdamWStep& s);

// Fast kernels (dispatching on the active KernelConfig).
MESHLEARN_KERNEL_DECLS

namespace ref {
// Reference kernels: plain single-threaded loops in the canonical order (kernels_ref.cc is the
// specification of every op's floating-point operation sequence).
MESHLEARN_KERNEL_DECLS
float SumTree(const float* x, int64_t n);
float SumSquaresTree(const float* x, int64_t n);
void SumSquaresBlocks(const float* x, int64_t n, float* partials);
}  // namespace ref

}  // namespace meshlearn::engine

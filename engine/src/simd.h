// Internal: a tiny vector abstraction for the kernel translation units. Each kernel TU defines
// MESHLEARN_SIMD_LEVEL (0 scalar, 1 AVX2+FMA, 2 AVX-512) and MESHLEARN_SIMD_NS (a namespace name
// private to that TU) before including this file, so that no inline function compiled with AVX
// flags can ever be chosen by the linker for code that runs on a CPU without AVX.
//
// Every operation here is an IEEE-754 single operation with round-to-nearest (or a pure bit
// manipulation), so the same expression written with Vf gives the same bits at every width.
// Lane semantics that differ between ISAs are pinned down explicitly:
//   Max(a, b) = a > b ? a : b   (the x86 maxps rule; NaN in a gives b)
//   Select(m, a, b) = m ? a : b
// Do not include <algorithm> or other STL templates from SIMD TUs (see above).
#pragma once

#include <cstdint>
#include <cstring>

#if MESHLEARN_SIMD_LEVEL >= 1
#include <immintrin.h>
#endif

#ifndef MESHLEARN_SIMD_NS
#error "define MESHLEARN_SIMD_NS before including simd.h"
#endif

namespace meshlearn::engine::MESHLEARN_SIMD_NS {

#if MESHLEARN_SIMD_LEVEL == 0
// ---- scalar ---------------------------------------------------------------------------------
struct Vf {
  static constexpr int kWidth = 1;
  float v;
};
using Mask = bool;
inline Vf Load(const float* p) { return {*p}; }
inline Vf LoadPartial(const float* p, int n) { return {n > 0 ? *p : 0.0f}; }
inline void Store(float* p, Vf a) { *p = a.v; }
inline void StorePartial(float* p, Vf a, int n) {
  if (n > 0) *p = a.v;
}
// Lanes i in [lo, hi) load p[i]; the others are 0 and p[i] is not touched for them.
inline Vf LoadRange(const float* p, int lo, int hi) { return {lo <= 0 && 0 < hi ? *p : 0.0f}; }
// Lane indices 0, 1, 2, ... as floats.
inline Vf Iota() { return {0.0f}; }
inline Mask And(Mask a, Mask b) { return a && b; }
// Lanes with m set load base[idx[i] + off]; the others are 0 and touch no memory.
inline Vf GatherOffset(const float* base, const int32_t* idx, int32_t off, Mask m) {
  return {m ? base[static_cast<int64_t>(idx[0]) + off] : 0.0f};
}
inline Vf Set1(float x) { return {x}; }
inline float First(Vf a) { return a.v; }
// Lanes p[0], p[stride], p[2*stride], ...; REQUIRES: stride * (kWidth - 1) fits in int32.
inline Vf GatherStrided(const float* p, int64_t stride) { return {p[0]}; }
// The 2*kWidth floats of a then b, split into the even-indexed and the odd-indexed ones:
// *even = (x0, x2, x4, ...), *odd = (x1, x3, x5, ...) where x = (a0, a1, ..., b0, b1, ...).
inline void Deinterleave(Vf a, Vf b, Vf* even, Vf* odd) {
  *even = a;
  *odd = b;
}
inline Vf Zero() { return {0.0f}; }
inline Vf operator+(Vf a, Vf b) { return {a.v + b.v}; }
inline Vf operator-(Vf a, Vf b) { return {a.v - b.v}; }
inline Vf operator*(Vf a, Vf b) { return {a.v * b.v}; }
inline Vf operator/(Vf a, Vf b) { return {a.v / b.v}; }
inline Vf Fma(Vf a, Vf b, Vf c) { return {__builtin_fmaf(a.v, b.v, c.v)}; }
inline Vf Sqrt(Vf a) { return {__builtin_sqrtf(a.v)}; }
inline Vf Max(Vf a, Vf b) { return {a.v > b.v ? a.v : b.v}; }
inline Mask Lt(Vf a, Vf b) { return a.v < b.v; }
inline Mask Gt(Vf a, Vf b) { return a.v > b.v; }
inline Mask Le(Vf a, Vf b) { return a.v <= b.v; }
inline Mask Eq(Vf a, Vf b) { return a.v == b.v; }
inline Mask IsNan(Vf a) { return a.v != a.v; }
inline Mask Or(Mask a, Mask b) { return a || b; }
inline Vf Select(Mask m, Vf a, Vf b) { return m ? a : b; }
inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline Vf Abs(Vf a) { return {FromBits(Bits(a.v) & 0x7fffffffu)}; }
// |mag| with the sign bit of sgn.
inline Vf CopySign(Vf mag, Vf sgn) {
  return {FromBits((Bits(mag.v) & 0x7fffffffu) | (Bits(sgn.v) & 0x80000000u))};
}
// 2^n for an integral float n in [-126, 127].
inline Vf Pow2Int(Vf n) {
  int32_t i = static_cast<int32_t>(n.v);
  return {FromBits(static_cast<uint32_t>(i + 127) << 23)};
}
// For a positive normal x: x = m * 2^e with m in [0.5, 1); e returned as float.
inline void Frexp(Vf x, Vf* m, Vf* e) {
  uint32_t u = Bits(x.v);
  *e = {static_cast<float>(static_cast<int32_t>((u >> 23) & 0xffu) - 126)};
  *m = {FromBits((u & 0x807fffffu) | 0x3f000000u)};
}

#elif MESHLEARN_SIMD_LEVEL == 1
// ---- AVX2 + FMA -----------------------------------------------------------------------------
struct Vf {
  static constexpr int kWidth = 8;
  __m256 v;
};
using Mask = __m256;
inline __m256i TailMask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline Vf Load(const float* p) { return {_mm256_loadu_ps(p)}; }
// Whole vectors take the plain load/store: AMD Zen microcodes vmaskmovps stores (one per ~10+
// cycles), which made every element-wise kernel several times slower than memory allows there.
inline Vf LoadPartial(const float* p, int n) {
  if (n >= 8) return {_mm256_loadu_ps(p)};
  return {_mm256_maskload_ps(p, TailMask(n))};
}
inline void Store(float* p, Vf a) { _mm256_storeu_ps(p, a.v); }
inline void StorePartial(float* p, Vf a, int n) {
  if (n >= 8) {
    _mm256_storeu_ps(p, a.v);
  } else {
    _mm256_maskstore_ps(p, TailMask(n), a.v);
  }
}
inline Vf Iota() { return {_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7)}; }
inline Mask And(Mask a, Mask b) { return _mm256_and_ps(a, b); }
inline Vf GatherOffset(const float* base, const int32_t* idx, int32_t off, Mask m) {
  const __m256i i = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)),
                                     _mm256_set1_epi32(off));
  return {_mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, i, m, 4)};
}
inline Vf LoadRange(const float* p, int lo, int hi) {
  return {_mm256_maskload_ps(p, _mm256_andnot_si256(TailMask(lo), TailMask(hi)))};
}
inline Vf Set1(float x) { return {_mm256_set1_ps(x)}; }
inline float First(Vf a) { return _mm256_cvtss_f32(a.v); }
inline Vf GatherStrided(const float* p, int64_t stride) {
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                         _mm256_set1_epi32(static_cast<int>(stride)));
  return {_mm256_i32gather_ps(p, idx, 4)};
}
inline void Deinterleave(Vf a, Vf b, Vf* even, Vf* odd) {
  // shuffle_ps works within 128-bit halves: (a0 a2 b0 b2 | a4 a6 b4 b6); the 64-bit pairs then
  // go in the order 0, 2, 1, 3.
  const __m256 e = _mm256_shuffle_ps(a.v, b.v, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 o = _mm256_shuffle_ps(a.v, b.v, _MM_SHUFFLE(3, 1, 3, 1));
  *even = {_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)))};
  *odd = {_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)))};
}
inline Vf Zero() { return {_mm256_setzero_ps()}; }
inline Vf operator+(Vf a, Vf b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vf operator-(Vf a, Vf b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vf operator*(Vf a, Vf b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vf operator/(Vf a, Vf b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vf Fma(Vf a, Vf b, Vf c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf Sqrt(Vf a) { return {_mm256_sqrt_ps(a.v)}; }
inline Vf Max(Vf a, Vf b) { return {_mm256_max_ps(a.v, b.v)}; }
inline Mask Lt(Vf a, Vf b) { return _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ); }
inline Mask Gt(Vf a, Vf b) { return _mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ); }
inline Mask Le(Vf a, Vf b) { return _mm256_cmp_ps(a.v, b.v, _CMP_LE_OQ); }
inline Mask Eq(Vf a, Vf b) { return _mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ); }
inline Mask IsNan(Vf a) { return _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q); }
inline Mask Or(Mask a, Mask b) { return _mm256_or_ps(a, b); }
inline Vf Select(Mask m, Vf a, Vf b) { return {_mm256_blendv_ps(b.v, a.v, m)}; }
inline Vf Abs(Vf a) {
  return {_mm256_and_ps(a.v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))};
}
inline Vf CopySign(Vf mag, Vf sgn) {
  __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  return {_mm256_or_ps(_mm256_andnot_ps(sign, mag.v), _mm256_and_ps(sign, sgn.v))};
}
inline Vf Pow2Int(Vf n) {
  __m256i i = _mm256_cvttps_epi32(n.v);
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(i, _mm256_set1_epi32(127)), 23))};
}
inline void Frexp(Vf x, Vf* m, Vf* e) {
  __m256i u = _mm256_castps_si256(x.v);
  __m256i ex = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(0xff)),
                                _mm256_set1_epi32(126));
  *e = {_mm256_cvtepi32_ps(ex)};
  __m256i mm =
      _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0x807fffffu))),
                      _mm256_set1_epi32(0x3f000000));
  *m = {_mm256_castsi256_ps(mm)};
}

#elif MESHLEARN_SIMD_LEVEL == 2
// ---- AVX-512 (F, BW, VL, DQ) ----------------------------------------------------------------
struct Vf {
  static constexpr int kWidth = 16;
  __m512 v;
};
using Mask = __mmask16;
inline __mmask16 TailMask(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff)
                 : static_cast<__mmask16>((1u << (n < 0 ? 0 : n)) - 1u);
}
inline Vf Load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Vf LoadPartial(const float* p, int n) { return {_mm512_maskz_loadu_ps(TailMask(n), p)}; }
inline void Store(float* p, Vf a) { _mm512_storeu_ps(p, a.v); }
inline void StorePartial(float* p, Vf a, int n) { _mm512_mask_storeu_ps(p, TailMask(n), a.v); }
inline Vf Iota() { return {_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)}; }
inline Mask And(Mask a, Mask b) { return static_cast<Mask>(a & b); }
inline Vf GatherOffset(const float* base, const int32_t* idx, int32_t off, Mask m) {
  const __m512i i = _mm512_add_epi32(_mm512_loadu_si512(idx), _mm512_set1_epi32(off));
  return {_mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, i, base, 4)};
}
inline Vf LoadRange(const float* p, int lo, int hi) {
  return {_mm512_maskz_loadu_ps(static_cast<__mmask16>(TailMask(hi) & ~TailMask(lo)), p)};
}
inline Vf Set1(float x) { return {_mm512_set1_ps(x)}; }
inline float First(Vf a) { return _mm512_cvtss_f32(a.v); }
inline Vf GatherStrided(const float* p, int64_t stride) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  return {_mm512_i32gather_ps(idx, p, 4)};
}
inline void Deinterleave(Vf a, Vf b, Vf* even, Vf* odd) {
  // Index i < 16 selects a[i], 16 + i selects b[i].
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
  *even = {_mm512_permutex2var_ps(a.v, ie, b.v)};
  *odd = {_mm512_permutex2var_ps(a.v, io, b.v)};
}
inline Vf Zero() { return {_mm512_setzero_ps()}; }
inline Vf operator+(Vf a, Vf b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vf operator-(Vf a, Vf b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vf operator*(Vf a, Vf b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vf operator/(Vf a, Vf b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vf Fma(Vf a, Vf b, Vf c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf Sqrt(Vf a) { return {_mm512_sqrt_ps(a.v)}; }
inline Vf Max(Vf a, Vf b) { return {_mm512_max_ps(a.v, b.v)}; }
inline Mask Lt(Vf a, Vf b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ); }
inline Mask Gt(Vf a, Vf b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ); }
inline Mask Le(Vf a, Vf b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_LE_OQ); }
inline Mask Eq(Vf a, Vf b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ); }
inline Mask IsNan(Vf a) { return _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q); }
inline Mask Or(Mask a, Mask b) { return static_cast<Mask>(a | b); }
inline Vf Select(Mask m, Vf a, Vf b) { return {_mm512_mask_blend_ps(m, b.v, a.v)}; }
inline Vf Abs(Vf a) {
  return {_mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(0x7fffffff)))};
}
inline Vf CopySign(Vf mag, Vf sgn) {
  __m512i s = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  __m512i r = _mm512_or_si512(_mm512_andnot_si512(s, _mm512_castps_si512(mag.v)),
                              _mm512_and_si512(s, _mm512_castps_si512(sgn.v)));
  return {_mm512_castsi512_ps(r)};
}
inline Vf Pow2Int(Vf n) {
  __m512i i = _mm512_cvttps_epi32(n.v);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(i, _mm512_set1_epi32(127)), 23))};
}
inline void Frexp(Vf x, Vf* m, Vf* e) {
  __m512i u = _mm512_castps_si512(x.v);
  __m512i ex = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 23), _mm512_set1_epi32(0xff)),
                                _mm512_set1_epi32(126));
  *e = {_mm512_cvtepi32_ps(ex)};
  __m512i mm =
      _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0x807fffffu))),
                      _mm512_set1_epi32(0x3f000000));
  *m = {_mm512_castsi512_ps(mm)};
}
#else
#error "unknown MESHLEARN_SIMD_LEVEL"
#endif

inline constexpr int kW = Vf::kWidth;
inline int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t MaxI(int64_t a, int64_t b) { return a > b ? a : b; }

}  // namespace meshlearn::engine::MESHLEARN_SIMD_NS

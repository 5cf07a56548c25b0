// Internal: the fast kernels, written once over Vf (simd.h) and compiled three times (scalar,
// AVX2, AVX-512) into TU-private namespaces. They must equal the reference kernels
// (kernels_ref.cc) bit for bit; the comments name the reference chain each loop reproduces.
//
// The workhorse is one GEMM: C(M,N) = chain over k of fma(A[m,k], B[k,n], .), from an initial
// value (0, a per-column bias or a per-row bias). A register-blocked micro-kernel holds an
// MR x NR tile of independent accumulators (NR = NRV vectors) and walks k in increasing order, so
// every output is exactly the reference's sequential chain. Blocking over k (KC) stores the
// running accumulator as a float and reloads it, which does not change the chain either. A and B
// are packed into micro-panels by "packers", which is also how convolutions run as implicit GEMMs
// (the packer reads the image directly, zero padding included). Threads split the output tile
// grid; the decomposition changes who computes a tile, never how.
#pragma once

#include "kernels_internal.h"
#include "math_impl.h"
#include "meshlearn/engine/kernels.h"
#include "meshlearn/engine/threadpool.h"
#include "simd.h"

namespace meshlearn::engine::MESHLEARN_SIMD_NS {

using internal::kGelu3K1;
using internal::kGeluK0;
using internal::kGeluK1;
using internal::kLayerNormEps;

#if MESHLEARN_SIMD_LEVEL == 2
inline constexpr int kMR = 12;
inline constexpr int kNRV = 2;
#elif MESHLEARN_SIMD_LEVEL == 1
inline constexpr int kMR = 6;
inline constexpr int kNRV = 2;
#else
inline constexpr int kMR = 4;
inline constexpr int kNRV = 4;
#endif
inline constexpr int kNR = kNRV * kW;
// Blocking (see GemmBlock): k blocks of kKC, A row blocks of kMC (packed for all of K), B column
// blocks of kNC (a kKC x kNC block stays in L2). Measured on Zen 3 (32 KiB L1, 512 KiB L2); any
// values give the same bits.
inline constexpr int64_t kKC = 256;
inline constexpr int64_t kMC = kMR * 128;
inline constexpr int64_t kNC = kNR * (256 / kNR);
// How far ahead (in k steps) the micro-kernel prefetches its A micro-panel. The first tile of a
// panel reads it from L3 when the A block outgrows L2 (large K); 8 steps (~100 cycles) did not
// cover that latency (1536^3 at 0.70-0.87x OpenBLAS on a Xeon, 0.96-1.06x with 24).
inline constexpr int64_t kPrefetchK = 24;

inline float ScalarFma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- GEMM ------------------------------------------------------------------------------------

struct GemmOut {
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias_col = nullptr;  // (N): initial value per column
  const float* bias_row = nullptr;  // (M): initial value per row
  float alpha = 1.0f;               // result = chain * alpha, when use_alpha
  bool use_alpha = false;
  bool accumulate = false;  // c = c + result
  // c = 0 + result (what accumulating into a zeroed c gives: -0 becomes +0), without reading c.
  bool plus_zero = false;
  // The ReLU fused into the epilogue, applied to the value about to be stored (after alpha and
  // accumulate), so each thread applies it to the tiles it wrote while they are in its cache:
  // relu: c = v > 0 ? v : 0 (ReluForward's select).
  bool relu = false;
  // relu_mask (M x N, row stride ldc): c = relu_mask > 0 ? 0 + v : 0, ReluBackward's select
  // into a zeroed buffer (0 + v is v except that -0 becomes +0, as adding it to zero did).
  const float* relu_mask = nullptr;
  // Causal attention's products (see AttentionForward/AttentionBackward for when each is exact):
  // kCausalTiles skips the tiles whose every column is past every row (n > m: outputs the caller
  // overwrites); kCausalUpTo runs row m's chain over k < (its micro-panel's end) only, dropping
  // terms k > m at the end of the chain; kCausalFrom over k >= (its micro-panel's first row)
  // only, dropping terms k < m at the start of the chain.
  int causal = 0;
  // Split the threads over rows (M) in contiguous ranges even where columns are longer (while B
  // is small: see Gemm): a weight gradient (M = the layer's outputs) then has each thread write
  // its own contiguous part, the part ParallelForArrays gives it in the zeroing, the gradient
  // norm and the optimizer update.
  bool split_rows = false;
};
inline constexpr int kCausalTiles = 1;
inline constexpr int kCausalUpTo = 2;
inline constexpr int kCausalFrom = 3;

// acc[r][j] += A[:, r] * B[:, j-th vector] over kc steps, for the first R rows of the panel
// (R < kMR serves short edge panels without computing rows that are thrown away).
template <int R>
inline void MicroKernel(int64_t kc, const float* __restrict pa, const float* __restrict pb,
                        Vf (&acc)[kMR][kNRV]) {
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    __builtin_prefetch(pa + kPrefetchK * kMR, 0, 3);
    Vf b[kNRV];
#pragma GCC unroll 4
    for (int j = 0; j < kNRV; ++j) b[j] = Load(pb + j * kW);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vf a = Set1(pa[r]);
#pragma GCC unroll 4
      for (int j = 0; j < kNRV; ++j) acc[r][j] = Fma(a, b[j], acc[r][j]);
    }
    pa += kMR;
    pb += kNR;
  }
}

// One MR x NR tile (mr x nr valid). cin: running partial (or null: start from bias/0).
// final_out: apply alpha/accumulate and write to o.c; else store the raw partial to pout.
// kFull: mr == kMR and nr == kNR (whole vectors, no masks).
template <bool kFull>
inline void TileImpl(int64_t kc, const float* pa, const float* pb, int mr, int nr, int64_t m0,
                     int64_t n0, const float* cin, int64_t ldcin, const GemmOut& o, bool final_out,
                     float* pout, int64_t ldpout) {
  if (kFull) {
    mr = kMR;
    nr = kNR;
  }
  auto load = [](const float* p, int nv) { return kFull ? Load(p) : LoadPartial(p, nv); };
  Vf acc[kMR][kNRV];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < kNRV; ++j) {
      const int nv = nr - j * kW;
      if (cin != nullptr) {
        acc[r][j] = r < mr ? load(cin + r * ldcin + j * kW, nv) : Zero();
      } else if (o.bias_col != nullptr) {
        acc[r][j] = load(o.bias_col + n0 + j * kW, nv);
      } else if (o.bias_row != nullptr) {
        acc[r][j] = Set1(r < mr ? o.bias_row[m0 + r] : 0.0f);
      } else {
        acc[r][j] = Zero();
      }
    }
  }
  if (kFull || mr == kMR) {
    MicroKernel<kMR>(kc, pa, pb, acc);
  } else if (mr <= kMR / 4) {
    MicroKernel<kMR / 4>(kc, pa, pb, acc);
  } else if (mr <= kMR / 2) {
    MicroKernel<kMR / 2>(kc, pa, pb, acc);
  } else {
    MicroKernel<kMR>(kc, pa, pb, acc);
  }
  if (final_out) {
    float* c = o.c + m0 * o.ldc + n0;
    const float* mask = o.relu_mask != nullptr ? o.relu_mask + m0 * o.ldc + n0 : nullptr;
    const Vf alpha = Set1(o.alpha);
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      if (r >= mr) break;
#pragma GCC unroll 4
      for (int j = 0; j < kNRV; ++j) {
        const int nv = nr - j * kW;
        if (nv <= 0) break;
        Vf v = acc[r][j];
        if (o.use_alpha) v = v * alpha;
        float* p = c + r * o.ldc + j * kW;
        if (kFull || nv >= kW) {
          if (o.accumulate) v = Load(p) + v;
          if (o.plus_zero) v = Zero() + v;
          if (o.relu) v = Select(Gt(v, Zero()), v, Zero());
          if (mask != nullptr) {
            v = Select(Gt(Load(mask + r * o.ldc + j * kW), Zero()), Zero() + v, Zero());
          }
          Store(p, v);
        } else {
          if (o.accumulate) v = LoadPartial(p, nv) + v;
          if (o.plus_zero) v = Zero() + v;
          if (o.relu) v = Select(Gt(v, Zero()), v, Zero());
          if (mask != nullptr) {
            v = Select(Gt(LoadPartial(mask + r * o.ldc + j * kW, nv), Zero()), Zero() + v, Zero());
          }
          StorePartial(p, v, nv);
        }
      }
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      if (r >= mr) break;
#pragma GCC unroll 4
      for (int j = 0; j < kNRV; ++j) {
        const int nv = nr - j * kW;
        if (nv <= 0) break;
        if (kFull || nv >= kW) {
          Store(pout + r * ldpout + j * kW, acc[r][j]);
        } else {
          StorePartial(pout + r * ldpout + j * kW, acc[r][j], nv);
        }
      }
    }
  }
}

inline void Tile(int64_t kc, const float* pa, const float* pb, int mr, int nr, int64_t m0,
                 int64_t n0, const float* cin, int64_t ldcin, const GemmOut& o, bool final_out,
                 float* pout, int64_t ldpout) {
  if (mr == kMR && nr == kNR) {
    TileImpl<true>(kc, pa, pb, mr, nr, m0, n0, cin, ldcin, o, final_out, pout, ldpout);
  } else {
    TileImpl<false>(kc, pa, pb, mr, nr, m0, n0, cin, ldcin, o, final_out, pout, ldpout);
  }
}

// Asks for the rows [p + r*ld, p + r*ld + kNR) of a tile to be brought into L1 for writing.
inline void PrefetchTile(const float* p, int64_t ld, int mr) {
  for (int r = 0; r < mr; ++r) {
    const float* row = p + r * ld;
    for (int x = 0; x < kNR; x += 16) __builtin_prefetch(row + x, 1, 3);
    __builtin_prefetch(row + kNR - 1, 1, 3);
  }
}

// Packs A micro-panel ip of the row block starting at row ic (mc rows) for all of K, in the
// layout GemmBlock reads: k block k0..k0+kc of panel ip at pa + k0 * mpanels * kMR + ip * kc * kMR
// (mpanels = CeilDiv(mc, kMR)).
template <typename PackA>
inline void PackAPanel(float* pa, int64_t ic, int64_t mc, int64_t ip, int64_t K,
                       const PackA& pack_a) {
  const int64_t mpanels = CeilDiv(mc, kMR);
  const int64_t nkb = K == 0 ? 1 : CeilDiv(K, kKC);
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const int64_t k0 = kb * kKC, kc = MinI(kKC, K - k0);
    pack_a(pa + k0 * mpanels * kMR + ip * kc * kMR, ic + ip * kMR, MinI(kMR, mc - ip * kMR), k0,
           kc);
  }
}

// Computes rows [m_begin, m_end) x columns [n_begin, n_end) of the GEMM on the calling thread.
// pack_a(dst, m0, mr, k0, kc): dst[kk*MR + r] = A[m0+r, k0+kk], zero for r >= mr.
// pack_b(dst, n0, nr, k0, kc): dst[kk*NR + j] = B[k0+kk, n0+j], zero for j >= nr.
// partial: where running partials go between k blocks when the output cannot hold them
// (accumulate or alpha); null means o.c holds them.
// packed_a: null, or rows [m_begin, m_end) (at most kMC of them) already packed by PackAPanel
// (ic = m_begin, mc = m_end - m_begin): threads that split the columns share one packing of A.
// Blocking: rows in blocks of kMC whose A panels are packed once for all of K (A is packed once
// per row block, not once per column block); then column blocks of kNC, k blocks of kKC with the
// B block (kKC x kNC) packed into L2; then one A micro-panel (L1) against every B micro-panel of
// the block, walking C along its rows. Every tile walks its k block in increasing order and k
// blocks run in increasing order, so each output is the one sequential chain whatever the
// blocking. The next tile's running partial is prefetched while the current one computes.
template <typename PackA, typename PackB>
void GemmBlock(int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end, int64_t K,
               const PackA& pack_a, const PackB& pack_b, const GemmOut& o, float* partial,
               int64_t ldp, const float* packed_a = nullptr) {
  if (m_end <= m_begin || n_end <= n_begin) return;
  const int64_t nkb = K == 0 ? 1 : CeilDiv(K, kKC);
  const int64_t kpad = K == 0 ? 1 : K;
  float* pb_buf = ScratchBuffer(0, kKC * kNC);
  float* pa_buf = packed_a != nullptr
                      ? nullptr
                      : ScratchBuffer(1, kpad * MinI(kMC, CeilDiv(m_end - m_begin, kMR) * kMR));
  float* pbase = partial != nullptr ? partial : o.c;
  const int64_t ldb = partial != nullptr ? ldp : o.ldc;
  for (int64_t ic = m_begin; ic < m_end; ic += kMC) {
    const int64_t mc = MinI(kMC, m_end - ic);
    const int64_t mpanels = CeilDiv(mc, kMR);
    if (packed_a == nullptr) {
      for (int64_t ip = 0; ip < mpanels; ++ip) PackAPanel(pa_buf, ic, mc, ip, K, pack_a);
    }
    const float* pa_blk = packed_a != nullptr ? packed_a : pa_buf;
    for (int64_t jc = n_begin; jc < n_end; jc += kNC) {
      const int64_t nc = MinI(kNC, n_end - jc);
      const int64_t npanels = CeilDiv(nc, kNR);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = kb * kKC;
        const int64_t kc = MinI(kKC, K - k0);
        const bool first = kb == 0, last = kb == nkb - 1;
        for (int64_t jp = 0; jp < npanels; ++jp) {
          pack_b(pb_buf + jp * kc * kNR, jc + jp * kNR, MinI(kNR, nc - jp * kNR), k0, kc);
        }
        const float* pa_k = pa_blk + k0 * mpanels * kMR;
        // Where the tile's running partial lives (read when !first, written when !last), and the
        // output (written when last).
        float* pref = first && last ? o.c : pbase;
        const int64_t ldref = first && last ? o.ldc : ldb;
        for (int64_t ip = 0; ip < mpanels; ++ip) {
          const int64_t m0 = ic + ip * kMR;
          const int mr = static_cast<int>(MinI(kMR, mc - ip * kMR));
          for (int64_t jp = 0; jp < npanels; ++jp) {
            const int64_t n0 = jc + jp * kNR;
            const int nr = static_cast<int>(MinI(kNR, nc - jp * kNR));
            if (jp + 1 < npanels) {
              PrefetchTile(pref + m0 * ldref + n0 + kNR, ldref, mr);
            } else if (ip + 1 < mpanels) {
              PrefetchTile(pref + (m0 + kMR) * ldref + jc, ldref,
                           static_cast<int>(MinI(kMR, mc - (ip + 1) * kMR)));
            }
            if (o.causal == kCausalTiles && n0 >= m0 + mr) continue;
            // The tile's k range within this block: all of it, or its causal part (an empty one
            // keeps the running partial, or starts it from the initial value).
            int64_t klo = k0, khi = k0 + kc;
            if (o.causal == kCausalUpTo) khi = MinI(khi, m0 + mr);
            if (o.causal == kCausalFrom) klo = MaxI(klo, m0);
            if (khi <= klo) klo = khi = k0;
            const float* cin = first ? nullptr : pbase + m0 * ldb + n0;
            Tile(khi - klo, pa_k + ip * kc * kMR + (klo - k0) * kMR,
                 pb_buf + jp * kc * kNR + (klo - k0) * kNR, mr, nr, m0, n0, cin, ldb, o, last,
                 pbase + m0 * ldb + n0, ldb);
          }
        }
      }
    }
  }
}

inline void SpinPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The GEMM of at most one row block (M <= kMC), its packed A no larger than the L2 B block, split
// over threads by columns, as work units in two UnitQueues (threadpool.h): first A's
// micro-panels, packed once into one shared buffer, then groups of B micro-panels (columns), each
// packing its own B and computing its tiles from the shared A once all of A is packed. Splitting by
// columns used to pack all of A again on every thread (the batch's rows, in a training step); small
// units claimed from a queue balance the threads when one starts late or runs slower, and each
// thread keeps the same columns from call to call while they keep pace (their weights stay in its
// cache). Who computes a tile never changes it (GemmBlock); the only wait is for A panels another
// thread has claimed and is packing, so a thread that never arrives stalls nothing.
template <typename PackA, typename PackB>
void GemmSplitColumns(int64_t M, int64_t N, int64_t K, const PackA& pack_a, const PackB& pack_b,
                      const GemmOut& o, float* partial, int threads) {
  const int64_t mpanels = CeilDiv(M, kMR), npanels = CeilDiv(N, kNR);
  float* pa = ScratchBuffer(3, (K == 0 ? 1 : K) * mpanels * kMR);  // the caller's; shared
  const int parts = static_cast<int>(MinI(threads, UnitQueue::kMaxParts));
  // About eight column units per thread, each of whole micro-panels: with two per thread a thread
  // that started a few microseconds late or was slowed down held the other at the join for most of
  // a unit (gemm_bench on 2 threads, EPYC: 256 x 784 x 64 from 123-132 to 149-165 GFLOP/s, 64 x 256
  // x 784 from 126-131 to 139-142; four per thread gained less on the first, one panel per unit
  // the same). Each unit re-reads the shared A from L2, which the bound on A below keeps cheap.
  const int64_t group = MaxI(1, npanels / (8 * parts));
  UnitQueue a_units(mpanels, parts), col_units(CeilDiv(npanels, group), parts);
  int64_t packed = 0;  // A panels done (GCC atomics: SIMD TUs use no STL)
  ParallelFor(parts, threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int part = static_cast<int>(t);
      for (int64_t ip; (ip = a_units.Next(part)) >= 0;) {
        PackAPanel(pa, 0, M, ip, K, pack_a);
        __atomic_fetch_add(&packed, 1, __ATOMIC_RELEASE);
      }
      for (int64_t c; (c = col_units.Next(part)) >= 0;) {
        while (__atomic_load_n(&packed, __ATOMIC_ACQUIRE) < mpanels) SpinPause();
        GemmBlock(0, M, c * group * kNR, MinI(N, (c + 1) * group * kNR), K, pack_a, pack_b, o,
                  partial, N, pa);
      }
    }
  });
}

// The whole GEMM, split over `threads` by output columns or rows (whichever is longer).
template <typename PackA, typename PackB>
void Gemm(int64_t M, int64_t N, int64_t K, const PackA& pack_a, const PackB& pack_b,
          const GemmOut& o, int threads) {
  if (M <= 0 || N <= 0) return;
  float* partial = nullptr;
  if ((o.accumulate || o.use_alpha) && K > kKC) partial = ScratchBuffer(2, M * N);
  const int64_t npanels = CeilDiv(N, kNR), mpanels = CeilDiv(M, kMR);
  // Below ~2^18 multiply-adds a wake-up of the pool (a few microseconds) costs more than it saves.
  if (threads > 1 && M * N * (K + 1) < (int64_t{1} << 18)) threads = 1;
  if (threads <= 1) {
    GemmBlock(0, M, 0, N, K, pack_a, pack_b, o, partial, N);
    return;
  }
  // split_rows is honoured while the B that every thread then packs whole is no larger than the
  // L2 B block (the Fashion MLP's first weight gradient, K x N = 64 x 784), not for the GPT's
  // (K = 2048 tokens), where the split is for speed, not for where the gradient lands.
  const bool rows_wanted = o.split_rows && K * N <= kKC * kNC;
  const bool split_n = npanels >= threads && ((N >= M && !rows_wanted) || mpanels < threads);
  // Every column unit reads all of the shared A: only while A is no larger than the B block that
  // GemmBlock keeps in L2 (the GPT's weight gradients, K = 2048 rows of tokens, streamed a 3 MB A
  // from L3 once per unit and ran ~2% slower on 2 threads).
  if (split_n && M <= kMC && K * mpanels * kMR <= kKC * kNC) {
    GemmSplitColumns(M, N, K, pack_a, pack_b, o, partial, threads);
    return;
  }
  // Each thread packs the A rows and B columns it uses: splitting columns repeats the packing of
  // A on every thread, splitting rows repeats B's, so split the longer side.
  const int64_t units = split_n ? npanels : mpanels;
  const int64_t tasks = MinI(units, threads);
  ParallelFor(tasks, threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t u0 = units * t / tasks, u1 = units * (t + 1) / tasks;
      if (split_n) {
        GemmBlock(0, M, u0 * kNR, MinI(N, u1 * kNR), K, pack_a, pack_b, o, partial, N);
      } else {
        GemmBlock(u0 * kMR, MinI(M, u1 * kMR), 0, N, K, pack_a, pack_b, o, partial, N);
      }
    }
  });
}

// dst[kk*R + r] = src[r*ld + kk] for r < R, kk < kc: R rows of a row-major matrix packed
// transposed into a micro-panel (row-major A, and weight^T as B). A pure copy, so any order of
// moves gives the same bits; the vector paths transpose 4 rows x 8 columns in registers (the
// scalar loop stores at a stride of R floats, one store per element, and was the largest cost of
// the GPT's GEMMs outside the micro-kernel).
template <int R>
inline void PackRowsTransposed(float* __restrict dst, const float* __restrict src, int64_t ld,
                               int64_t kc) {
  int64_t kk = 0;
#if MESHLEARN_SIMD_LEVEL >= 1
  for (; kk + 8 <= kc; kk += 8) {
    float* d = dst + kk * R;
    int r = 0;
    for (; r + 4 <= R; r += 4) {
      const float* s = src + r * ld + kk;
      const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ld);
      const __m256 r2 = _mm256_loadu_ps(s + 2 * ld), r3 = _mm256_loadu_ps(s + 3 * ld);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
      const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
      // Lane halves: u_j holds column j (low 128 bits) and column j + 4 (high) of the 4 rows.
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      _mm_storeu_ps(d + 0 * R + r, _mm256_castps256_ps128(u0));
      _mm_storeu_ps(d + 1 * R + r, _mm256_castps256_ps128(u1));
      _mm_storeu_ps(d + 2 * R + r, _mm256_castps256_ps128(u2));
      _mm_storeu_ps(d + 3 * R + r, _mm256_castps256_ps128(u3));
      _mm_storeu_ps(d + 4 * R + r, _mm256_extractf128_ps(u0, 1));
      _mm_storeu_ps(d + 5 * R + r, _mm256_extractf128_ps(u1, 1));
      _mm_storeu_ps(d + 6 * R + r, _mm256_extractf128_ps(u2, 1));
      _mm_storeu_ps(d + 7 * R + r, _mm256_extractf128_ps(u3, 1));
    }
    if (r + 2 <= R) {  // two rows left (R = 6 on AVX2): pairs of columns
      const float* s = src + r * ld + kk;
      const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ld);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
      const __m128 t0l = _mm256_castps256_ps128(t0), t0h = _mm256_extractf128_ps(t0, 1);
      const __m128 t1l = _mm256_castps256_ps128(t1), t1h = _mm256_extractf128_ps(t1, 1);
      _mm_storel_pi(reinterpret_cast<__m64*>(d + 0 * R + r), t0l);
      _mm_storeh_pi(reinterpret_cast<__m64*>(d + 1 * R + r), t0l);
      _mm_storel_pi(reinterpret_cast<__m64*>(d + 2 * R + r), t1l);
      _mm_storeh_pi(reinterpret_cast<__m64*>(d + 3 * R + r), t1l);
      _mm_storel_pi(reinterpret_cast<__m64*>(d + 4 * R + r), t0h);
      _mm_storeh_pi(reinterpret_cast<__m64*>(d + 5 * R + r), t0h);
      _mm_storel_pi(reinterpret_cast<__m64*>(d + 6 * R + r), t1h);
      _mm_storeh_pi(reinterpret_cast<__m64*>(d + 7 * R + r), t1h);
      r += 2;
    }
    for (; r < R; ++r) {
      for (int64_t j = 0; j < 8; ++j) d[j * R + r] = src[r * ld + kk + j];
    }
  }
#endif
  for (; kk < kc; ++kk) {
    for (int r = 0; r < R; ++r) dst[kk * R + r] = src[r * ld + kk];
  }
}

// dst[kk*R + r] = src[kk*ld + r] for r < R, kk < kc: a micro-panel whose R values of one k are
// contiguous in memory (A^T or B stored row-major).
template <int R>
inline void PackRowsContiguous(float* __restrict dst, const float* __restrict src, int64_t ld,
                               int64_t kc) {
  for (int64_t kk = 0; kk < kc; ++kk) {
    const float* s = src + kk * ld;
    float* d = dst + kk * R;
    int r = 0;
#if MESHLEARN_SIMD_LEVEL >= 1
    for (; r + 4 <= R; r += 4) _mm_storeu_ps(d + r, _mm_loadu_ps(s + r));
    if (r + 2 <= R) {
      // 64-bit copy through the unaligned-typed intrinsics: s + r is only 4-byte aligned.
      _mm_storel_epi64(reinterpret_cast<__m128i*>(d + r),
                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + r)));
      r += 2;
    }
#endif
    for (; r < R; ++r) d[r] = s[r];
  }
}

// Packer for A stored with strides: A[m,k] = a[m*rs + k*cs].
struct StridedA {
  const float* a;
  int64_t rs, cs;
  void operator()(float* dst, int64_t m0, int64_t mr, int64_t k0, int64_t kc) const {
    if (rs == 1 && mr == kMR) {  // A^T stored row-major: the MR values of one k are contiguous
      PackRowsContiguous<kMR>(dst, a + m0 + k0 * cs, cs, kc);
      return;
    }
    if (cs == 1 && mr == kMR) {  // A stored row-major
      PackRowsTransposed<kMR>(dst, a + m0 * rs + k0, rs, kc);
      return;
    }
    for (int64_t r = 0; r < kMR; ++r) {
      if (r < mr) {
        const float* src = a + (m0 + r) * rs + k0 * cs;
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMR + r] = src[kk * cs];
      } else {
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMR + r] = 0.0f;
      }
    }
  }
};

// Packer for B stored with strides: B[k,n] = b[k*rs + n*cs].
struct StridedB {
  const float* b;
  int64_t rs, cs;
  void operator()(float* dst, int64_t n0, int64_t nr, int64_t k0, int64_t kc) const {
    if (cs == 1) {
      for (int64_t kk = 0; kk < kc; ++kk) {
        const float* src = b + (k0 + kk) * rs + n0;
        float* d = dst + kk * kNR;
        if (nr == kNR) {
          for (int j = 0; j < kNRV; ++j) Store(d + j * kW, Load(src + j * kW));
        } else {
          for (int64_t j = 0; j < kNR; ++j) d[j] = j < nr ? src[j] : 0.0f;
        }
      }
    } else if (nr == kNR && rs == 1) {  // B^T stored row-major (e.g. weight^T)
      PackRowsTransposed<kNR>(dst, b + n0 * cs + k0, cs, kc);
    } else if (nr == kNR && kW > 1 && cs * (kW - 1) < (int64_t{1} << 31)) {
      // Transposing pack (e.g. weight^T): one strided gather per vector of a row.
      for (int64_t kk = 0; kk < kc; ++kk) {
        const float* src = b + (k0 + kk) * rs + n0 * cs;
        float* d = dst + kk * kNR;
        for (int j = 0; j < kNRV; ++j) Store(d + j * kW, GatherStrided(src + j * kW * cs, cs));
      }
    } else {
      for (int64_t j = 0; j < kNR; ++j) {
        if (j < nr) {
          const float* src = b + k0 * rs + (n0 + j) * cs;
          for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNR + j] = src[kk * rs];
        } else {
          for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNR + j] = 0.0f;
        }
      }
    }
  }
};

// ---- Linear ----------------------------------------------------------------------------------

// LinearForward, and with relu LinearReluForward.
void LinearForwardImpl(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t OC, bool relu) {
  // out[b,o] = chain over c of fma(inp[b,c], weight[o,c]) from bias[o]: A = inp, B = weight^T.
  GemmOut o;
  o.c = out;
  o.ldc = OC;
  o.bias_col = bias;
  o.relu = relu;
  Gemm(B, OC, C, StridedA{inp, C, 1}, StridedB{weight, 1, C}, o, internal::ActiveThreads());
}

void LinearForward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                   int64_t C, int64_t OC) {
  LinearForwardImpl(out, inp, weight, bias, B, C, OC, /*relu=*/false);
}

void LinearReluForward(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t OC) {
  LinearForwardImpl(out, inp, weight, bias, B, C, OC, /*relu=*/true);
}

// How a backward kernel stores its input gradient: added to dinp (the accumulating kernels),
// written as 0 + chain (the ...Overwrite kernels), or written through the ReLU mask of the layer's
// input (LinearReluBackward).
enum class DinpStore { kAdd, kWrite, kWriteRelu };

// LinearBackward, LinearBackwardOverwrite and LinearReluBackward, by how dinp is stored.
void LinearBackwardImpl(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int64_t B, int64_t C, int64_t OC,
                        DinpStore store) {
  const int threads = internal::ActiveThreads();
  // dinp[b,c] += chain over o of fma(dout[b,o], weight[o,c]); written as 0 + chain, or through
  // the ReLU as inp[b,c] > 0 ? 0 + chain : 0.
  auto dinp_gemm = [&](int t) {
    GemmOut o;
    o.c = dinp;
    o.ldc = C;
    o.accumulate = store == DinpStore::kAdd;
    o.plus_zero = store == DinpStore::kWrite;
    o.relu_mask = store == DinpStore::kWriteRelu ? inp : nullptr;
    Gemm(B, C, OC, StridedA{dout, OC, 1}, StridedB{weight, C, 1}, o, t);
  };
  // dweight[o,c] += chain over b of fma(dout[b,o], inp[b,c]).
  auto dweight_gemm = [&](int t) {
    GemmOut o;
    o.c = dweight;
    o.ldc = C;
    o.accumulate = true;
    o.split_rows = true;
    Gemm(OC, C, B, StridedA{dout, 1, OC}, StridedB{inp, C, 1}, o, t);
  };
  // The two products have the same B*C*OC multiply-adds. Below ~2^22 each, splitting each over
  // the threads gains little (a region's start, packing and join against tens of microseconds of
  // work: 1.0-1.3x on 2 threads for the Fashion MLP's 64 x 256 x 128); run them side by side
  // instead, one per thread (a late worker leaves both to the caller, in order).
  if (dinp != nullptr && dweight != nullptr && threads > 1 && B * C * OC < (int64_t{1} << 22)) {
    ParallelFor(2, threads, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        if (i == 0) {
          dinp_gemm(1);
        } else {
          dweight_gemm(1);
        }
      }
    });
  } else {
    if (dinp != nullptr) dinp_gemm(threads);
    if (dweight != nullptr) dweight_gemm(threads);
  }
  if (dbias != nullptr) {
    // dbias[o] += chain over b of dout[b,o] (adds); lanes hold different o, and threads groups of
    // kG columns, each group one pass over the rows (four vectors per load of a row's stretch).
    constexpr int64_t kG = 4 * kW;
    ParallelFor(CeilDiv(OC, kG), B * OC >= (int64_t{1} << 17) ? threads : 1,
                [&](int64_t g0, int64_t g1) {
                  for (int64_t g = g0; g < g1; ++g) {
                    const int64_t ob = g * kG;
                    if (ob + kG <= OC) {
                      Vf acc[4] = {Zero(), Zero(), Zero(), Zero()};
                      for (int64_t b = 0; b < B; ++b) {
                        const float* row = dout + b * OC + ob;
                        for (int j = 0; j < 4; ++j) acc[j] = acc[j] + Load(row + j * kW);
                      }
                      for (int j = 0; j < 4; ++j) {
                        Store(dbias + ob + j * kW, Load(dbias + ob + j * kW) + acc[j]);
                      }
                      continue;
                    }
                    for (int64_t o0 = ob; o0 < OC; o0 += kW) {
                      const int nv = static_cast<int>(MinI(kW, OC - o0));
                      Vf acc = Zero();
                      for (int64_t b = 0; b < B; ++b) {
                        acc = acc + LoadPartial(dout + b * OC + o0, nv);
                      }
                      StorePartial(dbias + o0, LoadPartial(dbias + o0, nv) + acc, nv);
                    }
                  }
                });
  }
}

void LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t B, int64_t C, int64_t OC) {
  LinearBackwardImpl(dinp, dweight, dbias, dout, inp, weight, B, C, OC, DinpStore::kAdd);
}

void LinearBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, int64_t B, int64_t C,
                             int64_t OC) {
  LinearBackwardImpl(dinp, dweight, dbias, dout, inp, weight, B, C, OC, DinpStore::kWrite);
}

void LinearReluBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int64_t B, int64_t C, int64_t OC) {
  LinearBackwardImpl(dinp, dweight, dbias, dout, inp, weight, B, C, OC, DinpStore::kWriteRelu);
}

// ---- Conv2d (implicit GEMM) --------------------------------------------------------------------

// dst[t] = src[t] for t in [lo, hi), in vector steps.
inline void CopyRun(float* dst, const float* src, int64_t lo, int64_t hi) {
  for (int64_t t = lo; t < hi; t += kW) {
    const int nv = static_cast<int>(MinI(kW, hi - t));
    StorePartial(dst + t, LoadPartial(src + t, nv), nv);
  }
}

struct ConvGeom {
  int64_t C, H, W, OC, KH, KW, stride, pad, OH, OW;
};

// A maximal stretch of consecutive GEMM indices that stay within one row of the output (or input)
// plane: positions [j0, j0+len) map to (row, col0 + t).
struct Run {
  int64_t j0, len, row, col0;
};

// Splits flat plane positions [n0, n0+nr) of a plane with `width` columns into runs.
inline int SplitRuns(int64_t n0, int64_t nr, int64_t width, Run* runs) {
  int count = 0;
  int64_t row = n0 / width, col = n0 % width;
  for (int64_t j = 0; j < nr;) {
    const int64_t len = MinI(nr - j, width - col);
    runs[count++] = Run{j, len, row, col};
    j += len;
    ++row;
    col = 0;
  }
  return count;
}

// (a, b, c) digits of k in the mixed radix (*, B, C), advanced one step at a time.
struct Digits3 {
  int64_t a, b, c, nb, nc;
  Digits3(int64_t k, int64_t nb_, int64_t nc_)
      : a(k / (nb_ * nc_)), b((k / nc_) % nb_), c(k % nc_), nb(nb_), nc(nc_) {}
  void Next() {
    if (++c == nc) {
      c = 0;
      if (++b == nb) {
        b = 0;
        ++a;
      }
    }
  }
};

// Forward, one image: B[k=(c,kh,kw), n=(oh,ow)] = x[c, oh*s-pad+kh, ow*s-pad+kw] or 0.
struct ConvImageB {
  const float* x;  // (C,H,W) of one image
  const ConvGeom* g;
  void operator()(float* dst, int64_t n0, int64_t nr, int64_t k0, int64_t kc) const {
    const int64_t s = g->stride;
    Run runs[kNR];
    const int nruns = SplitRuns(n0, nr, g->OW, runs);
    Digits3 d3(k0, g->KH, g->KW);  // (c, kh, kw)
    for (int64_t kk = 0; kk < kc; ++kk, d3.Next()) {
      const float* plane = x + d3.a * g->H * g->W;
      float* d = dst + kk * kNR;
      for (int j = 0; j < kNRV; ++j) Store(d + j * kW, Zero());
      for (int r = 0; r < nruns; ++r) {
        const Run& run = runs[r];
        const int64_t ih = run.row * s - g->pad + d3.b;
        if (static_cast<uint64_t>(ih) >= static_cast<uint64_t>(g->H)) continue;
        const float* row = plane + ih * g->W;
        const int64_t iw0 = run.col0 * s - g->pad + d3.c;  // input column of t = 0
        if (s == 1) {
          CopyRun(d + run.j0, row + iw0, MaxI(0, -iw0), MinI(run.len, g->W - iw0));
        } else {
          for (int64_t t = 0; t < run.len; ++t) {
            const int64_t iw = iw0 + t * s;
            if (static_cast<uint64_t>(iw) < static_cast<uint64_t>(g->W)) d[run.j0 + t] = row[iw];
          }
        }
      }
    }
  }
};

// dinp, one image: A[m=c, k=(oc,kh,kw)] = w[oc,c,kh,kw].
struct ConvWeightTA {
  const float* w;
  const ConvGeom* g;
  void operator()(float* dst, int64_t m0, int64_t mr, int64_t k0, int64_t kc) const {
    const int64_t kk_per_oc = g->KH * g->KW;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t k = k0 + kk, oc = k / kk_per_oc, r = k % kk_per_oc;
      const float* src = w + oc * g->C * kk_per_oc + r;
      for (int64_t i = 0; i < kMR; ++i)
        dst[kk * kMR + i] = i < mr ? src[(m0 + i) * kk_per_oc] : 0.0f;
    }
  }
};

// dinp, one image: B[k=(oc,kh,kw), n=(ih,iw)] = dout[oc, oh, ow] when ih+pad-kh = oh*s and
// iw+pad-kw = ow*s, else 0.
struct ConvDoutB {
  const float* dout;  // (OC,OH,OW) of one image
  const ConvGeom* g;
  void operator()(float* dst, int64_t n0, int64_t nr, int64_t k0, int64_t kc) const {
    const int64_t s = g->stride;
    Run runs[kNR];
    const int nruns = SplitRuns(n0, nr, g->W, runs);
    Digits3 d3(k0, g->KH, g->KW);  // (oc, kh, kw)
    for (int64_t kk = 0; kk < kc; ++kk, d3.Next()) {
      const float* plane = dout + d3.a * g->OH * g->OW;
      float* d = dst + kk * kNR;
      for (int j = 0; j < kNRV; ++j) Store(d + j * kW, Zero());
      for (int r = 0; r < nruns; ++r) {
        const Run& run = runs[r];
        const int64_t th = run.row + g->pad - d3.b;  // = oh * s
        if (th < 0) continue;
        if (s == 1) {
          if (th >= g->OH) continue;
          const int64_t ow0 = run.col0 + g->pad - d3.c;
          CopyRun(d + run.j0, plane + th * g->OW + ow0, MaxI(0, -ow0), MinI(run.len, g->OW - ow0));
        } else {
          if (th % s != 0 || th / s >= g->OH) continue;
          const float* row = plane + (th / s) * g->OW;
          for (int64_t t = 0; t < run.len; ++t) {
            const int64_t tw = run.col0 + t + g->pad - d3.c;
            if (tw >= 0 && tw % s == 0 && tw / s < g->OW) d[run.j0 + t] = row[tw / s];
          }
        }
      }
    }
  }
};

// dweight: A[m=oc, k=(b,p)] = dout[b,oc,p].
struct ConvDoutA {
  const float* dout;
  const ConvGeom* g;
  void operator()(float* dst, int64_t m0, int64_t mr, int64_t k0, int64_t kc) const {
    const int64_t P = g->OH * g->OW;
    int64_t b = k0 / P, p = k0 % P;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float* src = dout + b * g->OC * P + p;
      for (int64_t i = 0; i < kMR; ++i) dst[kk * kMR + i] = i < mr ? src[(m0 + i) * P] : 0.0f;
      if (++p == P) {
        p = 0;
        ++b;
      }
    }
  }
};

// dweight: B[k=(b,oh,ow), n=(c,kh,kw)] = x[b, c, oh*s-pad+kh, ow*s-pad+kw] or 0. One row kk of
// the panel is a masked gather: lane j reads x at (image offset of kk) + (offset of n0 + j).
struct ConvImageBT {
  const float* x;  // (B,C,H,W)
  const ConvGeom* g;
  void operator()(float* dst, int64_t n0, int64_t nr, int64_t k0, int64_t kc) const {
    const int64_t P = g->OH * g->OW, s = g->stride, HW = g->H * g->W;
    alignas(64) int32_t idx[kNR];
    alignas(64) float khf[kNR], kwf[kNR], in_panel[kNR];
    Digits3 d3(n0, g->KH, g->KW);  // (c, kh, kw)
    for (int64_t j = 0; j < kNR; ++j, d3.Next()) {
      const bool valid = j < nr;
      idx[j] = valid ? static_cast<int32_t>(d3.a * HW + d3.b * g->W + d3.c) : 0;
      khf[j] = valid ? static_cast<float>(d3.b) : 0.0f;
      kwf[j] = valid ? static_cast<float>(d3.c) : 0.0f;
      in_panel[j] = valid ? 1.0f : 0.0f;
    }
    const Vf hf = Set1(static_cast<float>(g->H)), wf = Set1(static_cast<float>(g->W));
    int64_t b = k0 / P, p = k0 % P;
    int64_t oh = p / g->OW, ow = p % g->OW;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t ih0 = oh * s - g->pad, iw0 = ow * s - g->pad;
      const float* img = x + b * g->C * HW;  // int32 offsets stay within one image
      const int32_t off = static_cast<int32_t>(ih0 * g->W + iw0);
      const Vf ih0v = Set1(static_cast<float>(ih0)), iw0v = Set1(static_cast<float>(iw0));
      float* d = dst + kk * kNR;
      for (int jv = 0; jv < kNRV; ++jv) {
        const Vf ih = ih0v + Load(khf + jv * kW), iw = iw0v + Load(kwf + jv * kW);
        const Mask m =
            And(And(Lt(Zero(), Load(in_panel + jv * kW)), And(Le(Zero(), ih), Lt(ih, hf))),
                And(Le(Zero(), iw), Lt(iw, wf)));
        Store(d + jv * kW, GatherOffset(img, idx + jv * kW, off, m));
      }
      if (++ow == g->OW) {
        ow = 0;
        if (++oh == g->OH) {
          oh = 0;
          ++b;
        }
      }
    }
  }
};

ConvGeom MakeGeom(int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH, int64_t KW,
                  int64_t stride, int64_t pad) {
  return ConvGeom{C,
                  H,
                  W,
                  OC,
                  KH,
                  KW,
                  stride,
                  pad,
                  (H + 2 * pad - KH) / stride + 1,
                  (W + 2 * pad - KW) / stride + 1};
}

// Direct stride-1 convolution tile: R output channels x NV vectors of one output row, chained over
// k = (c, kh, kw) in increasing order. B rows are read straight from a zero-padded image (row
// pitch pw, plane pitch pplane): for a fixed (c, kh) the kw terms are contiguous, so nothing is
// packed. pa is the weight panel packed as pa[k*kMR + r].
// kFlip (the input gradient): the term of (kh, kw) reads row KH-1-kh and column KW-1-kw.
template <int R, int NV, bool kFlip>
inline void DirectConvTile(const float* __restrict pa, const float* __restrict img, int64_t C,
                           int64_t KH, int64_t KW, int64_t pw, int64_t pplane,
                           Vf (&acc)[kMR][kNRV]) {
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t kh = 0; kh < KH; ++kh) {
      const float* row = img + c * pplane + (kFlip ? KH - 1 - kh : kh) * pw;
      for (int64_t kw = 0; kw < KW; ++kw) {
        const float* src = row + (kFlip ? KW - 1 - kw : kw);
        Vf bv[NV];
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) bv[j] = Load(src + j * kW);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const Vf av = Set1(pa[r]);
#pragma GCC unroll 2
          for (int j = 0; j < NV; ++j) acc[r][j] = Fma(av, bv[j], acc[r][j]);
        }
        pa += kMR;
      }
    }
  }
}

// One output row segment [ow0, ow0 + nr) for all OC rows of pa_all (panels of kMR). accumulate:
// out += chain (input gradient), plus_zero: out = 0 + chain (the same into a zeroed out), else
// out = chain from bias; relu: the stored value is v > 0 ? v : 0 (ReluForward's select, as
// GemmOut::relu).
template <int NV, bool kFlip>
void DirectConvRow(const float* pa_all, const float* img, const float* bias, float* out_row,
                   int64_t out_plane, int64_t OC, int64_t K, int64_t C, int64_t KH, int64_t KW,
                   int64_t pw, int64_t pplane, int64_t ow0, int nr, bool accumulate, bool plus_zero,
                   bool relu) {
  for (int64_t m0 = 0; m0 < OC; m0 += kMR) {
    const int mr = static_cast<int>(MinI(kMR, OC - m0));
    Vf acc[kMR][kNRV];
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const Vf init = Set1(bias != nullptr && r < mr ? bias[m0 + r] : 0.0f);
#pragma GCC unroll 2
      for (int j = 0; j < kNRV; ++j) acc[r][j] = init;
    }
    const float* pa = pa_all + (m0 / kMR) * K * kMR;
    const float* src = img + ow0;
    if (mr <= kMR / 4) {
      DirectConvTile<kMR / 4, NV, kFlip>(pa, src, C, KH, KW, pw, pplane, acc);
    } else if (mr <= kMR / 2) {
      DirectConvTile<kMR / 2, NV, kFlip>(pa, src, C, KH, KW, pw, pplane, acc);
    } else {
      DirectConvTile<kMR, NV, kFlip>(pa, src, C, KH, KW, pw, pplane, acc);
    }
    for (int r = 0; r < mr; ++r) {
      float* o = out_row + (m0 + r) * out_plane + ow0;
      for (int j = 0; j < NV; ++j) {
        const int nv = nr - j * kW;
        if (nv <= 0) break;
        Vf v = accumulate ? LoadPartial(o + j * kW, nv) + acc[r][j] : acc[r][j];
        if (plus_zero) v = Zero() + v;
        if (relu) v = Select(Gt(v, Zero()), v, Zero());
        StorePartial(o + j * kW, v, nv);
      }
    }
  }
}

// A convolution's bias gradient chains over (b, p) for each output channel, kBiasGroup channels
// side by side (independent chains, interleaved for ILP). One image's step: acc[i] = acc[i] +
// planes[i * P + p] for p in increasing order, over cnt <= kBiasGroup planes P apart. A full
// group keeps its chains in registers (a runtime count kept them in memory, each add waiting on
// the store of the one before: about half the speed).
inline constexpr int64_t kBiasGroup = 8;
inline void AddPlaneChains(float (&acc)[kBiasGroup], const float* planes, int64_t cnt, int64_t P) {
  if (cnt == kBiasGroup) {
    float a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    float a4 = acc[4], a5 = acc[5], a6 = acc[6], a7 = acc[7];
    for (int64_t p = 0; p < P; ++p) {
      a0 = a0 + planes[p];
      a1 = a1 + planes[P + p];
      a2 = a2 + planes[2 * P + p];
      a3 = a3 + planes[3 * P + p];
      a4 = a4 + planes[4 * P + p];
      a5 = a5 + planes[5 * P + p];
      a6 = a6 + planes[6 * P + p];
      a7 = a7 + planes[7 * P + p];
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
    acc[4] = a4, acc[5] = a5, acc[6] = a6, acc[7] = a7;
    return;
  }
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < cnt; ++i) acc[i] = acc[i] + planes[i * P + p];
}

// dbias[oc] += chain over (b, p) of dout[b, oc, p] (adds), threads over groups of kBiasGroup
// channels.
inline void ConvBiasGrad(float* dbias, const float* dout, int64_t B, int64_t OC, int64_t P,
                         int threads) {
  ParallelFor(CeilDiv(OC, kBiasGroup), threads, [&](int64_t g0, int64_t g1) {
    for (int64_t grp = g0; grp < g1; ++grp) {
      const int64_t oc0 = grp * kBiasGroup, cnt = MinI(kBiasGroup, OC - oc0);
      float acc[kBiasGroup] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t b = 0; b < B; ++b) AddPlaneChains(acc, dout + (b * OC + oc0) * P, cnt, P);
      for (int64_t i = 0; i < cnt; ++i) dbias[oc0 + i] += acc[i];
    }
  });
}

// Conv2dForward, and with relu Conv2dReluForward (the ReLU applied where each tile is stored).
void Conv2dForwardImpl(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH,
                       int64_t KW, int64_t stride, int64_t pad, bool relu) {
  const ConvGeom g = MakeGeom(C, H, W, OC, KH, KW, stride, pad);
  const int64_t P = g.OH * g.OW, K = C * KH * KW;
  const int threads = internal::ActiveThreads();
  if (stride == 1 && g.OW >= kW / 2 + 1) {
    // Direct convolution: pad every image once, then each (image, output row, channel panel)
    // tile chains over (c, kh, kw) reading contiguous input rows. Same chain as the reference:
    // padding positions are zeros of the padded copy, i.e. fma(0, w, acc).
    const int64_t pw = W + 2 * pad, ph = H + 2 * pad, pplane = ph * pw;
    const int nv_row = g.OW > kW ? 2 : 1;  // vectors per tile: one when a row fits in one
    const int64_t tile_w = nv_row * kW;
    const int64_t slack = tile_w + KW;  // reads past a row's end stay inside the buffer
    const int64_t mpanels = CeilDiv(OC, kMR);
    float* pa = ScratchBuffer(5, mpanels * kMR * K);
    float* padded = ScratchBuffer(7, B * C * pplane + slack);
    for (int64_t ip = 0; ip < mpanels; ++ip) {
      StridedA{weight, K, 1}(pa + ip * K * kMR, ip * kMR, MinI(kMR, OC - ip * kMR), 0, K);
    }
    ParallelFor(B * C, threads, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        float* dst = padded + p * pplane;
        for (int64_t i = 0; i < pplane; ++i) dst[i] = 0.0f;
        for (int64_t ih = 0; ih < H; ++ih) {
          const float* src = inp + p * H * W + ih * W;
          for (int64_t iw = 0; iw < W; ++iw) dst[(ih + pad) * pw + pad + iw] = src[iw];
        }
      }
    });
    for (int64_t i = 0; i < slack; ++i) padded[B * C * pplane + i] = 0.0f;
    const int64_t tiles_per_row = CeilDiv(g.OW, tile_w);
    ParallelFor(B * g.OH, threads, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / g.OH, oh = t % g.OH;
        const float* img = padded + b * C * pplane + oh * pw;
        float* out_row = out + b * OC * P + oh * g.OW;
        for (int64_t tw = 0; tw < tiles_per_row; ++tw) {
          const int64_t ow0 = tw * tile_w;
          const int nr = static_cast<int>(MinI(tile_w, g.OW - ow0));
          if (nv_row == 2) {
            DirectConvRow<2, false>(pa, img, bias, out_row, P, OC, K, C, KH, KW, pw, pplane, ow0,
                                    nr, false, false, relu);
          } else {
            DirectConvRow<1, false>(pa, img, bias, out_row, P, OC, K, C, KH, KW, pw, pplane, ow0,
                                    nr, false, false, relu);
          }
        }
      }
    });
    return;
  }
  // out[b] (OC x P) = W (OC x K) @ col(b) (K x P), rows start at bias[oc].
  auto image = [&](int64_t b, int th) {
    GemmOut o;
    o.c = out + b * OC * P;
    o.ldc = P;
    o.bias_row = bias;
    o.relu = relu;
    Gemm(OC, P, K, StridedA{weight, K, 1}, ConvImageB{inp + b * C * H * W, &g}, o, th);
  };
  if (B >= threads) {
    ParallelFor(B, threads, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) image(b, 1);
    });
  } else {
    for (int64_t b = 0; b < B; ++b) image(b, threads);
  }
}

void Conv2dForward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                   int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH, int64_t KW,
                   int64_t stride, int64_t pad) {
  Conv2dForwardImpl(out, inp, weight, bias, B, C, H, W, OC, KH, KW, stride, pad, /*relu=*/false);
}

void Conv2dReluForward(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t KH,
                       int64_t KW, int64_t stride, int64_t pad) {
  Conv2dForwardImpl(out, inp, weight, bias, B, C, H, W, OC, KH, KW, stride, pad, /*relu=*/true);
}

// Conv2dBackward, and with overwrite Conv2dBackwardOverwrite (dinp written as 0 + chain).
void Conv2dBackwardImpl(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int64_t B, int64_t C, int64_t H,
                        int64_t W, int64_t OC, int64_t KH, int64_t KW, int64_t stride, int64_t pad,
                        bool overwrite) {
  const ConvGeom g = MakeGeom(C, H, W, OC, KH, KW, stride, pad);
  const int64_t P = g.OH * g.OW, K = C * KH * KW;
  const int threads = internal::ActiveThreads();
  if (dinp != nullptr && stride == 1 && C < kMR / 2) {
    // Few input channels (e.g. the first layer): a GEMM would waste most of its MR-row tiles and
    // be bound by packing, so run the reference chain directly with lanes holding kW adjacent
    // input columns. Out-of-range terms are fma(0, w, acc) exactly as in the reference.
    // Four input rows per task give four independent chains to hide the fma latency.
    constexpr int kRows = 4;
    const int64_t row_blocks = CeilDiv(H, kRows);
    ParallelFor(B * C * row_blocks, threads, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t bc = t / row_blocks, ih0 = (t % row_blocks) * kRows;
        const int64_t b = bc / C, c = bc % C;
        const int nrows = static_cast<int>(MinI(kRows, H - ih0));
        for (int64_t iw0 = 0; iw0 < W; iw0 += kW) {
          const int nv = static_cast<int>(MinI(kW, W - iw0));
          Vf acc[kRows] = {Zero(), Zero(), Zero(), Zero()};
          for (int64_t oc = 0; oc < OC; ++oc) {
            const float* plane = dout + (b * OC + oc) * g.OH * g.OW;
            const float* wk = weight + (oc * C + c) * KH * KW;
            for (int64_t kh = 0; kh < KH; ++kh) {
              for (int64_t kw = 0; kw < KW; ++kw) {
                // Lane i of row ih reads dout[ih + pad - kh, ow0 + i], ow0 = iw0 + pad - kw.
                const int64_t ow0 = iw0 + pad - kw;
                const int lo = static_cast<int>(MaxI(0, MinI(kW, -ow0)));
                const int hi = static_cast<int>(MaxI(0, MinI(kW, g.OW - ow0)));
                const Vf wv = Set1(wk[kh * KW + kw]);
#pragma GCC unroll 4
                for (int r = 0; r < kRows; ++r) {
                  const int64_t oh = ih0 + r + pad - kh;
                  Vf gv = Zero();
                  if (r < nrows && oh >= 0 && oh < g.OH && hi > lo) {
                    gv = LoadRange(plane + oh * g.OW + ow0, lo, hi);
                  }
                  acc[r] = Fma(gv, wv, acc[r]);
                }
              }
            }
          }
          for (int r = 0; r < nrows; ++r) {
            float* d = dinp + (bc * H + ih0 + r) * W + iw0;
            StorePartial(d, (overwrite ? Zero() : LoadPartial(d, nv)) + acc[r], nv);
          }
        }
      }
    });
  } else if (dinp != nullptr && stride == 1 && pad <= KH - 1 && pad <= KW - 1 && W >= kW / 2 + 1) {
    // Direct input gradient: dout zero-padded by (KH-1-pad, KW-1-pad) so that the term of
    // (oc, kh, kw) for input (ih, iw) is Q[oc][ih + KH-1-kh][iw + KW-1-kw]; a tile chains over
    // (oc, kh, kw) in increasing order with lanes on iw, exactly the reference chain (terms with
    // no matching output read zeros of Q: fma(0, w, acc)).
    const int64_t tp = KH - 1 - pad, lp = KW - 1 - pad;
    const int64_t qh = H + KH - 1, qw = W + KW - 1, qplane = qh * qw;
    const int nv_row = W > kW ? 2 : 1;
    const int64_t tile_w = nv_row * kW;
    const int64_t slack = tile_w + KW;
    const int64_t KD = OC * KH * KW;
    const int64_t mpanels = CeilDiv(C, kMR);
    float* pa = ScratchBuffer(5, mpanels * kMR * KD);
    float* q = ScratchBuffer(7, B * OC * qplane + slack);
    for (int64_t ip = 0; ip < mpanels; ++ip) {
      ConvWeightTA{weight, &g}(pa + ip * KD * kMR, ip * kMR, MinI(kMR, C - ip * kMR), 0, KD);
    }
    ParallelFor(B * OC, threads, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        float* dst = q + p * qplane;
        for (int64_t i = 0; i < qplane; ++i) dst[i] = 0.0f;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const float* src = dout + p * P + oh * g.OW;
          for (int64_t ow = 0; ow < g.OW; ++ow) dst[(oh + tp) * qw + lp + ow] = src[ow];
        }
      }
    });
    for (int64_t i = 0; i < slack; ++i) q[B * OC * qplane + i] = 0.0f;
    const int64_t tiles_per_row = CeilDiv(W, tile_w);
    ParallelFor(B * H, threads, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / H, ih = t % H;
        const float* img = q + b * OC * qplane + ih * qw;
        float* out_row = dinp + b * C * H * W + ih * W;
        for (int64_t tw = 0; tw < tiles_per_row; ++tw) {
          const int64_t iw0 = tw * tile_w;
          const int nr = static_cast<int>(MinI(tile_w, W - iw0));
          if (nv_row == 2) {
            DirectConvRow<2, true>(pa, img, nullptr, out_row, H * W, C, KD, OC, KH, KW, qw, qplane,
                                   iw0, nr, !overwrite, overwrite, false);
          } else {
            DirectConvRow<1, true>(pa, img, nullptr, out_row, H * W, C, KD, OC, KH, KW, qw, qplane,
                                   iw0, nr, !overwrite, overwrite, false);
          }
        }
      }
    });
  } else if (dinp != nullptr) {
    // dinp[b] (C x HW) += W^T' (C x OC*KH*KW) @ dcol(b) (OC*KH*KW x HW).
    auto image = [&](int64_t b, int th) {
      GemmOut o;
      o.c = dinp + b * C * H * W;
      o.ldc = H * W;
      o.accumulate = !overwrite;
      o.plus_zero = overwrite;
      Gemm(C, H * W, OC * KH * KW, ConvWeightTA{weight, &g}, ConvDoutB{dout + b * OC * P, &g}, o,
           th);
    };
    if (B >= threads) {
      ParallelFor(B, threads, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) image(b, 1);
      });
    } else {
      for (int64_t b = 0; b < B; ++b) image(b, threads);
    }
  }
  if (dweight != nullptr) {
    // dweight (OC x K) += dout' (OC x B*P) @ col' (B*P x K).
    GemmOut o;
    o.c = dweight;
    o.ldc = K;
    o.accumulate = true;
    Gemm(OC, K, B * P, ConvDoutA{dout, &g}, ConvImageBT{inp, &g}, o, threads);
  }
  if (dbias != nullptr) ConvBiasGrad(dbias, dout, B, OC, P, threads);
}

void Conv2dBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int64_t B, int64_t C, int64_t H, int64_t W, int64_t OC,
                    int64_t KH, int64_t KW, int64_t stride, int64_t pad) {
  Conv2dBackwardImpl(dinp, dweight, dbias, dout, inp, weight, B, C, H, W, OC, KH, KW, stride, pad,
                     /*overwrite=*/false);
}

void Conv2dBackwardOverwrite(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, int64_t B, int64_t C, int64_t H,
                             int64_t W, int64_t OC, int64_t KH, int64_t KW, int64_t stride,
                             int64_t pad) {
  Conv2dBackwardImpl(dinp, dweight, dbias, dout, inp, weight, B, C, H, W, OC, KH, KW, stride, pad,
                     /*overwrite=*/true);
}

// ---- Pooling ------------------------------------------------------------------------------

// 2x2 windows at stride 2 (the common pool): lanes hold kW outputs of one output row, read as
// 2*kW contiguous floats of each of the two input rows and split into their even and odd
// columns (no gathers; the row's last outputs take partial loads, not a scalar loop). The window
// is scanned in the reference's order (0,0), (0,1), (1,0), (1,1) with the same strict '>' from
// its first element, so the winner and its index are the reference's. The winner's offset from
// the window rows' start (below 3 * W, exact as a float) is selected along with it.
void MaxPool2x2Forward(float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C,
                       int64_t H, int64_t W) {
  const int64_t OH = H / 2, OW = W / 2;
  const Vf two_iota = Iota() + Iota(), one = Set1(1.0f), w = Set1(static_cast<float>(W));
  ParallelFor(B * C, internal::ActiveThreads(), [&](int64_t p0, int64_t p1) {
    for (int64_t bc = p0; bc < p1; ++bc)
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t row0 = (bc * H + 2 * oh) * W;  // flat index of the window rows' start
        const float* r0 = inp + row0;
        const float* r1 = r0 + W;
        float* o = out + (bc * OH + oh) * OW;
        int32_t* am = argmax + (bc * OH + oh) * OW;
        for (int64_t ow = 0; ow < OW; ow += kW) {
          const int nv = static_cast<int>(MinI(kW, OW - ow));
          const int n_lo = static_cast<int>(MinI(kW, 2 * nv)), n_hi = 2 * nv - n_lo;
          Vf x00, x01, x10, x11;
          Deinterleave(LoadPartial(r0 + 2 * ow, n_lo), LoadPartial(r0 + 2 * ow + kW, n_hi), &x00,
                       &x01);
          Deinterleave(LoadPartial(r1 + 2 * ow, n_lo), LoadPartial(r1 + 2 * ow + kW, n_hi), &x10,
                       &x11);
          // Offsets of the four window positions of each lane's output from r0.
          const Vf o00 = Set1(static_cast<float>(2 * ow)) + two_iota, o10 = o00 + w;
          Vf best = x00, off = o00;
          Mask m = Gt(x01, best);
          best = Select(m, x01, best);
          off = Select(m, o00 + one, off);
          m = Gt(x10, best);
          best = Select(m, x10, best);
          off = Select(m, o10, off);
          m = Gt(x11, best);
          best = Select(m, x11, best);
          off = Select(m, o10 + one, off);
          float bests[kW], offs[kW];
          Store(offs, off);
          if (nv == kW) {
            Store(o + ow, best);
          } else {  // scalar stores: masked stores are microcoded on AMD Zen
            Store(bests, best);
            for (int i = 0; i < nv; ++i) o[ow + i] = bests[i];
          }
          for (int i = 0; i < nv; ++i)
            am[ow + i] = static_cast<int32_t>(row0 + static_cast<int64_t>(offs[i]));
        }
      }
  });
}

void MaxPool2dForward(float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C,
                      int64_t H, int64_t W, int64_t k, int64_t s) {
  if (k == 2 && s == 2 && 3 * W < (int64_t{1} << 24)) {
    MaxPool2x2Forward(out, argmax, inp, B, C, H, W);
    return;
  }
  const int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  ParallelFor(B * C, internal::ActiveThreads(), [&](int64_t p0, int64_t p1) {
    for (int64_t bc = p0; bc < p1; ++bc)
      for (int64_t oh = 0; oh < OH; ++oh) {
        int64_t ow = 0;
        // Full vectors of kW outputs: lanes hold outputs, the window is scanned in the same
        // (kh, kw) order with the same strict '>' test, and the winner's window position is kept
        // as a small exact float code kh*k + kw.
        for (; kW > 1 && ow + kW <= OW; ow += kW) {
          const float* win = inp + (bc * H + oh * s) * W + ow * s;
          Vf best = GatherStrided(win, s), code = Zero();
          for (int64_t kh = 0; kh < k; ++kh)
            for (int64_t kw = (kh == 0 ? 1 : 0); kw < k; ++kw) {
              const Vf v = GatherStrided(win + kh * W + kw, s);
              const Mask m = Gt(v, best);
              best = Select(m, v, best);
              code = Select(m, Set1(static_cast<float>(kh * k + kw)), code);
            }
          Store(out + (bc * OH + oh) * OW + ow, best);
          float codes[kW];
          Store(codes, code);
          for (int i = 0; i < kW; ++i) {
            const int64_t c = static_cast<int64_t>(codes[i]);
            argmax[(bc * OH + oh) * OW + ow + i] =
                static_cast<int32_t>((bc * H + oh * s + c / k) * W + (ow + i) * s + c % k);
          }
        }
        for (; ow < OW; ++ow) {
          int64_t best_i = (bc * H + oh * s) * W + ow * s;
          float best = inp[best_i];
          for (int64_t kh = 0; kh < k; ++kh)
            for (int64_t kw = 0; kw < k; ++kw) {
              const int64_t i = (bc * H + oh * s + kh) * W + ow * s + kw;
              if (inp[i] > best) {
                best = inp[i];
                best_i = i;
              }
            }
          out[(bc * OH + oh) * OW + ow] = best;
          argmax[(bc * OH + oh) * OW + ow] = static_cast<int32_t>(best_i);
        }
      }
  });
}

void MaxPool2dBackward(float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                       int64_t OH, int64_t OW) {
  // Each (b,c) plane's argmax points into the same plane of dinp, so planes are independent;
  // within a plane outputs add in increasing order like the reference.
  const int64_t P = OH * OW;
  ParallelFor(B * C, internal::ActiveThreads(), [&](int64_t p0, int64_t p1) {
    for (int64_t i = p0 * P; i < p1 * P; ++i) dinp[argmax[i]] += dout[i];
  });
}

// Per (b,c) plane, in that plane of dinp: zeroed, then each output of the plane in increasing order
// adds its gradient at its argmax through the ReLU's mask (out > 0 ? dinp + dout : 0; the output
// is the input at its argmax, so this is inp's mask there, read in order from a plane about
// 1/(s*s) the size of inp's). Where the mask is set this is MaxPool2dBackward's sum g, and 0 + g =
// g (g starts as 0 + dout, which is never -0, and a sum is -0 only when both terms are); elsewhere
// +0, as the two ops give. The plane (a few KB) stays in the cache between zeroing and scatter, so
// no separate pass over dinp zeroes it. With dbias on one thread, channels go in groups of
// kBiasGroup and images in order, each image's planes added to the bias chains (as
// Conv2dBackward's) while they are in the cache, so the bias gradient needs no pass of its own over
// dinp.
void MaxPool2dReluBackward(float* dinp, float* dbias, const float* dout, const int32_t* argmax,
                           const float* out, int64_t B, int64_t C, int64_t H, int64_t W, int64_t OH,
                           int64_t OW) {
  const int64_t P = OH * OW, HW = H * W;
  auto plane = [&](int64_t p) {
    // Plain local pointers into the plane, so the compiler need not reload them through the
    // lambda's captures after each store.
    float* __restrict d = dinp + p * HW;
    const float* __restrict x = out + p * P;
    const float* __restrict g = dout + p * P;
    const int32_t* __restrict am = argmax + p * P;
    const int64_t base = p * HW;
    for (int64_t i = 0; i < HW; i += kW)
      StorePartial(d + i, Zero(), static_cast<int>(MinI(kW, HW - i)));
    for (int64_t i = 0; i < P; ++i) {
      const int64_t j = am[i] - base;
      d[j] = x[i] > 0.0f ? d[j] + g[i] : 0.0f;
    }
  };
  const int threads = internal::ActiveThreads();
  if (dbias == nullptr || threads > 1) {
    // On several threads the planes split by image, as the convolution's backward that wrote
    // dout and read inp did, and the bias chains run as their own pass: split by channel
    // groups, each thread read half its planes' inputs from the other core's cache, and on two
    // threads the CNN step was slower than with the separate pass (7 of 8 interleaved rounds).
    ParallelFor(B * C, threads, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) plane(p);
    });
    if (dbias != nullptr) ConvBiasGrad(dbias, dinp, B, C, HW, threads);
    return;
  }
  ParallelFor(CeilDiv(C, kBiasGroup), threads, [&](int64_t g0, int64_t g1) {
    for (int64_t grp = g0; grp < g1; ++grp) {
      const int64_t c0 = grp * kBiasGroup, cnt = MinI(kBiasGroup, C - c0);
      float acc[kBiasGroup] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < cnt; ++i) plane(b * C + c0 + i);
        AddPlaneChains(acc, dinp + (b * C + c0) * HW, cnt, HW);
      }
      for (int64_t i = 0; i < cnt; ++i) dbias[c0 + i] += acc[i];
    }
  });
}

// ---- Element-wise --------------------------------------------------------------------------

// Runs body(i0, nv) over [0, n) in vector steps (nv < kW only for the tail), threaded when n is
// at least min_parallel (memory-bound ops need a large n to gain from a second thread).
template <typename Body>
void ForEachVec(int64_t n, const Body& body, int64_t min_parallel = int64_t{1} << 17) {
  const int64_t nvec = CeilDiv(n, kW);
  const int threads = n >= min_parallel ? internal::ActiveThreads() : 1;
  ParallelFor(nvec, threads, [&](int64_t v0, int64_t v1) {
    for (int64_t v = v0; v < v1; ++v) {
      const int64_t i = v * kW;
      body(i, static_cast<int>(MinI(kW, n - i)));
    }
  });
}

// A ReLU reads what the GEMM before it wrote, and a GEMM split over threads by columns leaves about
// half of it in the other core's cache: on one thread the Fashion MLP's two ReLUs (64 x 256 and
// 64 x 128) took ~25 us of a ~800 us 2-thread step, mostly pulling those lines across, while the
// other thread waited. Threaded from 2^13 elements, each thread pulls half.
constexpr int64_t kReluMinParallel = int64_t{1} << 13;

void ReluForward(float* out, const float* inp, int64_t n) {
  ForEachVec(
      n,
      [&](int64_t i, int nv) {
        const Vf x = LoadPartial(inp + i, nv);
        StorePartial(out + i, Select(Gt(x, Zero()), x, Zero()), nv);
      },
      kReluMinParallel);
}
void ReluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
  ForEachVec(
      n,
      [&](int64_t i, int nv) {
        const Vf x = LoadPartial(inp + i, nv), g = LoadPartial(dout + i, nv);
        StorePartial(dinp + i, LoadPartial(dinp + i, nv) + Select(Gt(x, Zero()), g, Zero()), nv);
      },
      kReluMinParallel);
}

// GeluBackward's local gradient of x (GeluBackward and GeluBackwardOverwrite).
inline Vf GeluGrad(Vf x) {
  const Vf cube = (x * x) * x;
  const Vf inner = Set1(kGeluK0) * (x + Set1(kGeluK1) * cube);
  const Vf t = TanhV(inner);
  const Vf sech2 = Set1(1.0f) - t * t;
  return Set1(0.5f) * (Set1(1.0f) + t) +
         (((Set1(0.5f) * x) * sech2) * Set1(kGeluK0)) * (Set1(1.0f) + (Set1(kGelu3K1) * x) * x);
}

void GeluForward(float* out, const float* inp, int64_t n) {
  ForEachVec(
      n,
      [&](int64_t i, int nv) {
        const Vf x = LoadPartial(inp + i, nv);
        const Vf cube = (x * x) * x;
        const Vf inner = Set1(kGeluK0) * (x + Set1(kGeluK1) * cube);
        StorePartial(out + i, (Set1(0.5f) * x) * (Set1(1.0f) + TanhV(inner)), nv);
      },
      int64_t{1} << 14);
}
void GeluBackward(float* dinp, const float* dout, const float* inp, int64_t n) {
  ForEachVec(
      n,
      [&](int64_t i, int nv) {
        const Vf grad = GeluGrad(LoadPartial(inp + i, nv));
        StorePartial(dinp + i, LoadPartial(dinp + i, nv) + grad * LoadPartial(dout + i, nv), nv);
      },
      int64_t{1} << 14);
}
void GeluBackwardOverwrite(float* dinp, const float* dout, const float* inp, int64_t n) {
  ForEachVec(
      n,
      [&](int64_t i, int nv) {
        const Vf grad = GeluGrad(LoadPartial(inp + i, nv));
        StorePartial(dinp + i, Zero() + grad * LoadPartial(dout + i, nv), nv);
      },
      int64_t{1} << 14);
}

void ResidualForward(float* out, const float* a, const float* b, int64_t n) {
  ForEachVec(n, [&](int64_t i, int nv) {
    StorePartial(out + i, LoadPartial(a + i, nv) + LoadPartial(b + i, nv), nv);
  });
}
void ResidualBackward(float* da, float* db, const float* dout, int64_t n) {
  ForEachVec(n, [&](int64_t i, int nv) {
    const Vf g = LoadPartial(dout + i, nv);
    StorePartial(da + i, LoadPartial(da + i, nv) + g, nv);
    StorePartial(db + i, LoadPartial(db + i, nv) + g, nv);
  });
}
void ResidualBackwardOverwrite(float* da, float* db, const float* dout, int64_t n) {
  ForEachVec(n, [&](int64_t i, int nv) {
    const Vf g = Zero() + LoadPartial(dout + i, nv);
    StorePartial(da + i, g, nv);
    if (db != nullptr) StorePartial(db + i, g, nv);
  });
}

void DropoutForward(float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed,
                    uint64_t stream) {
  const float keep_scale = 1.0f / (1.0f - p);
  const int threads = n >= (int64_t{1} << 14) ? internal::ActiveThreads() : 1;
  ParallelFor(n, threads, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      mask[i] = internal::DropoutMaskAt(static_cast<uint64_t>(i), p, keep_scale, seed, stream);
      out[i] = inp[i] * mask[i];
    }
  });
}
void DropoutBackward(float* dinp, const float* dout, const float* mask, int64_t n) {
  ForEachVec(n, [&](int64_t i, int nv) {
    StorePartial(dinp + i,
                 LoadPartial(dinp + i, nv) + LoadPartial(dout + i, nv) * LoadPartial(mask + i, nv),
                 nv);
  });
}

// ---- Softmax cross-entropy -------------------------------------------------------------------

float SumTreeImpl(const float* x, int64_t n, bool squares);

// True when rows [r, r + kW) can be processed with lanes holding rows (gathers with stride ld).
inline bool RowGroupFits(int64_t r, int64_t r_end, int64_t ld) {
  return kW > 1 && r + kW <= r_end && ld * (kW - 1) < (int64_t{1} << 31);
}

float SoftmaxCrossEntropyForward(float* probs, float* losses, const float* logits,
                                 const int32_t* targets, int64_t B, int64_t V) {
  const int threads = B * V >= (int64_t{1} << 14) ? internal::ActiveThreads() : 1;
  ParallelFor(B, threads, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1;) {
      // Row maxima and row sums are sequential chains per row; with a full group of kW rows the
      // lanes hold kW rows' chains (same order per row), else one row at a time.
      const int group = RowGroupFits(b, b1, V) ? kW : 1;
      float ms[kW], ss[kW];
      if (group > 1) {
        const float* xg = logits + b * V;
        Vf m = GatherStrided(xg, V);
        for (int64_t v = 1; v < V; ++v) m = Max(GatherStrided(xg + v, V), m);
        Store(ms, m);
      } else {
        const float* x = logits + b * V;
        float m = x[0];
        for (int64_t v = 1; v < V; ++v) m = x[v] > m ? x[v] : m;
        ms[0] = m;
      }
      for (int i = 0; i < group; ++i) {
        const float* x = logits + (b + i) * V;
        float* p = probs + (b + i) * V;
        const Vf mv = Set1(ms[i]);
        for (int64_t v = 0; v < V; v += kW) {
          const int nv = static_cast<int>(MinI(kW, V - v));
          StorePartial(p + v, ExpV(LoadPartial(x + v, nv) - mv), nv);
        }
      }
      if (group > 1) {
        const float* pg = probs + b * V;
        Vf sum = Zero();
        for (int64_t v = 0; v < V; ++v) sum = sum + GatherStrided(pg + v, V);
        Store(ss, sum);
      } else {
        const float* p = probs + b * V;
        float sum = 0.0f;
        for (int64_t v = 0; v < V; ++v) sum = sum + p[v];
        ss[0] = sum;
      }
      for (int i = 0; i < group; ++i) {
        const float* x = logits + (b + i) * V;
        float* p = probs + (b + i) * V;
        const Vf sv = Set1(ss[i]);
        for (int64_t v = 0; v < V; v += kW) {
          const int nv = static_cast<int>(MinI(kW, V - v));
          StorePartial(p + v, LoadPartial(p + v, nv) / sv, nv);
        }
        losses[b + i] = First(LogV(Set1(ss[i]))) - (x[targets[b + i]] - ms[i]);
      }
      b += group;
    }
  });
  return SumTreeImpl(losses, B, false) / static_cast<float>(B);
}

void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int64_t B, int64_t V) {
  const float scale = dloss / static_cast<float>(B);
  const int threads = B * V >= (int64_t{1} << 15) ? internal::ActiveThreads() : 1;
  ParallelFor(B, threads, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* d = dlogits + b * V;
      const float* p = probs + b * V;
      // Non-target columns: d + (p - 0) * scale, and p - 0 == p exactly; the target column is
      // redone from its saved old value as d + (p - 1) * scale.
      const int64_t t = targets[b];
      const float old = d[t];
      for (int64_t v = 0; v < V; v += kW) {
        const int nv = static_cast<int>(MinI(kW, V - v));
        StorePartial(d + v, LoadPartial(d + v, nv) + LoadPartial(p + v, nv) * Set1(scale), nv);
      }
      d[t] = old + (p[t] - 1.0f) * scale;
    }
  });
}

// ---- LayerNorm -------------------------------------------------------------------------------

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  const int threads = N * C >= (int64_t{1} << 14) ? internal::ActiveThreads() : 1;
  ParallelFor(N, threads, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1;) {
      // Mean and variance chains: lanes hold kW rows when a full group fits, else one row.
      const int group = RowGroupFits(n, n1, C) ? kW : 1;
      float ms[kW], ss[kW];
      if (group > 1) {
        const float* xg = inp + n * C;
        const Vf cf = Set1(static_cast<float>(C));
        Vf m = Zero();
        for (int64_t c = 0; c < C; ++c) m = m + GatherStrided(xg + c, C);
        m = m / cf;
        Vf v = Zero();
        for (int64_t c = 0; c < C; ++c) {
          const Vf xm = GatherStrided(xg + c, C) - m;
          v = Fma(xm, xm, v);
        }
        v = v / cf;
        Store(ms, m);
        Store(ss, Set1(1.0f) / Sqrt(v + Set1(kLayerNormEps)));
      } else {
        const float* x = inp + n * C;
        float m = 0.0f;
        for (int64_t c = 0; c < C; ++c) m = m + x[c];
        m = m / static_cast<float>(C);
        float v = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
          const float xm = x[c] - m;
          v = ScalarFma(xm, xm, v);
        }
        v = v / static_cast<float>(C);
        ms[0] = m;
        ss[0] = 1.0f / __builtin_sqrtf(v + kLayerNormEps);
      }
      for (int i = 0; i < group; ++i) {
        const float* x = inp + (n + i) * C;
        const Vf mv = Set1(ms[i]), sv = Set1(ss[i]);
        for (int64_t c = 0; c < C; c += kW) {
          const int nv = static_cast<int>(MinI(kW, C - c));
          const Vf norm = (LoadPartial(x + c, nv) - mv) * sv;
          StorePartial(out + (n + i) * C + c,
                       Fma(norm, LoadPartial(weight + c, nv), LoadPartial(bias + c, nv)), nv);
        }
        mean[n + i] = ms[i];
        rstd[n + i] = ss[i];
      }
      n += group;
    }
  });
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t N, int64_t C) {
  const int threads = N * C >= (int64_t{1} << 14) ? internal::ActiveThreads() : 1;
  if (dinp != nullptr) {
    ParallelFor(N, threads, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1;) {
        const int group = RowGroupFits(n, n1, C) ? kW : 1;
        float dms[kW], dns[kW];
        if (group > 1) {
          const float* xg = inp + n * C;
          const float* gg = dout + n * C;
          const Vf m = LoadPartial(mean + n, kW), s = LoadPartial(rstd + n, kW);
          Vf dmean = Zero(), dnmean = Zero();
          for (int64_t c = 0; c < C; ++c) {
            const Vf norm = (GatherStrided(xg + c, C) - m) * s;
            const Vf dnorm = Set1(weight[c]) * GatherStrided(gg + c, C);
            dmean = dmean + dnorm;
            dnmean = Fma(dnorm, norm, dnmean);
          }
          const Vf cf = Set1(static_cast<float>(C));
          Store(dms, dmean / cf);
          Store(dns, dnmean / cf);
        } else {
          const float* x = inp + n * C;
          const float* g = dout + n * C;
          const float m = mean[n], s = rstd[n];
          float dmean = 0.0f, dnmean = 0.0f;
          for (int64_t c = 0; c < C; ++c) {
            const float norm = (x[c] - m) * s;
            const float dnorm = weight[c] * g[c];
            dmean = dmean + dnorm;
            dnmean = ScalarFma(dnorm, norm, dnmean);
          }
          dms[0] = dmean / static_cast<float>(C);
          dns[0] = dnmean / static_cast<float>(C);
        }
        for (int i = 0; i < group; ++i) {
          const float* x = inp + (n + i) * C;
          const float* g = dout + (n + i) * C;
          const Vf mv = Set1(mean[n + i]), sv = Set1(rstd[n + i]);
          const Vf dmv = Set1(dms[i]), dnv = Set1(dns[i]);
          for (int64_t c = 0; c < C; c += kW) {
            const int nv = static_cast<int>(MinI(kW, C - c));
            const Vf norm = (LoadPartial(x + c, nv) - mv) * sv;
            const Vf dnorm = LoadPartial(weight + c, nv) * LoadPartial(g + c, nv);
            const Vf dval = ((dnorm - dmv) - norm * dnv) * sv;
            StorePartial(dinp + (n + i) * C + c, LoadPartial(dinp + (n + i) * C + c, nv) + dval,
                         nv);
          }
        }
        n += group;
      }
    });
  }
  if (dweight != nullptr || dbias != nullptr) {
    // Chains over n per column; lanes hold columns.
    ParallelFor(CeilDiv(C, kW), threads, [&](int64_t v0, int64_t v1) {
      for (int64_t vb = v0; vb < v1; ++vb) {
        const int64_t c = vb * kW;
        const int nv = static_cast<int>(MinI(kW, C - c));
        Vf dw = Zero(), db = Zero();
        for (int64_t n = 0; n < N; ++n) {
          const Vf g = LoadPartial(dout + n * C + c, nv);
          const Vf norm = (LoadPartial(inp + n * C + c, nv) - Set1(mean[n])) * Set1(rstd[n]);
          dw = Fma(norm, g, dw);
          db = db + g;
        }
        if (dweight != nullptr) StorePartial(dweight + c, LoadPartial(dweight + c, nv) + dw, nv);
        if (dbias != nullptr) StorePartial(dbias + c, LoadPartial(dbias + c, nv) + db, nv);
      }
    });
  }
}

// ---- Embedding -------------------------------------------------------------------------------

void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
  const int threads = N * C >= (int64_t{1} << 15) ? internal::ActiveThreads() : 1;
  ParallelFor(N, threads, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* src = table + static_cast<int64_t>(ids[n]) * C;
      for (int64_t c = 0; c < C; ++c) out[n * C + c] = src[c];
    }
  });
}

void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                       int64_t V) {
  // Counting sort of positions by id (stable: increasing n within an id), then one chain per
  // touched row; rows are independent, so threads split the list of touched rows.
  int32_t* order = reinterpret_cast<int32_t*>(ScratchBuffer(3, N + 1));
  float* starts_f = ScratchBuffer(4, V + 1);  // reused as int32 storage
  int32_t* starts = reinterpret_cast<int32_t*>(starts_f);
  for (int64_t v = 0; v <= V; ++v) starts[v] = 0;
  for (int64_t n = 0; n < N; ++n) starts[ids[n] + 1]++;
  for (int64_t v = 0; v < V; ++v) starts[v + 1] += starts[v];
  {
    int32_t* fill = reinterpret_cast<int32_t*>(ScratchBuffer(5, V + 1));
    for (int64_t v = 0; v <= V; ++v) fill[v] = starts[v];
    for (int64_t n = 0; n < N; ++n) order[fill[ids[n]]++] = static_cast<int32_t>(n);
  }
  const int threads = N * C >= (int64_t{1} << 15) ? internal::ActiveThreads() : 1;
  ParallelFor(V, threads, [&](int64_t va, int64_t vb) {
    for (int64_t v = va; v < vb; ++v) {
      const int32_t s0 = starts[v], s1 = starts[v + 1];
      if (s0 == s1) continue;
      for (int64_t c = 0; c < C; c += kW) {
        const int nv = static_cast<int>(MinI(kW, C - c));
        Vf acc = Zero();
        for (int32_t s = s0; s < s1; ++s) acc = acc + LoadPartial(dout + order[s] * C + c, nv);
        StorePartial(dtable + v * C + c, LoadPartial(dtable + v * C + c, nv) + acc, nv);
      }
    }
  });
}

// ---- Attention -------------------------------------------------------------------------------
//
// The reference's chains run over every position, masked ones included as fma(0, x, acc) (out and
// dq: terms t2 > t at the end of row t's chain; dv and dk: terms t < t2 at the start of row t2's).
// The GEMMs skip the micro-panels' masked terms (causal in GemmOut) where that keeps the bits:
// - a term at the start, fma(z, x, +0) with z*x a zero (z = ±0, x finite), leaves the chain at +0;
// - a term at the end, fma(+0, x, c) with x finite, leaves c unchanged unless c is -0 (it then
//   ends as +0 if some such x is >= +0), so outputs the skipping GEMM leaves at -0 are recomputed
//   with the whole chain (for dq, where the result is added to dq, the sum is -0 only when both
//   dq and the chain were -0);
// - where a skipped factor is not finite (or att's masked entries, an input of the backward, are
//   not zero), the head runs the whole chains.

// Whether every element of the rows x cols matrix at p (row stride ld) is finite: x * 0 is a
// zero for finite x, NaN for an infinity or NaN.
inline bool AllFinite(const float* p, int64_t rows, int64_t cols, int64_t ld) {
  Vf acc = Zero();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += kW) {
      const int nv = static_cast<int>(MinI(kW, cols - c));
      acc = acc + LoadPartial(p + r * ld + c, nv) * Zero();
    }
  }
  float lanes[kW];
  Store(lanes, acc);
  bool ok = true;
  for (int i = 0; i < kW; ++i) ok = ok && lanes[i] == 0.0f;
  return ok;
}

// Whether every element above the diagonal of the T x T matrix a (a[t * T + t2], t2 > t) is a
// zero of either sign: a sum of absolute values is 0 only when all are 0 (NaN, Inf stay nonzero).
inline bool UpperIsZero(const float* a, int64_t T) {
  Vf acc = Zero();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t t2 = t + 1; t2 < T; t2 += kW) {
      const int nv = static_cast<int>(MinI(kW, T - t2));
      acc = acc + Abs(LoadPartial(a + t * T + t2, nv));
    }
  }
  float lanes[kW];
  Store(lanes, acc);
  bool ok = true;
  for (int i = 0; i < kW; ++i) ok = ok && lanes[i] == 0.0f;
  return ok;
}

// Calls fix(r, i) for every element of the rows x cols matrix at p (row stride ld) that is -0.
// Zeros are rare in these outputs, so a vector pass looks for any zero first.
template <typename Fix>
inline void ForEachNegativeZero(const float* p, int64_t rows, int64_t cols, int64_t ld,
                                const Fix& fix) {
  Vf any = Zero();
  bool tail_zero = false;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t c = 0;
    for (; c + kW <= cols; c += kW) any = Select(Eq(Load(p + r * ld + c), Zero()), Set1(1.0f), any);
    for (; c < cols; ++c) tail_zero = tail_zero || p[r * ld + c] == 0.0f;
  }
  float lanes[kW];
  Store(lanes, any);
  bool found = tail_zero;
  for (int i = 0; i < kW; ++i) found = found || lanes[i] != 0.0f;
  if (!found) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float x = p[r * ld + c];
      if (x == 0.0f && __builtin_signbit(x)) fix(r, c);
    }
  }
}

void AttentionForward(float* out, float* preatt, float* att, const float* qkv, int64_t B, int64_t T,
                      int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
  ParallelFor(B * NH, internal::ActiveThreads(), [&](int64_t p0, int64_t p1) {
    for (int64_t bh = p0; bh < p1; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const float* q = qkv + b * T * C3 + h * hs;
      float* pre = preatt + bh * T * T;
      float* a = att + bh * T * T;
      // preatt = (chain over i of q[t,i] k[t2,i]) * scale.
      GemmOut o;
      o.c = pre;
      o.ldc = T;
      o.alpha = scale;
      o.use_alpha = true;
      o.causal = kCausalTiles;  // the masked outputs are overwritten with 0 below
      Gemm(T, T, hs, StridedA{q, C3, 1}, StridedB{q + C, 1, C3}, o, 1);
      // Softmax per row t over t2 <= t. Row maxima and sums are sequential chains per row; a full
      // group of kW rows runs them with lanes holding rows (a lane joins the chain at t2 <= t).
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t t2 = t + 1; t2 < T; ++t2) pre[t * T + t2] = 0.0f;
      }
      for (int64_t t0 = 0; t0 < T;) {
        const int group = RowGroupFits(t0, T, T) ? kW : 1;
        float ms[kW], ss[kW];
        if (group > 1) {
          const float* pg = pre + t0 * T;
          const Vf row = Set1(static_cast<float>(t0)) + Iota();  // lane i holds row t0 + i
          Vf m = GatherStrided(pg, T);
          for (int64_t t2 = 1; t2 < t0 + kW; ++t2) {
            const Mask active = Le(Set1(static_cast<float>(t2)), row);
            m = Select(active, Max(GatherStrided(pg + t2, T), m), m);
          }
          Store(ms, m);
        } else {
          const float* pr = pre + t0 * T;
          float m = pr[0];
          for (int64_t t2 = 1; t2 <= t0; ++t2) m = pr[t2] > m ? pr[t2] : m;
          ms[0] = m;
        }
        for (int i = 0; i < group; ++i) {
          const int64_t t = t0 + i;
          const Vf mv = Set1(ms[i]);
          for (int64_t t2 = 0; t2 <= t; t2 += kW) {
            const int nv = static_cast<int>(MinI(kW, t + 1 - t2));
            StorePartial(a + t * T + t2, ExpV(LoadPartial(pre + t * T + t2, nv) - mv), nv);
          }
        }
        if (group > 1) {
          const float* ag = a + t0 * T;
          const Vf row = Set1(static_cast<float>(t0)) + Iota();
          Vf sum = Zero();
          for (int64_t t2 = 0; t2 < t0 + kW; ++t2) {
            const Mask active = Le(Set1(static_cast<float>(t2)), row);
            sum = Select(active, sum + GatherStrided(ag + t2, T), sum);
          }
          Store(ss, sum);
        } else {
          const float* ar = a + t0 * T;
          float sum = 0.0f;
          for (int64_t t2 = 0; t2 <= t0; ++t2) sum = sum + ar[t2];
          ss[0] = sum;
        }
        for (int i = 0; i < group; ++i) {
          const int64_t t = t0 + i;
          float* ar = a + t * T;
          const Vf inv = Set1(1.0f / ss[i]);
          for (int64_t t2 = 0; t2 <= t; t2 += kW) {
            const int nv = static_cast<int>(MinI(kW, t + 1 - t2));
            StorePartial(ar + t2, LoadPartial(ar + t2, nv) * inv, nv);
          }
          for (int64_t t2 = t + 1; t2 < T; ++t2) ar[t2] = 0.0f;
        }
        t0 += group;
      }
      // out[t,i] = chain over t2 of att[t,t2] v[t2,i]; the masked terms (att +0) end the chain.
      const float* v = q + 2 * C;
      float* o_bh = out + b * T * C + h * hs;
      GemmOut oo;
      oo.c = o_bh;
      oo.ldc = C;
      const bool skip = AllFinite(v, T, hs, C3);
      if (skip) oo.causal = kCausalUpTo;
      Gemm(T, hs, T, StridedA{a, T, 1}, StridedB{v, C3, 1}, oo, 1);
      if (skip) {
        ForEachNegativeZero(o_bh, T, hs, C, [&](int64_t t, int64_t i) {
          float acc = 0.0f;
          for (int64_t t2 = 0; t2 < T; ++t2) acc = ScalarFma(a[t * T + t2], v[t2 * C3 + i], acc);
          o_bh[t * C + i] = acc;
        });
      }
    }
  });
}

void AttentionBackward(float* dqkv, float* dpreatt, float* datt, const float* dout,
                       const float* qkv, const float* att, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
  ParallelFor(B * NH, internal::ActiveThreads(), [&](int64_t p0, int64_t p1) {
    for (int64_t bh = p0; bh < p1; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* g = dout + b * T * C + h * hs;
      float* dq = dqkv + b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* A = att + bh * T * T;
      float* dA = datt + bh * T * T;
      float* dP = dpreatt + bh * T * T;
      // att's masked entries (an input here) are zeros, as AttentionForward writes them.
      const bool upper_zero = UpperIsZero(A, T);
      {  // datt = dout @ v^T, masked to 0.
        GemmOut o;
        o.c = dA;
        o.ldc = T;
        o.causal = kCausalTiles;
        Gemm(T, T, hs, StridedA{g, C, 1}, StridedB{v, 1, C3}, o, 1);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t t2 = t + 1; t2 < T; ++t2) dA[t * T + t2] = 0.0f;
      }
      {  // dv += att^T @ dout.
        GemmOut o;
        o.c = dv;
        o.ldc = C3;
        o.accumulate = true;
        if (upper_zero && AllFinite(g, T, hs, C)) o.causal = kCausalFrom;
        Gemm(T, hs, T, StridedA{A, 1, T}, StridedB{g, C, 1}, o, 1);
      }
      for (int64_t t0 = 0; t0 < T;) {
        // s_t = chain over all t2 of att*datt; lanes hold rows for a full group. Past the group's
        // last row every term is masked, fma(zero, +0, s), which leaves s unchanged unless it is
        // -0 (when att's masked entries are zeros): those terms are skipped and a row whose s
        // ends at -0 runs its whole chain.
        const int group = RowGroupFits(t0, T, T) ? kW : 1;
        const int64_t t2_end = upper_zero ? t0 + group : T;
        float ss[kW];
        if (group > 1) {
          Vf sv = Zero();
          for (int64_t t2 = 0; t2 < t2_end; ++t2) {
            sv = Fma(GatherStrided(A + t0 * T + t2, T), GatherStrided(dA + t0 * T + t2, T), sv);
          }
          Store(ss, sv);
        } else {
          float s = 0.0f;
          for (int64_t t2 = 0; t2 < t2_end; ++t2) {
            s = ScalarFma(A[t0 * T + t2], dA[t0 * T + t2], s);
          }
          ss[0] = s;
        }
        for (int i = 0; i < group; ++i) {
          if (ss[i] == 0.0f && __builtin_signbit(ss[i]) && t2_end < T) {
            const int64_t t = t0 + i;
            float s = 0.0f;
            for (int64_t t2 = 0; t2 < T; ++t2) s = ScalarFma(A[t * T + t2], dA[t * T + t2], s);
            ss[i] = s;
          }
        }
        for (int i = 0; i < group; ++i) {
          const int64_t t = t0 + i;
          const float* ar = A + t * T;
          const float* dar = dA + t * T;
          const Vf sv = Set1(ss[i]);
          for (int64_t t2 = 0; t2 <= t; t2 += kW) {  // the masked ones are written 0 below
            const int nv = static_cast<int>(MinI(kW, t + 1 - t2));
            StorePartial(dP + t * T + t2,
                         LoadPartial(ar + t2, nv) * (LoadPartial(dar + t2, nv) - sv), nv);
          }
          for (int64_t t2 = t + 1; t2 < T; ++t2) dP[t * T + t2] = 0.0f;
        }
        t0 += group;
      }
      {  // dq += (dpreatt @ k) * scale.
        GemmOut o;
        o.c = dq;
        o.ldc = C3;
        o.accumulate = true;
        o.alpha = scale;
        o.use_alpha = true;
        const bool skip = AllFinite(k, T, hs, C3);
        if (skip) o.causal = kCausalUpTo;
        Gemm(T, hs, T, StridedA{dP, T, 1}, StridedB{k, C3, 1}, o, 1);
        if (skip) {
          ForEachNegativeZero(dq, T, hs, C3, [&](int64_t t, int64_t i) {
            float acc = 0.0f;
            for (int64_t t2 = 0; t2 < T; ++t2) acc = ScalarFma(dP[t * T + t2], k[t2 * C3 + i], acc);
            dq[t * C3 + i] = dq[t * C3 + i] + acc * scale;  // dq was -0 (see above)
          });
        }
      }
      {  // dk += (dpreatt^T @ q) * scale.
        GemmOut o;
        o.c = dk;
        o.ldc = C3;
        o.accumulate = true;
        o.alpha = scale;
        o.use_alpha = true;
        if (AllFinite(q, T, hs, C3)) o.causal = kCausalFrom;
        Gemm(T, hs, T, StridedA{dP, 1, T}, StridedB{q, C3, 1}, o, 1);
      }
    }
  });
}

// ---- Sums and math arrays ----------------------------------------------------------------------

// The block partials p[b0 - first], ..., of blocks [b0, b1) of x (n elements): each block of
// kSumBlock elements is its own sequential chain (ref::SumTree's blocks), eight blocks at a time
// for instruction-level parallelism.
inline void BlockPartials(const float* x, int64_t n, int64_t b0, int64_t b1, bool squares,
                          float* p) {
  for (; b0 < b1; b0 += 8) {
    const int64_t cnt = MinI(8, b1 - b0);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const bool full = cnt == 8 && (b0 + 8) * kSumBlock <= n;
    if (full) {
      for (int64_t i = 0; i < kSumBlock; ++i)
        for (int j = 0; j < 8; ++j) {
          const float v = x[(b0 + j) * kSumBlock + i];
          acc[j] = squares ? ScalarFma(v, v, acc[j]) : acc[j] + v;
        }
    } else {
      for (int64_t j = 0; j < cnt; ++j) {
        const int64_t s = (b0 + j) * kSumBlock, e = MinI(n, s + kSumBlock);
        for (int64_t i = s; i < e; ++i)
          acc[j] = squares ? ScalarFma(x[i], x[i], acc[j]) : acc[j] + x[i];
      }
    }
    for (int64_t j = 0; j < cnt; ++j) p[j] = acc[j];
    p += cnt;
  }
}

// Same blocks and tree as ref::SumTree.
float SumTreeImpl(const float* x, int64_t n, bool squares) {
  if (n <= 0) return 0.0f;
  const int64_t nb = CeilDiv(n, kSumBlock);
  float* p = ScratchBuffer(6, nb);  // the caller's buffer; workers write their blocks' partials
  // Block partials are independent: threads split groups of 8 blocks (2^16 elements and up).
  const int threads = n >= (int64_t{1} << 16) ? internal::ActiveThreads() : 1;
  ParallelFor(CeilDiv(nb, 8), threads, [&](int64_t g0, int64_t g1) {
    BlockPartials(x, n, g0 * 8, MinI(nb, g1 * 8), squares, p + g0 * 8);
  });
  return internal::CombinePartialsTree(p, nb);
}

void SumSquaresBlocks(const float* x, int64_t n, float* partials) {
  BlockPartials(x, n, 0, CeilDiv(n, kSumBlock), true, partials);
}

float SumTree(const float* x, int64_t n) { return SumTreeImpl(x, n, false); }
float SumSquaresTree(const float* x, int64_t n) { return SumTreeImpl(x, n, true); }

// The reference's per-element AdamW formula, lanes over elements; threads split element ranges.
void AdamWUpdate(float* w, float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  ForEachVec(
      n,
      [&](int64_t i, int nv) {
        Vf gi = LoadPartial(g + i, nv);
        if (s.scale_grad) {
          gi = gi * Set1(s.grad_scale);
          StorePartial(g + i, gi, nv);
        }
        Vf wi = LoadPartial(w + i, nv);
        if (s.decay_weight) wi = wi * Set1(s.decay);
        const Vf mi = Set1(s.b1) * LoadPartial(m + i, nv) + Set1(s.one_minus_b1) * gi;
        const Vf vi = Set1(s.b2) * LoadPartial(v + i, nv) + Set1(s.one_minus_b2) * (gi * gi);
        StorePartial(m + i, mi, nv);
        StorePartial(v + i, vi, nv);
        const Vf denom = Sqrt(vi) / Set1(s.bc2_sqrt) + Set1(s.eps);
        StorePartial(w + i, wi - Set1(s.step_size) * (mi / denom), nv);
      },
      int64_t{1} << 15);
}

template <Vf (*F)(Vf)>
void MapArray(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += kW) {
    const int nv = static_cast<int>(MinI(kW, n - i));
    StorePartial(y + i, F(LoadPartial(x + i, nv)), nv);
  }
}

inline internal::KernelTable MakeTable() {
  internal::KernelTable t;
  t.linear_forward = &LinearForward;
  t.linear_backward = &LinearBackward;
  t.linear_relu_forward = &LinearReluForward;
  t.linear_relu_backward = &LinearReluBackward;
  t.linear_backward_overwrite = &LinearBackwardOverwrite;
  t.conv2d_forward = &Conv2dForward;
  t.conv2d_backward = &Conv2dBackward;
  t.conv2d_backward_overwrite = &Conv2dBackwardOverwrite;
  t.conv2d_relu_forward = &Conv2dReluForward;
  t.maxpool2d_forward = &MaxPool2dForward;
  t.maxpool2d_backward = &MaxPool2dBackward;
  t.maxpool2d_relu_backward = &MaxPool2dReluBackward;
  t.relu_forward = &ReluForward;
  t.relu_backward = &ReluBackward;
  t.gelu_forward = &GeluForward;
  t.gelu_backward = &GeluBackward;
  t.gelu_backward_overwrite = &GeluBackwardOverwrite;
  t.softmax_ce_forward = &SoftmaxCrossEntropyForward;
  t.softmax_ce_backward = &SoftmaxCrossEntropyBackward;
  t.layernorm_forward = &LayerNormForward;
  t.layernorm_backward = &LayerNormBackward;
  t.embedding_forward = &EmbeddingForward;
  t.embedding_backward = &EmbeddingBackward;
  t.attention_forward = &AttentionForward;
  t.attention_backward = &AttentionBackward;
  t.residual_forward = &ResidualForward;
  t.residual_backward = &ResidualBackward;
  t.residual_backward_overwrite = &ResidualBackwardOverwrite;
  t.dropout_forward = &DropoutForward;
  t.dropout_backward = &DropoutBackward;
  t.adamw_update = &AdamWUpdate;
  t.sum_tree = &SumTree;
  t.sum_squares_tree = &SumSquaresTree;
  t.sum_squares_blocks = &SumSquaresBlocks;
  t.exp_array = &MapArray<ExpV>;
  t.log_array = &MapArray<LogV>;
  t.tanh_array = &MapArray<TanhV>;
  t.erf_array = &MapArray<ErfV>;
  return t;
}

}  // namespace meshlearn::engine::MESHLEARN_SIMD_NS

// The engine's worker threads: one small persistent pool shared by all kernels.
//
// Kernels split *independent outputs* into contiguous chunks and run them here; which thread runs
// which chunk never changes a result (see kernels.h). Nested calls (a chunk that calls ParallelFor
// again) and concurrent callers are safe: a nested call runs inline, concurrent callers take turns.
//
//   ParallelFor(rows, threads, [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) DoRow(r);
//   });
#pragma once

#include <cstdint>
#include <type_traits>

namespace meshlearn::engine {

using ParallelFn = void (*)(void* ctx, int64_t begin, int64_t end);

// Splits [0, n) into min(n, threads) contiguous chunks of near-equal size and calls
// fn(ctx, begin, end) once per chunk, on the pool's threads and the caller's. Returns when all
// chunks are done. threads <= 1 or n <= 1 runs fn(ctx, 0, n) on the caller.
void ParallelForRaw(int64_t n, int threads, ParallelFn fn, void* ctx);

template <typename F>
void ParallelFor(int64_t n, int threads, F&& f) {
  using Fn = typename std::remove_reference<F>::type;
  ParallelForRaw(
      n, threads,
      [](void* ctx, int64_t begin, int64_t end) { (*static_cast<Fn*>(ctx))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// Element-wise work over several arrays as one parallel region: array k has sizes[k] elements,
// cut into pieces of `align` elements (the last piece of an array may be shorter); chunk t of
// T = threads chunks (one when threads <= 1) takes the t-th of T near-equal contiguous runs of
// pieces of every array, and f(k, begin, end) is called for each nonempty run. A model's
// parameters are many small arrays: one region for all of them, instead of one per large array and
// none for the small ones, keeps a second thread busy (the optimizer update, zeroing gradients).
// Cutting every array the same way (not the arrays laid end to end) gives each thread the same
// part of each array as a column-split GEMM's own units give it of a weight, and a weight
// gradient's GEMM split by rows (GemmOut::split_rows) its part of the gradient: the zeroing,
// the gradient norm and the update then touch what the same core last wrote or read. Laid end to
// end, half of the first layer's gradient moved between the cores every step, and with the two
// vCPUs far apart (a cache line's round trip ~340 ns instead of ~100) the update took 3x as long
// on two threads as a second update right after it.
// Only for work whose result does not depend on the split (each element on its own).
template <typename F>
void ParallelForArrays(const int64_t* sizes, int64_t count, int threads, int64_t align, F&& f) {
  const int64_t parts = threads > 1 ? threads : 1;
  ParallelFor(parts, threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t k = 0; k < count; ++k) {
        const int64_t n = (sizes[k] + align - 1) / align;  // array k's pieces
        const int64_t lo = n * t / parts, hi = n * (t + 1) / parts;
        if (lo < hi) f(k, lo * align, hi * align < sizes[k] ? hi * align : sizes[k]);
      }
    }
  });
}

// Work units [0, n) for the chunks of one ParallelFor(parts, threads, ...) region, claimed with
// a little stealing: the units are split into `parts` contiguous ranges, chunk t takes units from
// the front of range t, and when that is empty from the back of the other ranges. When every
// thread keeps pace, each takes its own range -- the same units, so the same data, on the same
// thread in every call, which keeps that data in its core's cache from one call to the next --
// and a thread that starts late or runs slower leaves the rest of its range to the others.
// Header-only on GCC's atomic builtins (the SIMD kernels use no STL). Use only for units whose
// results do not depend on who runs them or in what order.
//
//   UnitQueue q(units, parts);
//   ParallelFor(parts, threads, [&](int64_t t, int64_t) {
//     for (int64_t u; (u = q.Next(static_cast<int>(t))) >= 0;) DoUnit(u);
//   });
class UnitQueue {
 public:
  static constexpr int kMaxParts = 16;
  // REQUIRES: 1 <= parts <= kMaxParts, 0 <= n < 2^31.
  UnitQueue(int64_t n, int parts) : parts_(parts) {
    for (int t = 0; t < parts; ++t) {
      ranges_[t].v = Pack(n * t / parts, n * (t + 1) / parts);
    }
  }
  UnitQueue(const UnitQueue&) = delete;
  UnitQueue& operator=(const UnitQueue&) = delete;

  // The next unit for chunk t (0 <= t < parts), or -1 when no unit is left in any range.
  int64_t Next(int t) {
    for (int k = 0; k < parts_; ++k) {
      uint64_t* r = &ranges_[(t + k) % parts_].v;
      uint64_t cur = __atomic_load_n(r, __ATOMIC_RELAXED);
      for (;;) {
        const int64_t lo = static_cast<int64_t>(cur & 0xffffffffu);
        const int64_t hi = static_cast<int64_t>(cur >> 32);
        if (lo >= hi) break;
        // The own range from its front, another's from its back.
        const uint64_t want = k == 0 ? Pack(lo + 1, hi) : Pack(lo, hi - 1);
        if (__atomic_compare_exchange_n(r, &cur, want, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
          return k == 0 ? lo : hi - 1;
        }
      }
    }
    return -1;
  }

 private:
  static uint64_t Pack(int64_t lo, int64_t hi) {
    return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
  }
  struct alignas(64) Range {  // one cache line each: threads claim from their own
    uint64_t v;
  };
  Range ranges_[kMaxParts];
  int parts_;
};

// A per-thread, 64-byte aligned scratch buffer of at least n floats, one per slot (0..7). Valid
// until the same thread asks for the same slot again. For kernel packing buffers.
float* ScratchBuffer(int slot, int64_t n);

}  // namespace meshlearn::engine

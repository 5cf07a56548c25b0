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

// A per-thread, 64-byte aligned scratch buffer of at least n floats, one per slot (0..7). Valid
// until the same thread asks for the same slot again. For kernel packing buffers.
float* ScratchBuffer(int slot, int64_t n);

}  // namespace meshlearn::engine

#include "meshlearn/engine/threadpool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/tensor.h"

namespace meshlearn::engine {
namespace {

// ZeroFloats splits large buffers over the kernels' threads: every element of [0, n) becomes
// +0.0f (not -0.0f), and nothing outside it is touched, at sizes around its chunking.
TEST(ThreadPoolTest, ZeroFloatsZeroesExactlyTheRange) {
  const KernelConfig saved = GetKernelConfig();
  for (int threads : {1, 2, 3}) {
    ASSERT_TRUE(SetKernelConfig({saved.simd, threads}).ok());
    for (int64_t n : std::vector<int64_t>{0, 1, 1000, (1 << 17) - 1, (1 << 17) + 7, (1 << 19) - 1,
                                          (1 << 19) + 7, 3000001}) {
      std::vector<float> v(static_cast<size_t>(n + 2), -1.5f);
      ZeroFloats(v.data() + 1, n);
      EXPECT_EQ(v[0], -1.5f);
      EXPECT_EQ(v[static_cast<size_t>(n + 1)], -1.5f);
      for (int64_t i = 1; i <= n; ++i) {
        ASSERT_EQ(v[static_cast<size_t>(i)], 0.0f) << n << " " << threads << " " << i;
        ASSERT_FALSE(std::signbit(v[static_cast<size_t>(i)])) << i;
      }
    }
  }
  ASSERT_TRUE(SetKernelConfig(saved).ok());
}

TEST(ThreadPoolTest, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 8}) {
    for (int64_t n : {0, 1, 2, 5, 64, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      ParallelFor(n, threads, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << n << " " << threads;
    }
  }
}

TEST(ThreadPoolTest, ChunksAreContiguousAndNearEqual) {
  std::vector<std::pair<int64_t, int64_t>> chunks(4);
  std::atomic<int> next{0};
  ParallelFor(10, 4, [&](int64_t b, int64_t e) { chunks[next++] = {b, e}; });
  ASSERT_EQ(next.load(), 4);
  int64_t total = 0;
  for (auto [b, e] : chunks) {
    EXPECT_GE(e - b, 2);
    EXPECT_LE(e - b, 3);
    total += e - b;
  }
  EXPECT_EQ(total, 10);
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  std::atomic<int64_t> sum{0};
  ParallelFor(8, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      ParallelFor(100, 4, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) sum += j;
      });
    }
  });
  EXPECT_EQ(sum.load(), 8 * 4950);
}

TEST(ThreadPoolTest, ConcurrentCallersTakeTurns) {
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        ParallelFor(50, 2, [&](int64_t b, int64_t e) { sum += e - b; });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 3 * 200 * 50);
}

// ParallelForArrays visits every element of every array exactly once, in ranges that start at a
// multiple of the piece size and stay inside their array; empty arrays get no call; with T > 1
// threads every array is cut into the same T near-equal runs of pieces (chunk t's run of each
// array is its t-th), so that each thread gets the same part of every array.
TEST(ThreadPoolTest, ParallelForArraysCoversEveryElementOnceInAlignedRanges) {
  const std::vector<std::vector<int64_t>> cases = {
      {}, {0}, {1}, {5, 0, 3}, {1024}, {1025, 7, 4096, 0, 1}, {200704, 256, 32768, 128, 1280, 10}};
  for (int threads : {1, 2, 3, 8}) {
    for (const std::vector<int64_t>& sizes : cases) {
      for (int64_t align : {int64_t{1}, int64_t{16}, int64_t{1024}}) {
        std::vector<std::vector<std::atomic<int>>> hits;
        for (int64_t n : sizes) hits.emplace_back(static_cast<size_t>(n));
        std::atomic<int> calls{0}, bad{0};
        std::mutex got_mu;
        std::set<std::tuple<int64_t, int64_t, int64_t>> got;  // (array, begin, end) of each call
        ParallelForArrays(sizes.data(), static_cast<int64_t>(sizes.size()), threads, align,
                          [&](int64_t k, int64_t b, int64_t e) {
                            ++calls;
                            {
                              std::lock_guard<std::mutex> lock(got_mu);
                              got.insert({k, b, e});
                            }
                            if (k < 0 || k >= static_cast<int64_t>(sizes.size()) || b % align != 0 ||
                                b >= e || e > sizes[static_cast<size_t>(k)]) {
                              ++bad;
                              return;
                            }
                            for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(k)][static_cast<size_t>(i)];
                          });
        ASSERT_EQ(bad.load(), 0) << threads << " threads, align " << align;
        for (size_t k = 0; k < sizes.size(); ++k) {
          for (int64_t i = 0; i < sizes[k]; ++i) {
            ASSERT_EQ(hits[k][static_cast<size_t>(i)].load(), 1) << "array " << k << " element " << i;
          }
        }
        // Exactly the calls of the per-array cut: array k's run t is pieces [n*t/T, n*(t+1)/T).
        std::set<std::tuple<int64_t, int64_t, int64_t>> want;
        for (size_t k = 0; k < sizes.size(); ++k) {
          const int64_t n = (sizes[k] + align - 1) / align;
          for (int64_t t = 0; t < threads; ++t) {
            const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
            if (lo < hi) {
              want.insert({static_cast<int64_t>(k), lo * align, std::min(hi * align, sizes[k])});
            }
          }
        }
        EXPECT_EQ(got, want) << threads << " threads, align " << align;
        EXPECT_EQ(calls.load(), static_cast<int>(want.size()));
      }
    }
  }
}

// Every unit is handed out exactly once, however many threads claim them at once.
TEST(UnitQueueTest, EveryUnitExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 8}) {
    for (int64_t n : {0, 1, 2, 5, 64, 1001}) {
      const int parts = std::min(threads, UnitQueue::kMaxParts);
      UnitQueue q(n, parts);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      ParallelFor(parts, threads, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          for (int64_t u; (u = q.Next(static_cast<int>(t))) >= 0;) {
            ASSERT_LT(u, n);
            hits[static_cast<size_t>(u)]++;
          }
        }
      });
      for (int64_t u = 0; u < n; ++u) {
        EXPECT_EQ(hits[static_cast<size_t>(u)].load(), 1) << threads << " " << n << " " << u;
      }
    }
  }
}

// A part takes its own range from the front, then the others' from their backs: a thread that
// never claims leaves its units to the rest (here part 0 alone drains both ranges).
TEST(UnitQueueTest, OwnRangeFirstThenStealsFromTheBack) {
  UnitQueue q(10, 2);
  std::vector<int64_t> order;
  for (int64_t u; (u = q.Next(0)) >= 0;) order.push_back(u);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 9, 8, 7, 6, 5}));
  EXPECT_EQ(q.Next(1), -1);

  UnitQueue r(7, 3);  // ranges [0, 2), [2, 4), [4, 7)
  EXPECT_EQ(r.Next(1), 2);
  EXPECT_EQ(r.Next(2), 4);
  EXPECT_EQ(r.Next(1), 3);
  EXPECT_EQ(r.Next(1), 6);  // its own range is empty: the back of part 2's
  EXPECT_EQ(r.Next(1), 5);
  EXPECT_EQ(r.Next(1), 1);  // then part 0's
  EXPECT_EQ(r.Next(0), 0);
  EXPECT_EQ(r.Next(0), -1);
}

TEST(ThreadPoolTest, ScratchBufferIsAlignedAndGrows) {
  float* a = ScratchBuffer(0, 10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  a[9] = 1.0f;
  float* b = ScratchBuffer(0, 1 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  b[(1 << 20) - 1] = 2.0f;
}

}  // namespace
}  // namespace meshlearn::engine

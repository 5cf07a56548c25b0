#include "meshlearn/engine/threadpool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
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
    for (int64_t n : std::vector<int64_t>{0, 1, 1000, (1 << 19) - 1, (1 << 19) + 7, 3000001}) {
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

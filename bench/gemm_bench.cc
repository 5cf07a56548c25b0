// gemm_bench: GFLOP/s of the engine's deterministic LinearForward (its GEMM) against OpenBLAS
// cblas_sgemm on the same shapes, measured in the same run, on 1 and 2 threads. Also times the
// implicit-GEMM Conv2dForward against im2col + cblas_sgemm. Prints one JSON line per case.
//
//   gemm_bench                       # all cases
//   gemm_bench --sizes=256,512 --threads=1
//   gemm_bench --sizes= --shapes=2048x1152x384 --conv=0   # one GPT shape (M x N x K), no conv
//
// Default shapes: squares 256..2048 and the linear layers of code-gpt-10m at batch 8 x 256 tokens
// (M = B*T = 2048; qkv 384->1152, attention proj 384->384, MLP fc 384->1536 and proj 1536->384).
//
// Each timing is the best of several repetitions, the two contenders in alternating blocks (the
// machine may be shared). Besides wall-clock GFLOP/s it prints GFLOP per process-CPU-second, which
// a busy host's time slicing does not distort (with 2 threads it is per CPU, not per wall second).
// The engine result is also checked to be bitwise identical between thread counts.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/kernels.h"

extern "C" char* openblas_get_corename(void);

namespace {

using meshlearn::engine::GetKernelConfig;
using meshlearn::engine::KernelConfig;
using meshlearn::engine::SetKernelConfig;

std::vector<float> Random(int64_t n, uint64_t seed) {
  meshlearn::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.UniformDouble() * 2.0 - 1.0);
  return v;
}

struct Time {
  double wall = 1e30;  // seconds
  double cpu = 1e30;   // process CPU seconds (all threads): robust to time slicing on a busy host
};

Time Measure(const std::function<void()>& fn) {
  timespec c0, c1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  auto t0 = std::chrono::steady_clock::now();
  fn();
  Time t;
  t.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  t.cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) +
          1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec);
  return t;
}

// Best wall and CPU times of `fn` over at least ~min_total wall seconds (and 5 repetitions).
Time BestTime(const std::function<void()>& fn, double min_total) {
  fn();  // warm-up
  Time best;
  double total = 0;
  for (int reps = 0; (total < min_total || reps < 5) && reps < 400; ++reps) {
    const Time t = Measure(fn);
    best.wall = std::min(best.wall, t.wall);
    best.cpu = std::min(best.cpu, t.cpu);
    total += t.wall;
  }
  return best;
}

// Best times of a and b, in rounds of a block of a's repetitions then a block of b's, each block
// after a 0.2 s pause. Blocks rather than strict alternation: OpenBLAS's workers keep polling
// for ~0.1 s after each call (and the engine's pool for 0.2 ms), so a call right after the other
// library's shares the cores with its spinning threads; the pause lets them go to sleep. Several
// rounds so that a shared machine's load hits both alike.
std::pair<Time, Time> BestTimes(const std::function<void()>& a, const std::function<void()>& b,
                                double min_total = 0.8) {
  Time best_a, best_b;
  for (int round = 0; round < 3; ++round) {
    for (int which = 0; which < 2; ++which) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const Time t = BestTime(which == 0 ? a : b, min_total / 6);
      Time& best = which == 0 ? best_a : best_b;
      best.wall = std::min(best.wall, t.wall);
      best.cpu = std::min(best.cpu, t.cpu);
    }
  }
  return {best_a, best_b};
}

// "MxNxK,MxNxK" -> shapes; false on malformed input.
struct Shape {
  int64_t M, N, K;
};
bool ParseShapes(const char* s, std::vector<Shape>* out) {
  while (*s) {
    long long m = 0, n = 0, k = 0;
    int used = 0;
    if (std::sscanf(s, "%lldx%lldx%lld%n", &m, &n, &k, &used) != 3 || m <= 0 || n <= 0 || k <= 0)
      return false;
    out->push_back(Shape{m, n, k});
    s += used;
    if (*s == ',')
      ++s;
    else if (*s)
      return false;
  }
  return true;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  while (*s) {
    out.push_back(std::atoi(s));
    const char* c = std::strchr(s, ',');
    if (!c) break;
    s = c + 1;
  }
  return out;
}

void Im2col(float* col, const float* x, int64_t C, int64_t H, int64_t W, int64_t K, int64_t s,
            int64_t p, int64_t OH, int64_t OW) {
  for (int64_t c = 0; c < C; ++c)
    for (int64_t kh = 0; kh < K; ++kh)
      for (int64_t kw = 0; kw < K; ++kw) {
        float* row = col + ((c * K + kh) * K + kw) * OH * OW;
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t ih = oh * s - p + kh, iw = ow * s - p + kw;
            row[oh * OW + ow] =
                (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[(c * H + ih) * W + iw] : 0.0f;
          }
      }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {256, 384, 512, 768, 1024, 1536, 2048};
  std::vector<Shape> shapes = {
      {2048, 1152, 384}, {2048, 384, 384}, {2048, 1536, 384}, {2048, 384, 1536}};
  std::vector<int> threads = {1, 2};
  bool conv = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--sizes=", 8) == 0) {
      sizes = ParseList(argv[i] + 8);
    } else if (std::strncmp(argv[i], "--shapes=", 9) == 0) {
      shapes.clear();
      if (!ParseShapes(argv[i] + 9, &shapes)) {
        std::fprintf(stderr,
                     "gemm_bench: --shapes: expected MxNxK[,MxNxK...] with positive "
                     "integers, e.g. --shapes=2048x1152x384\n");
        return 2;
      }
    } else if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = ParseList(argv[i] + 10);
    } else if (std::strcmp(argv[i], "--conv=0") == 0 || std::strcmp(argv[i], "--conv=1") == 0) {
      conv = argv[i][7] == '1';
    } else {
      std::fprintf(stderr,
                   "usage: gemm_bench [--sizes=256,512] [--shapes=MxNxK,...] [--threads=1,2] "
                   "[--conv=0|1]\n"
                   "  e.g. gemm_bench --sizes=1024 --shapes= --threads=1 --conv=0\n");
      return 2;
    }
  }
  std::vector<Shape> cases;
  for (int n : sizes) cases.push_back(Shape{n, n, n});
  cases.insert(cases.end(), shapes.begin(), shapes.end());
  const KernelConfig base = GetKernelConfig();
  const std::string simd(meshlearn::engine::SimdPathName(base.simd));
  for (const Shape& shape : cases) {
    const int64_t M = shape.M, N = shape.N, K = shape.K;
    auto inp = Random(M * K, 1), w = Random(N * K, 2), bias = Random(N, 3);
    std::vector<float> out(M * N), blas_out(M * N);
    std::vector<float> first;
    for (int t : threads) {
      if (!SetKernelConfig(KernelConfig{base.simd, t}).ok()) return 1;
      openblas_set_num_threads(t);
      auto [ours, blas] = BestTimes(
          [&] {
            meshlearn::engine::LinearForward(out.data(), inp.data(), w.data(), bias.data(), M, K,
                                             N);
          },
          [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, inp.data(), K,
                        w.data(), K, 0.0f, blas_out.data(), N);
          });
      if (first.empty()) first = out;
      const bool same = std::memcmp(first.data(), out.data(), out.size() * 4) == 0;
      const double flops = 2.0 * M * N * K;
      std::printf(
          "{\"bench\":\"linear_forward\",\"M\":%lld,\"N\":%lld,\"K\":%lld,\"threads\":%d,"
          "\"simd\":\"%s\",\"meshlearn_gflops\":%.2f,\"openblas_gflops\":%.2f,\"ratio\":%.3f,"
          "\"meshlearn_gflops_per_cpu_s\":%.2f,\"openblas_gflops_per_cpu_s\":%.2f,\"cpu_ratio\":%."
          "3f,"
          "\"bitwise_same_across_threads\":%s,\"openblas_core\":\"%s\"}\n",
          static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), t,
          simd.c_str(), flops / ours.wall * 1e-9, flops / blas.wall * 1e-9, blas.wall / ours.wall,
          flops / ours.cpu * 1e-9, flops / blas.cpu * 1e-9, blas.cpu / ours.cpu,
          same ? "true" : "false", openblas_get_corename());
      std::fflush(stdout);
    }
  }
  // Conv2d: a CIFAR-like layer, implicit GEMM vs im2col + sgemm per image.
  struct ConvCase {
    int64_t B, C, H, W, OC, K, s, p;
  };
  std::vector<ConvCase> conv_cases = {ConvCase{32, 32, 32, 32, 64, 3, 1, 1},
                                      ConvCase{64, 1, 28, 28, 32, 5, 1, 2}};
  if (!conv) conv_cases.clear();
  for (ConvCase c : conv_cases) {
    const int64_t OH = (c.H + 2 * c.p - c.K) / c.s + 1, OW = (c.W + 2 * c.p - c.K) / c.s + 1;
    auto x = Random(c.B * c.C * c.H * c.W, 4), w = Random(c.OC * c.C * c.K * c.K, 5);
    auto bias = Random(c.OC, 6);
    std::vector<float> out(c.B * c.OC * OH * OW), out2(out.size()), col(c.C * c.K * c.K * OH * OW);
    for (int t : threads) {
      if (!SetKernelConfig(KernelConfig{base.simd, t}).ok()) return 1;
      openblas_set_num_threads(t);
      auto [ours, blas] = BestTimes(
          [&] {
            meshlearn::engine::Conv2dForward(out.data(), x.data(), w.data(), bias.data(), c.B, c.C,
                                             c.H, c.W, c.OC, c.K, c.K, c.s, c.p);
          },
          [&] {
            for (int64_t b = 0; b < c.B; ++b) {
              Im2col(col.data(), x.data() + b * c.C * c.H * c.W, c.C, c.H, c.W, c.K, c.s, c.p, OH,
                     OW);
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c.OC, OH * OW, c.C * c.K * c.K,
                          1.0f, w.data(), c.C * c.K * c.K, col.data(), OH * OW, 0.0f,
                          out2.data() + b * c.OC * OH * OW, OH * OW);
            }
          });
      const double flops = 2.0 * c.B * c.OC * OH * OW * c.C * c.K * c.K;
      std::printf(
          "{\"bench\":\"conv2d_forward\",\"B\":%lld,\"C\":%lld,\"H\":%lld,\"OC\":%lld,\"K\":%lld,"
          "\"threads\":%d,\"simd\":\"%s\",\"meshlearn_gflops\":%.2f,"
          "\"im2col_openblas_gflops\":%.2f,\"ratio\":%.3f,\"meshlearn_gflops_per_cpu_s\":%.2f,"
          "\"im2col_openblas_gflops_per_cpu_s\":%.2f,\"cpu_ratio\":%.3f}\n",
          static_cast<long long>(c.B), static_cast<long long>(c.C), static_cast<long long>(c.H),
          static_cast<long long>(c.OC), static_cast<long long>(c.K), t, simd.c_str(),
          flops / ours.wall * 1e-9, flops / blas.wall * 1e-9, blas.wall / ours.wall,
          flops / ours.cpu * 1e-9, flops / blas.cpu * 1e-9, blas.cpu / ours.cpu);
      std::fflush(stdout);
    }
  }
  return 0;
}

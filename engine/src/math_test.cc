// math.h: accuracy against double-precision libm over dense sweeps (max ulp error printed and
// bounded), special values, and bitwise equality of every SIMD path with the scalar functions.
#include "meshlearn/engine/math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/backend.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace {

// Error of f in units of the float spacing at the exact value d.
double UlpError(float f, double d) {
  if (std::isnan(d)) return std::isnan(f) ? 0.0 : 1e30;
  if (std::isinf(d)) return f == d ? 0.0 : 1e30;
  int e;
  std::frexp(d, &e);  // |d| in [2^(e-1), 2^e)
  int ulp_exp = e - 24;
  if (ulp_exp < -149) ulp_exp = -149;
  return std::fabs(static_cast<double>(f) - d) / std::ldexp(1.0, ulp_exp);
}

std::vector<float> Sweep(float lo, float hi, int n, uint64_t seed) {
  std::vector<float> x;
  for (int i = 0; i <= n; ++i) x.push_back(lo + (hi - lo) * static_cast<float>(i) / n);
  Rng rng(seed);
  for (int i = 0; i < n; ++i) x.push_back(lo + (hi - lo) * static_cast<float>(rng.UniformDouble()));
  return x;
}

double MaxUlp(float (*f)(float), double (*d)(double), const std::vector<float>& xs, float* worst) {
  double m = 0;
  for (float x : xs) {
    double e = UlpError(f(x), d(static_cast<double>(x)));
    if (e > m) {
      m = e;
      *worst = x;
    }
  }
  return m;
}

double DExp(double x) { return std::exp(x); }
double DLog(double x) { return std::log(x); }
double DTanh(double x) { return std::tanh(x); }
double DErf(double x) { return std::erf(x); }

TEST(MathTest, ExpAccuracy) {
  float worst = 0;
  double u = MaxUlp(Exp, DExp, Sweep(-87.0f, 88.7f, 1000000, 1), &worst);
  std::printf("Exp: max %.3f ulp on [-87, 88.7] (at %.9g)\n", u, worst);
  EXPECT_LE(u, 2.0);
  // Subnormal results are within one subnormal step.
  u = MaxUlp(Exp, DExp, Sweep(-103.9f, -87.0f, 100000, 2), &worst);
  std::printf("Exp: max %.3f ulp on [-103.9, -87] (subnormal results)\n", u);
  EXPECT_LE(u, 2.0);
}

TEST(MathTest, LogAccuracy) {
  std::vector<float> xs = Sweep(0.5f, 2.0f, 1000000, 3);
  Rng rng(4);
  for (int i = 0; i < 1000000; ++i) {  // all positive finite floats, subnormals included
    uint32_t bits = static_cast<uint32_t>(rng.Uniform(0x7f800000u - 1)) + 1;
    float f;
    std::memcpy(&f, &bits, 4);
    xs.push_back(f);
  }
  float worst = 0;
  double u = MaxUlp(Log, DLog, xs, &worst);
  std::printf("Log: max %.3f ulp over (0, inf) (at %.9g)\n", u, worst);
  EXPECT_LE(u, 2.0);
}

TEST(MathTest, TanhAccuracy) {
  float worst = 0;
  double u = MaxUlp(Tanh, DTanh, Sweep(-12.0f, 12.0f, 2000000, 5), &worst);
  std::printf("Tanh: max %.3f ulp on [-12, 12] (at %.9g)\n", u, worst);
  EXPECT_LE(u, 3.0);
  u = MaxUlp(Tanh, DTanh, Sweep(-1e-3f, 1e-3f, 100000, 6), &worst);
  std::printf("Tanh: max %.3f ulp on [-1e-3, 1e-3]\n", u);
  EXPECT_LE(u, 3.0);
}

TEST(MathTest, ErfAccuracy) {
  float worst = 0;
  double u = MaxUlp(Erf, DErf, Sweep(-6.0f, 6.0f, 2000000, 7), &worst);
  std::printf("Erf: max %.3f ulp on [-6, 6] (at %.9g)\n", u, worst);
  EXPECT_LE(u, 4.0);
  u = MaxUlp(Erf, DErf, Sweep(-1e-3f, 1e-3f, 100000, 8), &worst);
  std::printf("Erf: max %.3f ulp on [-1e-3, 1e-3]\n", u);
  EXPECT_LE(u, 4.0);
}

TEST(MathTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(inf), inf);
  EXPECT_EQ(Exp(-inf), 0.0f);
  EXPECT_EQ(Exp(100.0f), inf);
  EXPECT_EQ(Exp(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(Exp(std::nanf(""))));
  EXPECT_EQ(Log(1.0f), 0.0f);
  EXPECT_EQ(Log(0.0f), -inf);
  EXPECT_EQ(Log(inf), inf);
  EXPECT_TRUE(std::isnan(Log(-1.0f)));
  EXPECT_TRUE(std::isnan(Log(std::nanf(""))));
  EXPECT_EQ(Tanh(inf), 1.0f);
  EXPECT_EQ(Tanh(-inf), -1.0f);
  EXPECT_EQ(Tanh(0.0f), 0.0f);
  EXPECT_EQ(Erf(inf), 1.0f);
  EXPECT_EQ(Erf(-inf), -1.0f);
  EXPECT_EQ(Erf(0.0f), 0.0f);
}

TEST(MathTest, SimdPathsMatchScalarBitwise) {
  testing::ConfigGuard guard;
  std::vector<float> xs = Sweep(-120.0f, 120.0f, 200001, 9);
  for (float v : Sweep(-3.0f, 3.0f, 20001, 10)) xs.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, inf, -inf, std::nanf(""), 1e-40f, -1e-40f, 1e-45f, 3.4e38f, -3.4e38f,
                  0.625f, -0.625f, 1.0f, -1.0f, 4.0f, 88.7228394f, -103.97f})
    xs.push_back(v);
  Rng rng(11);
  for (int i = 0; i < 100000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng.NextU32());
    float f;
    std::memcpy(&f, &bits, 4);
    xs.push_back(f);
  }
  struct Fn {
    const char* name;
    float (*scalar)(float);
    void (*array)(float*, const float*, int64_t);
  };
  for (const Fn& fn : {Fn{"Exp", Exp, ExpArray}, Fn{"Log", Log, LogArray},
                       Fn{"Tanh", Tanh, TanhArray}, Fn{"Erf", Erf, ErfArray}}) {
    std::vector<float> want(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) want[i] = fn.scalar(xs[i]);
    for (SimdPath p : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
      if (!SimdPathSupported(p)) continue;
      ASSERT_TRUE(SetKernelConfig(KernelConfig{p, 1}).ok());
      std::vector<float> got(xs.size());
      fn.array(got.data(), xs.data(), static_cast<int64_t>(xs.size()));
      std::string why;
      EXPECT_TRUE(testing::BitEqual(want, got, &why))
          << fn.name << " on " << SimdPathName(p) << ": " << why;
    }
  }
}

}  // namespace
}  // namespace meshlearn::engine

#include "meshlearn/engine/init.h"

#include <bit>
#include <cmath>

#include "meshlearn/base/rng.h"

namespace meshlearn::engine {
namespace {

constexpr double kLn2 = 0.693147180559945309417232121458176568;
constexpr double kPi = 3.14159265358979323846264338327950288;
constexpr double kTwoPi = 6.28318530717958647692528676655900577;

// Taylor series in a fixed order (highest degree first, Horner). |t| <= pi/4 keeps the error far
// below one double ulp with these degrees.
double SinPoly(double t) {
  double t2 = t * t;
  double p = -1.0 / 1307674368000.0;  // -1/15!
  p = p * t2 + 1.0 / 6227020800.0;    // 1/13!
  p = p * t2 - 1.0 / 39916800.0;      // 1/11!
  p = p * t2 + 1.0 / 362880.0;
  p = p * t2 - 1.0 / 5040.0;
  p = p * t2 + 1.0 / 120.0;
  p = p * t2 - 1.0 / 6.0;
  return t + t * t2 * p;
}
double CosPoly(double t) {
  double t2 = t * t;
  double p = -1.0 / 20922789888000.0;  // -1/16!
  p = p * t2 + 1.0 / 87178291200.0;    // 1/14!
  p = p * t2 - 1.0 / 479001600.0;      // 1/12!
  p = p * t2 + 1.0 / 3628800.0;
  p = p * t2 - 1.0 / 40320.0;
  p = p * t2 + 1.0 / 720.0;
  p = p * t2 - 1.0 / 24.0;
  p = p * t2 + 0.5;
  return 1.0 - t2 * p;
}

}  // namespace

double DetLog(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172.
  uint64_t bits = std::bit_cast<uint64_t>(x);
  int e = static_cast<int>((bits >> 52) & 0x7ff);
  if (e == 0) {  // subnormal: scale up exactly
    x *= 0x1p54;
    bits = std::bit_cast<uint64_t>(x);
    e = static_cast<int>((bits >> 52) & 0x7ff) - 54;
  }
  e -= 1023;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
  if (m > 1.4142135623730951) {
    m *= 0.5;
    e += 1;
  }
  double s = (m - 1.0) / (m + 1.0);
  double s2 = s * s;
  // 2 * (s + s^3/3 + ... + s^23/23): s^25 < 1e-19.
  double p = 1.0 / 23.0;
  for (int k = 21; k >= 1; k -= 2) p = p * s2 + 1.0 / k;
  return 2.0 * s * p + e * kLn2;
}

double DetCos2Pi(double u) {
  // Quadrant reduction on u (exact: multiplications by 4 and subtractions of integers).
  double q = u * 4.0;                  // [0, 4)
  int quadrant = static_cast<int>(q);  // 0..3
  double f = q - quadrant;             // [0, 1): angle f * pi/2 inside the quadrant
  bool upper = f > 0.5;
  double t = (upper ? (1.0 - f) : f) * (kPi / 2);  // |t| <= pi/4
  // cos/sin of the in-quadrant angle a = f*pi/2.
  double c = upper ? SinPoly(t) : CosPoly(t);  // cos(a)
  double s = upper ? CosPoly(t) : SinPoly(t);  // sin(a)
  switch (quadrant & 3) {
    case 0:
      return c;
    case 1:
      return -s;
    case 2:
      return -c;
    default:
      return s;
  }
}

double DetCos(double x) {
  double u = x / kTwoPi;
  double fl = static_cast<double>(static_cast<int64_t>(u));
  if (fl > u) fl -= 1.0;
  u -= fl;
  if (u >= 1.0) u = 0.0;
  if (u < 0.0) u = 0.0;
  return DetCos2Pi(u);
}

float NormalSample(uint64_t seed, uint64_t stream, uint64_t index) {
  std::array<uint32_t, 4> r =
      Philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                  static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  // u1 in (0, 1] from 53 bits (never 0, so the log is finite); u2 in [0, 1).
  uint64_t a = (static_cast<uint64_t>(r[0]) << 32 | r[1]) >> 11;
  uint64_t b = (static_cast<uint64_t>(r[2]) << 32 | r[3]) >> 11;
  double u1 = (static_cast<double>(a) + 1.0) * 0x1.0p-53;
  double u2 = static_cast<double>(b) * 0x1.0p-53;
  double radius = std::sqrt(-2.0 * DetLog(u1));  // sqrt is correctly rounded by IEEE 754
  return static_cast<float>(radius * DetCos2Pi(u2));
}

void FillNormal(float* x, int64_t n, float std, uint64_t seed, uint64_t stream) {
  for (int64_t i = 0; i < n; ++i) x[i] = std * NormalSample(seed, stream, static_cast<uint64_t>(i));
}

void FillUniform(float* x, int64_t n, float bound, uint64_t seed, uint64_t stream) {
  for (int64_t i = 0; i < n; ++i) {
    uint64_t idx = static_cast<uint64_t>(i);
    std::array<uint32_t, 4> r =
        Philox4x32({static_cast<uint32_t>(idx), static_cast<uint32_t>(idx >> 32),
                    static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                   {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    x[i] = bound * (2.0f * U32ToUnitFloat(r[0]) - 1.0f);
  }
}

}  // namespace meshlearn::engine

#include "meshlearn/engine/init.h"

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "meshlearn/base/hash.h"

namespace meshlearn::engine {
namespace {

TEST(InitTest, DetLogMatchesLibmClosely) {
  // libm is only the yardstick here; the engine never calls it.
  for (double x : {1e-300, 1e-30, 1e-5, 0.1, 0.5, 0.7071, 1.0, 1.5, 2.0, 3.14159, 1e10, 1e300}) {
    EXPECT_NEAR(DetLog(x), std::log(x), 1e-14 * std::max(1.0, std::fabs(std::log(x)))) << x;
  }
  EXPECT_EQ(DetLog(1.0), 0.0);
  EXPECT_NEAR(DetLog(4.9e-324), std::log(4.9e-324), 1e-12);  // subnormal
}

TEST(InitTest, DetCosMatchesLibmClosely) {
  for (int i = 0; i < 1000; ++i) {
    double u = i / 1000.0;
    EXPECT_NEAR(DetCos2Pi(u), std::cos(2 * M_PI * u), 1e-15) << u;
  }
  for (double x : {-10.0, -1.0, 0.0, 0.5, 3.0, 100.0}) {
    EXPECT_NEAR(DetCos(x), std::cos(x), 1e-13) << x;
  }
}

TEST(InitTest, NormalSamplesHaveUnitMomentsAndFixedBits) {
  const int n = 100000;
  std::vector<float> x(n);
  FillNormal(x.data(), n, 1.0f, /*seed=*/42, /*stream=*/7);
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= n;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
  // Same seed, same bits; other stream, other values.
  std::vector<float> y(n), z(n);
  FillNormal(y.data(), n, 1.0f, 42, 7);
  FillNormal(z.data(), n, 1.0f, 42, 8);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), n * 4));
  EXPECT_NE(x[0], z[0]);
}

// Golden bits: if this changes, every initial model changes and old tasks no longer replay.
TEST(InitTest, NormalSamplesGoldenHash) {
  std::vector<float> x(4096);
  FillNormal(x.data(), x.size(), 0.02f, 1, 0);
  Hash256 h = Blake2b(ByteSpan(reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4));
  EXPECT_EQ(h.ToHex(), "2e9fe0875704184e6bc281394d5bfaedbbf1e2118ef4f984fbd4da328acf680a");
}

}  // namespace
}  // namespace meshlearn::engine

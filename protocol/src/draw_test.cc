#include "meshlearn/protocol/draw.h"

#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace meshlearn::protocol {
namespace {

TEST(FirstU64, ReadsTheFirstEightBytesLittleEndian) {
  Hash256 h;
  for (size_t i = 0; i < h.bytes.size(); ++i) h.bytes[i] = static_cast<uint8_t>(i + 1);
  EXPECT_EQ(FirstU64(h), 0x0807060504030201ull);
}

// A whistleblower's draws depend on its own secret and the unit, and repeat after a restart.
TEST(WhistleDraws, AreInRangeRepeatableAndKeyedByTheNodesSecret) {
  const std::vector<uint8_t> a(32, 1), b(32, 2);
  const Hash256 task = Hasher("draw_test.task").Finish();
  std::set<uint32_t> segments;
  int below_half = 0;
  for (uint64_t index = 0; index < 200; ++index) {
    const double d = WhistleSampleDraw(a, task, index, 17);
    EXPECT_GE(d, 0.0);
    EXPECT_LT(d, 1.0);
    EXPECT_EQ(d, WhistleSampleDraw(a, task, index, 17));
    below_half += d < 0.5;
    const uint32_t s = WhistleSegment(a, task, index, 17, 5);
    EXPECT_LT(s, 5u);
    EXPECT_EQ(s, WhistleSegment(a, task, index, 17, 5));
    segments.insert(s);
  }
  EXPECT_EQ(segments.size(), 5u);
  EXPECT_GT(below_half, 60);
  EXPECT_LT(below_half, 140);
  EXPECT_NE(WhistleSampleDraw(a, task, 3, 17), WhistleSampleDraw(b, task, 3, 17));
  EXPECT_NE(WhistleSampleDraw(a, task, 3, 17), WhistleSampleDraw(a, task, 3, 18));
}

}  // namespace
}  // namespace meshlearn::protocol

// The disk a node offers to its pipeline stage files (bench.h OfferedDiskBytes), which the
// scheduler places stages by: a limit above the data dir's free space is refused at start.
#include "meshlearn/node/bench.h"

#include <gtest/gtest.h>

#include "meshlearn/base/test_dir.h"

namespace meshlearn::node {
namespace {

TEST(OfferedDiskTest, ALimitAboveTheFreeSpaceIsRefusedNamingItAndTheFix) {
  Result<uint64_t> r = OfferedDiskBytes(1001, 1000, "/srv/node", "--disk-limit");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--disk-limit = 1001 bytes is more disk than the data dir "
                                      "/srv/node has free (1000 bytes)"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("Lower --disk-limit to at most 1000"), std::string::npos)
      << r.status().ToString();
  // Up to the free space, the limit is what the node offers.
  EXPECT_EQ(OfferedDiskBytes(1000, 1000, "/srv/node", "--disk-limit").value(), 1000u);
  EXPECT_EQ(OfferedDiskBytes(1, 1000, "/srv/node", "--disk-limit").value(), 1u);
}

TEST(OfferedDiskTest, WithoutALimitANodeOffersNineTenthsOfTheFreeSpaceAndNeverNone) {
  EXPECT_EQ(OfferedDiskBytes(0, 1000, "/srv/node", "disk_limit_bytes").value(), 900u);
  EXPECT_EQ(OfferedDiskBytes(0, 9, "/srv/node", "disk_limit_bytes").value(), 9u);
  // 0 would declare no disk (not checked by the scheduler): a full disk offers 1 byte.
  EXPECT_EQ(OfferedDiskBytes(0, 0, "/srv/node", "disk_limit_bytes").value(), 1u);
}

TEST(OfferedDiskTest, TheFreeSpaceIsMeasuredOnTheDataDirsFileSystem) {
  const std::string dir = TestDir("offered-disk");
  Result<uint64_t> free_bytes = FreeDiskBytes(dir);
  ASSERT_TRUE(free_bytes.ok()) << free_bytes.status().ToString();
  EXPECT_GT(*free_bytes, 0u);
  EXPECT_FALSE(OfferedDiskBytes(*free_bytes + (1ull << 40), *free_bytes, dir, "x").ok());
  Result<uint64_t> missing = FreeDiskBytes(dir + "/no/such/folder");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir + "/no/such/folder"), std::string::npos)
      << missing.status().ToString();
}

}  // namespace
}  // namespace meshlearn::node

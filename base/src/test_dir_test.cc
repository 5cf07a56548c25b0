// base/test_dir.h: a test's directories go when its process passed and stay when it failed.
// The parent test runs this binary again as the child (MESHLEARN_TEST_DIR_CHILD), once passing
// and once failing, and looks at the directory the child reports.
#include "meshlearn/base/test_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace meshlearn {
namespace {

// The child: makes a directory with a file in it, writes its path where the parent said, and
// passes or fails as told.
TEST(TestDirChild, MakesADirectory) {
  const char* report = std::getenv("MESHLEARN_TEST_DIR_CHILD");
  if (report == nullptr) GTEST_SKIP() << "run by TestDirTest.* as a child process";
  const std::string dir = TestDir("testdir");
  std::ofstream(dir + "/file") << "x";
  std::ofstream(report) << dir;
  if (std::getenv("MESHLEARN_TEST_DIR_FAIL") != nullptr) ADD_FAILURE() << "failing on purpose";
}

// Runs the child and returns the directory it made.
std::string RunChild(bool fail, int* exit_code) {
  const std::string report = TestDir("testdir-report") + "/path";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "MESHLEARN_TEST_DIR_CHILD=" + report +
                          (fail ? " MESHLEARN_TEST_DIR_FAIL=1" : "") + " " + self +
                          " --gtest_filter=TestDirChild.MakesADirectory > /dev/null 2>&1";
  *exit_code = std::system(cmd.c_str());
  std::ifstream in(report);
  std::string dir;
  std::getline(in, dir);
  return dir;
}

TEST(TestDirTest, APassingTestLeavesNothing) {
  int code = -1;
  const std::string dir = RunChild(/*fail=*/false, &code);
  EXPECT_EQ(code, 0);
  ASSERT_EQ(dir.rfind("/tmp/meshlearn-testdir-", 0), 0u) << dir;
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

TEST(TestDirTest, AFailingTestKeepsItsDirectoryForALook) {
  int code = -1;
  const std::string dir = RunChild(/*fail=*/true, &code);
  EXPECT_NE(code, 0);
  ASSERT_EQ(dir.rfind("/tmp/meshlearn-testdir-", 0), 0u) << dir;
  EXPECT_TRUE(std::filesystem::exists(dir + "/file")) << dir;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshlearn

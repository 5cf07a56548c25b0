#include "meshlearn/base/env.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace meshlearn {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/meshlearn-env-XXXXXX";
  return mkdtemp(tmpl);
}

TEST(PosixEnv, AtomicWriteReplacesAndLeavesNoTemporaries) {
  Env* env = Env::Default();
  std::string dir = TempDir();
  std::string path = JoinPath(dir, "f.txt");
  ASSERT_TRUE(env->WriteFileAtomic(path, "one").ok());
  ASSERT_TRUE(env->WriteFileAtomic(path, "two", 0600).ok());
  EXPECT_EQ(*env->ReadFile(path), "two");
  EXPECT_EQ(*env->FileMode(path), 0600u);
  EXPECT_EQ(*env->ListDir(dir), std::vector<std::string>{"f.txt"});
  EXPECT_EQ(*env->FileSize(path), 3u);
}

TEST(PosixEnv, ErrorsNameThePath) {
  Result<std::string> r = Env::Default()->ReadFile("/nonexistent/meshlearn/x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/meshlearn/x"), std::string::npos);
}

TEST(PosixEnv, CreateDirsNested) {
  std::string dir = JoinPath(TempDir(), "a/b/c");
  ASSERT_TRUE(Env::Default()->CreateDirs(dir).ok());
  ASSERT_TRUE(Env::Default()->CreateDirs(dir).ok());  // idempotent
  EXPECT_TRUE(Env::Default()->FileExists(dir));
}

TEST(MemEnv, InjectedWriteFailureKeepsOldContent) {
  MemEnv env;
  ASSERT_TRUE(env.CreateDirs("/d").ok());
  ASSERT_TRUE(env.WriteFileAtomic("/d/f", "old").ok());
  env.FailWritesAfter(0);
  EXPECT_FALSE(env.WriteFileAtomic("/d/f", "new").ok());
  EXPECT_EQ(*env.ReadFile("/d/f"), "old");
  EXPECT_FALSE(env.WriteFileAtomic("/missing/f", "x").ok());
}

TEST(MemEnv, ListDirShowsDirectChildrenOnly) {
  MemEnv env;
  ASSERT_TRUE(env.CreateDirs("/d/sub").ok());
  ASSERT_TRUE(env.WriteFileAtomic("/d/a", "1").ok());
  ASSERT_TRUE(env.WriteFileAtomic("/d/sub/b", "2").ok());
  EXPECT_EQ(*env.ListDir("/d"), (std::vector<std::string>{"a", "sub"}));
}

}  // namespace
}  // namespace meshlearn

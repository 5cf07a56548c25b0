#include "meshlearn/base/env.h"
#include "meshlearn/base/test_dir.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace meshlearn {
namespace {

std::string TempDir() { return TestDir("env"); }

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


// docs/paths.md: a path inside a file is relative to that file's folder; a writer writes, with
// PathForFile, exactly what ResolveInFile gives back, whether the file was named relative to the
// working directory or absolutely.
// The same RandomRWFile contract on both file systems: reads past the end are short, a write past
// the end grows the file with zeros, truncate shrinks it, a missing file is created only when asked.
void ExpectRandomRWContract(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, "db");
  EXPECT_EQ(env->OpenRandomRW(path, /*create=*/false).status().code(), StatusCode::kNotFound);
  Result<std::unique_ptr<RandomRWFile>> f = env->OpenRandomRW(path, /*create=*/true);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE((*f)->Write(0, "hello").ok());
  ASSERT_TRUE((*f)->Write(8, "xy").ok());
  EXPECT_EQ(*(*f)->Size(), 10u);
  char buf[16] = {};
  EXPECT_EQ(*(*f)->Read(3, 16, buf), 7u);
  EXPECT_EQ(std::string(buf, 7), std::string("lo\0\0\0xy", 7));
  EXPECT_EQ(*(*f)->Read(10, 4, buf), 0u);
  ASSERT_TRUE((*f)->Truncate(4).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  EXPECT_EQ(*env->ReadFile(path), "hell");
  EXPECT_EQ(env->OpenRandomRW(dir, true).status().code(), StatusCode::kInvalidArgument);
}

TEST(PosixEnv, RandomRWFile) { ExpectRandomRWContract(Env::Default(), TempDir()); }

TEST(MemEnv, RandomRWFile) {
  MemEnv env;
  ASSERT_TRUE(env.CreateDirs("/d").ok());
  ExpectRandomRWContract(&env, "/d");
}

// A power cut keeps what was synced: the synced prefix of a file, nothing of a file never synced,
// every atomic write; until the power is back nothing changes.
TEST(MemEnv, CutPowerKeepsWhatWasSynced) {
  MemEnv env;
  ASSERT_TRUE(env.CreateDirs("/d").ok());
  ASSERT_TRUE(env.WriteFileAtomic("/d/atomic", "kept").ok());
  auto a = std::move(*env.OpenRandomRW("/d/a", true));
  auto b = std::move(*env.OpenRandomRW("/d/b", true));
  ASSERT_TRUE(a->Write(0, "synced").ok());
  ASSERT_TRUE(a->Sync().ok());
  ASSERT_TRUE(a->Write(6, " and lost").ok());
  ASSERT_TRUE(b->Write(0, "never synced").ok());
  env.CutPower();
  EXPECT_EQ(*env.ReadFile("/d/a"), "synced");
  EXPECT_FALSE(env.FileExists("/d/b"));
  EXPECT_EQ(*env.ReadFile("/d/atomic"), "kept");
  EXPECT_FALSE(a->Write(0, "x").ok());
  EXPECT_FALSE(env.DeleteFile("/d/atomic").ok());
  EXPECT_FALSE(env.WriteFileAtomic("/d/atomic", "x").ok());
  EXPECT_FALSE(env.OpenRandomRW("/d/new", true).ok());
  env.RestorePower();
  // FailWritesAfter counts in-place writes and syncs too.
  env.FailWritesAfter(1);
  EXPECT_TRUE(a->Write(0, "S").ok());
  EXPECT_FALSE(a->Sync().ok());
  EXPECT_EQ(env.writes_left(), 0);
  env.CutPower();
  EXPECT_EQ(*env.ReadFile("/d/a"), "synced");
}

TEST(Paths, WhatAWriterWritesIsWhatAReaderReads) {
  EXPECT_EQ(DirName("a/b/c.toml"), "a/b");
  EXPECT_EQ(DirName("c.toml"), ".");
  EXPECT_EQ(DirName("/c.toml"), "/");
  EXPECT_EQ(ResolveInFile("out/devnet/node0/node.toml", "."), "out/devnet/node0/.");
  EXPECT_EQ(ResolveInFile("out/devnet/node0/node.toml", "data"), "out/devnet/node0/data");
  EXPECT_EQ(ResolveInFile("node.toml", "data"), "data");
  EXPECT_EQ(ResolveInFile("/etc/node.toml", "/var/node"), "/var/node");
  EXPECT_EQ(ResolveInFile("/etc/node.toml", "../x.gz"), "/etc/../x.gz");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(ResolveInFile("/etc/node.toml", "~/node"), "/home/u/node");

  // The bug this rule fixed: devnet wrote "out/devnet/node0" (relative to the working directory)
  // into out/devnet/node0/node.toml, and the node read out/devnet/node0/out/devnet/node0.
  EXPECT_EQ(PathForFile("out/devnet/node0/node.toml", "out/devnet/node0"), ".");
  EXPECT_EQ(PathForFile("out/devnet/node0/node.toml", "out/devnet/chain"), "../chain");
  EXPECT_EQ(PathForFile("out/n/node.toml", "/abs/dir"), "/abs/dir");
  EXPECT_EQ(PathForFile("/tmp/n/node.toml", "~/x"), "~/x");
  for (const std::string file : {"out/devnet/node0/node.toml", "node.toml", "a/../b/f.toml"}) {
    for (const std::string target : {"out/devnet/node0", "data/x", ".", "a/b/../c"}) {
      EXPECT_EQ(AbsolutePath(ResolveInFile(file, PathForFile(file, target))),
                AbsolutePath(target))
          << file << " naming " << target;
      const std::string abs_file = AbsolutePath(file);
      EXPECT_EQ(AbsolutePath(ResolveInFile(abs_file, PathForFile(abs_file, target))),
                AbsolutePath(target))
          << abs_file << " naming " << target;
    }
  }
}

TEST(Paths, AbsolutePathIsUnderTheWorkingDirectory) {
  const std::string dir = TempDir();
  char old[4096];
  ASSERT_NE(getcwd(old, sizeof(old)), nullptr);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  EXPECT_EQ(AbsolutePath("out/devnet"), dir + "/out/devnet");
  EXPECT_EQ(AbsolutePath("./out/../out/devnet/"), dir + "/out/devnet");
  EXPECT_EQ(AbsolutePath("."), dir);
  EXPECT_EQ(AbsolutePath("/x/./y/../z"), "/x/z");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(AbsolutePath("~/.meshlearn"), "/home/u/.meshlearn");
  ASSERT_EQ(chdir(old), 0);
}

}  // namespace
}  // namespace meshlearn

#include "meshlearn/net/blob_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>

#include "meshlearn/base/rng.h"

namespace meshlearn::net {
namespace {

constexpr uint32_t kChunk = 4096;

Bytes RandomBytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng.NextU32());
  return b;
}

std::unique_ptr<BlobStore> OpenOrDie(Env* env, const std::string& dir, uint64_t quota = 0) {
  auto s = BlobStore::Open(env, dir, {.quota_bytes = quota});
  CHECK(s.ok()) << s.status().ToString();
  return std::move(*s);
}

// A real directory under /tmp, removed at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/meshlearn_net_test_XXXXXX";
    CHECK(mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(BlobStoreTest, PutGetRoundTrip) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/data/blobs");
  Bytes data = RandomBytes(3 * kChunk + 5, 1);
  Result<BlobId> id = store->Put(data, kChunk);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_TRUE(store->HasBlob(*id));
  Result<Bytes> back = store->Get(*id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, data);
  EXPECT_EQ(store->stats().chunk_files, 4u);
  EXPECT_TRUE(env.FileExists("/data/blobs/manifests/" + id->ToHex()));
  EXPECT_EQ(store->MissingChunks(*id)->size(), 0u);

  BlobId unknown{Blake2b("nothing")};
  EXPECT_EQ(store->Get(unknown).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(store->HasBlob(unknown));
}

TEST(BlobStoreTest, IdenticalChunksStoredOnce) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b");
  Bytes zeros(4 * kChunk, 0);
  BlobId id = *store->Put(zeros, kChunk);
  EXPECT_EQ(store->stats().chunk_files, 1u);
  EXPECT_EQ(*store->Get(id), zeros);
  // Removing it drops the shared chunk exactly once.
  ASSERT_TRUE(store->Remove(id).ok());
  EXPECT_EQ(store->stats().chunk_files, 0u);
  EXPECT_EQ(store->stats().used_bytes, 0u);
}

TEST(BlobStoreTest, PutChunkRefusesWrongHashAndChangesNothing) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b");
  Bytes data = RandomBytes(100, 2);
  Hash256 wrong = Blake2b("other");
  Status s = store->PutChunk(wrong, data);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(store->HasChunk(wrong));
  EXPECT_EQ(store->stats().used_bytes, 0u);
  EXPECT_TRUE(env.ListDir("/b/chunks")->empty());
}

TEST(BlobStoreTest, ReopenFindsEverything) {
  MemEnv env;
  BlobId a, b;
  uint64_t used = 0;
  {
    auto store = OpenOrDie(&env, "/b");
    a = *store->Put(RandomBytes(2 * kChunk, 3), kChunk);
    b = *store->Put(RandomBytes(kChunk + 1, 4), kChunk);
    ASSERT_TRUE(store->Pin(a).ok());
    used = store->stats().used_bytes;
  }
  auto store = OpenOrDie(&env, "/b");
  EXPECT_TRUE(store->HasBlob(a));
  EXPECT_TRUE(store->HasBlob(b));
  EXPECT_TRUE(store->IsPinned(a));
  EXPECT_FALSE(store->IsPinned(b));
  EXPECT_EQ(store->stats().used_bytes, used);
  EXPECT_EQ(store->ListBlobs().size(), 2u);
}

TEST(BlobStoreTest, QuotaEvictsLeastRecentlyUsedUnpinned) {
  MemEnv env;
  // Room for about three blobs of two chunks each (plus manifests).
  auto store = OpenOrDie(&env, "/b", /*quota=*/3 * (2 * kChunk + 200));
  BlobId a = *store->Put(RandomBytes(2 * kChunk, 10), kChunk);
  BlobId b = *store->Put(RandomBytes(2 * kChunk, 11), kChunk);
  BlobId c = *store->Put(RandomBytes(2 * kChunk, 12), kChunk);
  ASSERT_TRUE(store->Pin(a).ok());
  ASSERT_TRUE(store->Get(b).ok());  // b is now more recent than c
  BlobId d = *store->Put(RandomBytes(2 * kChunk, 13), kChunk);
  EXPECT_TRUE(store->HasBlob(a));       // pinned
  EXPECT_TRUE(store->HasBlob(b));       // recently used
  EXPECT_FALSE(store->HasManifest(c));  // least recently used: evicted
  EXPECT_TRUE(store->HasBlob(d));
  EXPECT_EQ(store->stats().evicted_blobs, 1u);
  EXPECT_LE(store->stats().used_bytes, 3 * (2 * kChunk + 200));
}

TEST(BlobStoreTest, QuotaFullOfPinnedRefusesAndChangesNothing) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b", /*quota=*/2 * (2 * kChunk + 200));
  BlobId a = *store->Put(RandomBytes(2 * kChunk, 20), kChunk);
  BlobId b = *store->Put(RandomBytes(2 * kChunk, 21), kChunk);
  ASSERT_TRUE(store->Pin(a).ok());
  ASSERT_TRUE(store->Pin(b).ok());
  BlobStoreStats before = store->stats();
  Result<BlobId> c = store->Put(RandomBytes(2 * kChunk, 22), kChunk);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  BlobStoreStats after = store->stats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.chunk_files, before.chunk_files);
  EXPECT_EQ(after.manifests, before.manifests);
  // Unpinning makes room again.
  ASSERT_TRUE(store->Unpin(a).ok());
  EXPECT_TRUE(store->Put(RandomBytes(2 * kChunk, 22), kChunk).ok());
  EXPECT_FALSE(store->HasManifest(a));
  EXPECT_EQ(store->Unpin(a).code(), StatusCode::kFailedPrecondition);
}

TEST(BlobStoreTest, HeldBlobIsNotEvictedAndRemoveRefusesPinned) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b", /*quota=*/2 * kChunk + 200);
  BlobId a = *store->Put(RandomBytes(2 * kChunk, 30), kChunk);
  store->Hold(a);
  EXPECT_EQ(store->Put(RandomBytes(kChunk, 31), kChunk).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Remove(a).code(), StatusCode::kFailedPrecondition);
  store->Release(a);
  EXPECT_TRUE(store->Remove(a).ok());
}

TEST(BlobStoreTest, GarbageCollectionDropsOrphanChunks) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b");
  BlobId a = *store->Put(RandomBytes(2 * kChunk, 40), kChunk);
  Bytes orphan = RandomBytes(kChunk, 41);
  ASSERT_TRUE(store->PutChunk(Blake2b(orphan), orphan).ok());
  EXPECT_EQ(store->stats().chunk_files, 3u);
  ASSERT_TRUE(store->CollectGarbage().ok());
  EXPECT_EQ(store->stats().chunk_files, 2u);
  EXPECT_FALSE(store->HasChunk(Blake2b(orphan)));
  EXPECT_TRUE(store->HasBlob(a));
}

TEST(BlobStoreTest, FailedWritesLeaveNoPartialChunk) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b");
  env.FailWritesAfter(2);  // the manifest and one chunk get written, then the "disk" fails
  Bytes data = RandomBytes(3 * kChunk, 50);
  Result<BlobId> id = store->Put(data, kChunk);
  ASSERT_FALSE(id.ok());
  env.FailWritesAfter(-1);
  // Every chunk file that exists is complete and matches its name.
  std::vector<std::string> names = *env.ListDir("/b/chunks");
  for (const std::string& name : names) {
    std::string content = *env.ReadFile("/b/chunks/" + name);
    EXPECT_EQ(Blake2b(content).ToHex(), name);
  }
  // A second attempt completes the blob.
  BlobId again = *store->Put(data, kChunk);
  EXPECT_EQ(*store->Get(again), data);
}

TEST(BlobStoreTest, CrashLeftoversOnDiskAreNeverVisible) {
  TempDir tmp;
  Bytes data = RandomBytes(3 * kChunk, 60);
  BlobId id;
  Manifest m = BuildManifest(data, kChunk);
  {
    auto store = OpenOrDie(Env::Default(), tmp.path());
    id = *store->Put(data, kChunk);
  }
  Env* env = Env::Default();
  std::string chunk_dir = tmp.path() + "/chunks";
  // A crash in WriteFileAtomic before its rename leaves a partial temporary...
  std::string partial = chunk_dir + "/" + Blake2b("x").ToHex() + ".tmp.123.0";
  ASSERT_TRUE(env->WriteFileAtomic(partial, "half a chu").ok());
  // ...and a disk fault may corrupt a complete chunk file.
  std::string chunk1 = chunk_dir + "/" + m.chunks[1].ToHex();
  ASSERT_TRUE(env->WriteFileAtomic(chunk1, "garbage").ok());

  auto store = OpenOrDie(env, tmp.path());
  EXPECT_FALSE(env->FileExists(partial));
  EXPECT_EQ(store->stats().chunk_files, 3u);
  Result<Bytes> got = store->Get(id);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(store->HasBlob(id));
  EXPECT_EQ(*store->MissingChunks(id), std::vector<size_t>{1});
  // Putting the blob again repairs it.
  ASSERT_TRUE(store->Put(data, kChunk).ok());
  EXPECT_EQ(*store->Get(id), data);
}

TEST(BlobStoreTest, ConcurrentPutsAndGets) {
  TempDir tmp;
  auto store = OpenOrDie(Env::Default(), tmp.path());
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        // Blobs share their first chunk across threads.
        Bytes data = RandomBytes(3 * kChunk, 1000 + t * 10 + i);
        std::fill(data.begin(), data.begin() + kChunk, 0);
        Result<BlobId> id = store->Put(data, kChunk);
        if (id.ok() && store->Get(*id).ok() && *store->Get(*id) == data) ++ok[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 5);
  EXPECT_EQ(store->stats().chunk_files, 1u + 4 * 5 * 2);
}

TEST(BlobStoreTest, ParallelChunkWritesKeepAccountsExact) {
  TempDir tmp;
  auto store = OpenOrDie(Env::Default(), tmp.path());
  std::vector<Bytes> chunks;
  for (int i = 0; i < 8; ++i) chunks.push_back(RandomBytes(kChunk + i, 3000 + i));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Every thread writes every chunk, in a different order: the same chunk is often written
      // by two threads at once.
      for (int i = 0; i < 8; ++i) {
        const Bytes& c = chunks[(i + t) % 8];
        CHECK(store->PutChunk(Blake2b(c), c).ok());
        CHECK(*store->GetChunk(Blake2b(c)) == c);
      }
    });
  }
  for (auto& th : threads) th.join();
  uint64_t expect = 0;
  for (const Bytes& c : chunks) expect += c.size();
  EXPECT_EQ(store->stats().chunk_files, 8u);
  EXPECT_EQ(store->stats().used_bytes, expect);
  store.reset();
  auto reopened = OpenOrDie(Env::Default(), tmp.path());
  EXPECT_EQ(reopened->stats().used_bytes, expect);  // no temporaries were left behind
  EXPECT_EQ(reopened->stats().chunk_files, 8u);
}

}  // namespace
}  // namespace meshlearn::net

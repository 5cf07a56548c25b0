#include "meshlearn/net/blob_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>

#include "meshlearn/base/rng.h"
#include "meshlearn/base/test_dir.h"
#include "test_util.h"

namespace meshlearn::net {
namespace {

using test_util::kTestChunk;
using test_util::RandomBytes;

std::unique_ptr<BlobStore> OpenOrDie(Env* env, const std::string& dir, uint64_t quota = 0) {
  auto s = BlobStore::Open(env, dir, {.quota_bytes = quota});
  CHECK(s.ok()) << s.status().ToString();
  return std::move(*s);
}

TEST(BlobStoreTest, PutGetRoundTrip) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/data/blobs");
  Bytes data = RandomBytes(3 * kTestChunk + 5, 1);
  Result<BlobId> id = store->Put(data, kTestChunk);
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

// A part of a blob, from the chunks that hold it: within a chunk, across chunk boundaries, the
// last (short) chunk, empty; a range past the end is refused naming the blob's size.
TEST(BlobStoreTest, ReadRangeReadsOnlyThePartAskedFor) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/data/blobs");
  Bytes data = RandomBytes(3 * kTestChunk + 5, 2);
  Result<BlobId> id = store->Put(data, kTestChunk);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  const uint64_t n = data.size();
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {{0, 1},
                                                             {3, kTestChunk - 3},
                                                             {kTestChunk - 2, 4},
                                                             {1, 2 * kTestChunk + 3},
                                                             {3 * kTestChunk, 5},
                                                             {n - 1, 1},
                                                             {0, n},
                                                             {7, 0},
                                                             {n, 0}};
  for (auto [offset, length] : ranges) {
    Result<Bytes> got = store->ReadRange(*id, offset, length);
    ASSERT_TRUE(got.ok()) << offset << "+" << length << ": " << got.status().ToString();
    EXPECT_EQ(*got, Bytes(data.begin() + static_cast<std::ptrdiff_t>(offset),
                          data.begin() + static_cast<std::ptrdiff_t>(offset + length)))
        << offset << "+" << length;
  }
  Result<Bytes> past = store->ReadRange(*id, n - 1, 2);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find(std::to_string(n) + " bytes"), std::string::npos)
      << past.status().ToString();
  EXPECT_EQ(store->ReadRange(BlobId{Blake2b("nothing")}, 0, 1).status().code(),
            StatusCode::kNotFound);
}

TEST(BlobStoreTest, IdenticalChunksStoredOnce) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b");
  Bytes zeros(4 * kTestChunk, 0);
  BlobId id = *store->Put(zeros, kTestChunk);
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
    a = *store->Put(RandomBytes(2 * kTestChunk, 3), kTestChunk);
    b = *store->Put(RandomBytes(kTestChunk + 1, 4), kTestChunk);
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
  auto store = OpenOrDie(&env, "/b", /*quota=*/3 * (2 * kTestChunk + 200));
  BlobId a = *store->Put(RandomBytes(2 * kTestChunk, 10), kTestChunk);
  BlobId b = *store->Put(RandomBytes(2 * kTestChunk, 11), kTestChunk);
  BlobId c = *store->Put(RandomBytes(2 * kTestChunk, 12), kTestChunk);
  ASSERT_TRUE(store->Pin(a).ok());
  ASSERT_TRUE(store->Get(b).ok());  // b is now more recent than c
  BlobId d = *store->Put(RandomBytes(2 * kTestChunk, 13), kTestChunk);
  EXPECT_TRUE(store->HasBlob(a));       // pinned
  EXPECT_TRUE(store->HasBlob(b));       // recently used
  EXPECT_FALSE(store->HasManifest(c));  // least recently used: evicted
  EXPECT_TRUE(store->HasBlob(d));
  EXPECT_EQ(store->stats().evicted_blobs, 1u);
  EXPECT_LE(store->stats().used_bytes, 3 * (2 * kTestChunk + 200));
}

TEST(BlobStoreTest, QuotaFullOfPinnedRefusesAndChangesNothing) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b", /*quota=*/2 * (2 * kTestChunk + 200));
  BlobId a = *store->Put(RandomBytes(2 * kTestChunk, 20), kTestChunk);
  BlobId b = *store->Put(RandomBytes(2 * kTestChunk, 21), kTestChunk);
  ASSERT_TRUE(store->Pin(a).ok());
  ASSERT_TRUE(store->Pin(b).ok());
  BlobStoreStats before = store->stats();
  Result<BlobId> c = store->Put(RandomBytes(2 * kTestChunk, 22), kTestChunk);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  BlobStoreStats after = store->stats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.chunk_files, before.chunk_files);
  EXPECT_EQ(after.manifests, before.manifests);
  // Unpinning makes room again.
  ASSERT_TRUE(store->Unpin(a).ok());
  EXPECT_TRUE(store->Put(RandomBytes(2 * kTestChunk, 22), kTestChunk).ok());
  EXPECT_FALSE(store->HasManifest(a));
  EXPECT_EQ(store->Unpin(a).code(), StatusCode::kFailedPrecondition);
}

TEST(BlobStoreTest, HeldBlobIsNotEvictedAndRemoveRefusesPinned) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b", /*quota=*/2 * kTestChunk + 200);
  BlobId a = *store->Put(RandomBytes(2 * kTestChunk, 30), kTestChunk);
  store->Hold(a);
  EXPECT_EQ(store->Put(RandomBytes(kTestChunk, 31), kTestChunk).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Remove(a).code(), StatusCode::kFailedPrecondition);
  store->Release(a);
  EXPECT_TRUE(store->Remove(a).ok());
}

TEST(BlobStoreTest, GarbageCollectionDropsOrphanChunks) {
  MemEnv env;
  auto store = OpenOrDie(&env, "/b");
  BlobId a = *store->Put(RandomBytes(2 * kTestChunk, 40), kTestChunk);
  Bytes orphan = RandomBytes(kTestChunk, 41);
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
  Bytes data = RandomBytes(3 * kTestChunk, 50);
  Result<BlobId> id = store->Put(data, kTestChunk);
  ASSERT_FALSE(id.ok());
  env.FailWritesAfter(-1);
  // Every chunk file that exists is complete and matches its name.
  std::vector<std::string> names = *env.ListDir("/b/chunks");
  for (const std::string& name : names) {
    std::string content = *env.ReadFile("/b/chunks/" + name);
    EXPECT_EQ(Blake2b(content).ToHex(), name);
  }
  // A second attempt completes the blob.
  BlobId again = *store->Put(data, kTestChunk);
  EXPECT_EQ(*store->Get(again), data);
}

TEST(BlobStoreTest, CrashLeftoversOnDiskAreNeverVisible) {
  const std::string tmp = TestDir("net");
  Bytes data = RandomBytes(3 * kTestChunk, 60);
  BlobId id;
  Manifest m = BuildManifest(data, kTestChunk);
  {
    auto store = OpenOrDie(Env::Default(), tmp);
    id = *store->Put(data, kTestChunk);
  }
  Env* env = Env::Default();
  std::string chunk_dir = tmp + "/chunks";
  // A crash in WriteFileAtomic before its rename leaves a partial temporary...
  std::string partial = chunk_dir + "/" + Blake2b("x").ToHex() + ".tmp.123.0";
  ASSERT_TRUE(env->WriteFileAtomic(partial, "half a chu").ok());
  // ...and a disk fault may corrupt a complete chunk file.
  std::string chunk1 = chunk_dir + "/" + m.chunks[1].ToHex();
  ASSERT_TRUE(env->WriteFileAtomic(chunk1, "garbage").ok());

  auto store = OpenOrDie(env, tmp);
  EXPECT_FALSE(env->FileExists(partial));
  EXPECT_EQ(store->stats().chunk_files, 3u);
  Result<Bytes> got = store->Get(id);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(store->HasBlob(id));
  EXPECT_EQ(*store->MissingChunks(id), std::vector<size_t>{1});
  // Putting the blob again repairs it.
  ASSERT_TRUE(store->Put(data, kTestChunk).ok());
  EXPECT_EQ(*store->Get(id), data);
}

TEST(BlobStoreTest, ConcurrentPutsAndGets) {
  const std::string tmp = TestDir("net");
  auto store = OpenOrDie(Env::Default(), tmp);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        // Blobs share their first chunk across threads.
        Bytes data = RandomBytes(3 * kTestChunk, 1000 + t * 10 + i);
        std::fill(data.begin(), data.begin() + kTestChunk, 0);
        Result<BlobId> id = store->Put(data, kTestChunk);
        if (id.ok() && store->Get(*id).ok() && *store->Get(*id) == data) ++ok[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 5);
  EXPECT_EQ(store->stats().chunk_files, 1u + 4 * 5 * 2);
}

TEST(BlobStoreTest, ParallelChunkWritesKeepAccountsExact) {
  const std::string tmp = TestDir("net");
  auto store = OpenOrDie(Env::Default(), tmp);
  std::vector<Bytes> chunks;
  for (int i = 0; i < 8; ++i) chunks.push_back(RandomBytes(kTestChunk + i, 3000 + i));
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
  auto reopened = OpenOrDie(Env::Default(), tmp);
  EXPECT_EQ(reopened->stats().used_bytes, expect);  // no temporaries were left behind
  EXPECT_EQ(reopened->stats().chunk_files, 8u);
}

}  // namespace
}  // namespace meshlearn::net

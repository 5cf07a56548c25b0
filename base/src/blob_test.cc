#include "meshlearn/base/blob.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/rng.h"

namespace meshlearn {
namespace {

Bytes RandomBytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng.NextU32());
  return b;
}

TEST(BlobTest, ChunksAndRoundTrip) {
  Bytes data = RandomBytes(10'000, 1);
  Manifest m = BuildManifest(data, 4096);
  EXPECT_EQ(m.total_size, 10'000u);
  ASSERT_EQ(m.chunk_count(), 3u);
  EXPECT_EQ(m.ChunkLength(0), 4096u);
  EXPECT_EQ(m.ChunkLength(2), 10'000u - 8192u);
  EXPECT_EQ(m.chunks[1], Blake2b(ByteSpan(data).subspan(4096, 4096)));
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(VerifyChunk(m, i, ByteSpan(data).subspan(m.ChunkOffset(i), m.ChunkLength(i))).ok());
  }
  BlobId id = m.id();
  Result<Manifest> back = DecodeManifest(EncodeManifest(m), &id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(BlobId::FromHex(id.ToHex())->hash, id.hash);
}

// A blob given a piece at a time, cut anywhere (within a chunk, on a chunk's end, across several
// chunks, empty pieces), has the manifest of its chunks: each chunk's Blake2b, whatever the cuts.
TEST(BlobTest, ABuilderGivenPiecesCutAnywhereHashesTheSameChunks) {
  const Bytes data = RandomBytes(10'000, 3);
  std::vector<Hash256> want;
  for (size_t off = 0; off < data.size(); off += 4096) {
    want.push_back(Blake2b(ByteSpan(data).subspan(off, std::min<size_t>(4096, data.size() - off))));
  }
  for (const std::vector<size_t>& cuts : std::vector<std::vector<size_t>>{
           {}, {1}, {4095}, {4096}, {4097}, {0, 0, 9000}, {100, 4000, 4096, 9999}, {8192, 8193}}) {
    ManifestBuilder b(4096);
    size_t from = 0;
    for (size_t cut : cuts) {
      cut = std::max(cut, from);
      b.Append(ByteSpan(data).subspan(from, cut - from));
      from = cut;
    }
    b.Append(ByteSpan(data).subspan(from));
    const Manifest m = b.Finish();
    EXPECT_EQ(m.total_size, data.size());
    EXPECT_EQ(m.chunk_size, 4096u);
    EXPECT_EQ(m.chunks, want) << "cut at " << (cuts.empty() ? 0 : cuts[0]);
  }
}

TEST(BlobTest, DefaultChunkSizeIsOneMiB) {
  Bytes data((1u << 20) + 1, 7);
  Manifest m = BuildManifest(data);
  EXPECT_EQ(m.chunk_size, 1u << 20);
  ASSERT_EQ(m.chunk_count(), 2u);
  EXPECT_EQ(m.ChunkLength(1), 1u);
}

TEST(BlobTest, EmptyBlob) {
  Manifest m = BuildManifest({}, 4096);
  EXPECT_EQ(m.chunk_count(), 0u);
  BlobId id = m.id();
  EXPECT_TRUE(DecodeManifest(EncodeManifest(m), &id).ok());
}

TEST(BlobTest, IdCommitsToSizeAndChunkSize) {
  Bytes data = RandomBytes(5000, 2);
  Manifest a = BuildManifest(data, 4096);
  Manifest b = a;
  b.total_size = 4097;  // same hashes, different size
  EXPECT_NE(a.id(), b.id());
  Manifest c = BuildManifest(data, 2048);
  EXPECT_NE(a.id(), c.id());
}

TEST(BlobTest, VerifyChunkRejectsWrongBytes) {
  Bytes data = RandomBytes(5000, 3);
  Manifest m = BuildManifest(data, 4096);
  Bytes bad(data.begin(), data.begin() + 4096);
  bad[17] ^= 1;
  EXPECT_EQ(VerifyChunk(m, 0, bad).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(VerifyChunk(m, 1, ByteSpan(data).subspan(4096, 100)).ok());  // wrong length
  EXPECT_FALSE(VerifyChunk(m, 2, {}).ok());                                 // out of range
}

class MalformedManifestTest : public ::testing::Test {
 protected:
  Bytes data_ = RandomBytes(10'000, 4);
  Manifest m_ = BuildManifest(data_, 4096);
  Bytes wire_ = EncodeManifest(m_);
  BlobId id_ = m_.id();
};

TEST_F(MalformedManifestTest, TruncatedAtEveryLength) {
  for (size_t n = 0; n < wire_.size(); ++n) {
    Bytes cut(wire_.begin(), wire_.begin() + n);
    EXPECT_FALSE(DecodeManifest(cut).ok()) << "length " << n;
  }
}

TEST_F(MalformedManifestTest, TrailingBytes) {
  Bytes w = wire_;
  w.push_back(0);
  Result<Manifest> r = DecodeManifest(w);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trailing"), std::string::npos) << r.status().ToString();
}

TEST_F(MalformedManifestTest, OversizedCount) {
  Encoder e;
  e.PutU32(kManifestMagic).PutU8(kManifestVersion).PutU64(10'000).PutU32(4096);
  e.PutU32(0xffffffffu);  // a forged count must not allocate
  Result<Manifest> r = DecodeManifest(e.bytes());
  ASSERT_FALSE(r.ok());
}

TEST_F(MalformedManifestTest, CountDisagreesWithSize) {
  Manifest m = m_;
  m.chunks.pop_back();
  EXPECT_FALSE(DecodeManifest(EncodeManifest(m)).ok());
  m = m_;
  m.chunks.push_back(m.chunks[0]);
  EXPECT_FALSE(DecodeManifest(EncodeManifest(m)).ok());
}

TEST_F(MalformedManifestTest, BadChunkSizeMagicVersion) {
  Manifest m = m_;
  m.chunk_size = 0;
  EXPECT_FALSE(DecodeManifest(EncodeManifest(m)).ok());
  m.chunk_size = kMaxChunkSize + 1;
  EXPECT_FALSE(DecodeManifest(EncodeManifest(m)).ok());
  Bytes w = wire_;
  w[0] ^= 0xff;
  EXPECT_FALSE(DecodeManifest(w).ok());
  w = wire_;
  w[4] = 99;
  EXPECT_FALSE(DecodeManifest(w).ok());
}

TEST_F(MalformedManifestTest, TooLargeBlob) {
  Encoder e;
  e.PutU32(kManifestMagic).PutU8(kManifestVersion).PutU64(kMaxBlobSize + 1).PutU32(kMaxChunkSize);
  e.PutU32(0);
  EXPECT_EQ(DecodeManifest(e.bytes()).status().code(), StatusCode::kResourceExhausted);
}

TEST_F(MalformedManifestTest, WrongRoot) {
  Manifest m = m_;
  m.chunks[1].bytes[0] ^= 1;  // well-formed, but not the blob we asked for
  Result<Manifest> r = DecodeManifest(EncodeManifest(m), &id_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(DecodeManifest(EncodeManifest(m)).ok());  // fine without an expected id
}

}  // namespace
}  // namespace meshlearn

#include "meshlearn/engine/data.h"

#include <zlib.h>

#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <set>

#include <gtest/gtest.h>

namespace meshlearn::engine {
namespace {

std::string Gzip(const std::string& in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, in.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = in.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = out.size();
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string BE32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string IdxImages(uint32_t n, uint32_t rows, uint32_t cols) {
  std::string s = BE32(0x803) + BE32(n) + BE32(rows) + BE32(cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) s.push_back(static_cast<char>(i % 256));
  return s;
}
std::string IdxLabels(uint32_t n) {
  std::string s = BE32(0x801) + BE32(n);
  for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

TEST(DataTest, IdxGzipRoundTrip) {
  MemEnv env;
  ASSERT_TRUE(env.WriteFileAtomic("/img.gz", Gzip(IdxImages(5, 2, 3))).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/lab", IdxLabels(5)).ok());  // plain (not gzip) also works
  Result<ClassificationData> d = LoadIdx(&env, "/img.gz", "/lab", 0.0f, 1.0f);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->x.shape(), (Shape{5, 1, 2, 3}));
  EXPECT_EQ(d->x[7], 7.0f / 255.0f);
  EXPECT_EQ(d->y[3], 3);
  EXPECT_EQ(d->num_classes, 5);
}

TEST(DataTest, IdxRejectsBadMagic) {
  MemEnv env;
  std::string img = IdxImages(2, 2, 2);
  img[3] = 0x01;
  ASSERT_TRUE(env.WriteFileAtomic("/img", img).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/lab", IdxLabels(2)).ok());
  Result<ClassificationData> d = LoadIdx(&env, "/img", "/lab", 0, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("/img: not an IDX image file"), std::string::npos)
      << d.status().message();
}

TEST(DataTest, IdxRejectsTruncatedImages) {
  MemEnv env;
  std::string img = IdxImages(4, 2, 2);
  img.resize(img.size() - 1);
  ASSERT_TRUE(env.WriteFileAtomic("/img", img).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/lab", IdxLabels(4)).ok());
  Result<ClassificationData> d = LoadIdx(&env, "/img", "/lab", 0, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("truncated"), std::string::npos) << d.status().message();
}

TEST(DataTest, IdxRejectsLabelCountMismatch) {
  MemEnv env;
  ASSERT_TRUE(env.WriteFileAtomic("/img", IdxImages(4, 2, 2)).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/lab", IdxLabels(3)).ok());
  Result<ClassificationData> d = LoadIdx(&env, "/img", "/lab", 0, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("has 3 labels but /img has 4 images"), std::string::npos)
      << d.status().message();
}

TEST(DataTest, IdxRejectsCorruptGzip) {
  MemEnv env;
  std::string gz = Gzip(IdxImages(4, 2, 2));
  gz.resize(gz.size() / 2);
  ASSERT_TRUE(env.WriteFileAtomic("/img.gz", gz).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/lab", IdxLabels(4)).ok());
  Result<ClassificationData> d = LoadIdx(&env, "/img.gz", "/lab", 0, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("/img.gz"), std::string::npos) << d.status().message();
}

// Hostile input: a small gzip file that decompresses to far more than the machine has (a bomb)
// is refused at half the available memory instead of ending in std::bad_alloc.
TEST(DataTest, GzipBombStopsAtHalfTheAvailableMemory) {
  setenv("MESHLEARN_MEMORY_BYTES", "16777216", 1);  // 16 MiB: the limit is 8 MiB
  MemEnv env;
  ASSERT_TRUE(env.WriteFileAtomic("/img.gz", Gzip(std::string(64 << 20, '\0'))).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/lab", IdxLabels(4)).ok());
  Result<ClassificationData> d = LoadIdx(&env, "/img.gz", "/lab", 0, 1);
  unsetenv("MESHLEARN_MEMORY_BYTES");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("/img.gz: decompressed data exceeds 8388608 bytes"),
            std::string::npos)
      << d.status().message();
}

std::string Npy(const std::string& descr, const std::string& shape, const std::string& data,
                const std::string& fortran = "False") {
  std::string h =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64 != 0) h.push_back(' ');
  h.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  return out + h + data;
}

TEST(DataTest, NpyParsesFloatAndInt) {
  float f[6] = {1, 2, 3, 4, 5, 6};
  Result<NpyArray> a =
      ParseNpy(Npy("<f4", "(2, 3)", std::string(reinterpret_cast<char*>(f), 24)), "a.npy");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->shape, (Shape{2, 3}));
  EXPECT_EQ(a->AsFloat(4), 5.0f);
  Result<NpyArray> b = ParseNpy(Npy("|u1", "(3,)", "\x01\x02\x03"), "b.npy");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->AsInt(2), 3);
}

TEST(DataTest, NpyRejectsMalformed) {
  struct Case {
    std::string bytes, needle;
  } cases[] = {
      {"NOTNUMPY", "magic"},
      {Npy("<f8", "(1,)", std::string(8, '\0')), "unsupported dtype '<f8'"},
      {Npy("<f4", "(1,)", std::string(4, '\0'), "True"), "not C-ordered"},
      {Npy("<f4", "(2, 2)", std::string(12, '\0')), "needs 16 bytes"},
      {Npy("<f4", "(a,)", std::string(4, '\0')), "bad shape entry"},
  };
  for (const Case& c : cases) {
    Result<NpyArray> a = ParseNpy(c.bytes, "x.npy");
    ASSERT_FALSE(a.ok()) << c.needle;
    EXPECT_NE(a.status().message().find("x.npy"), std::string::npos);
    EXPECT_NE(a.status().message().find(c.needle), std::string::npos) << a.status().message();
  }
}

TEST(DataTest, NpyPairChecksLengths) {
  MemEnv env;
  ASSERT_TRUE(env.WriteFileAtomic("/x.npy", Npy("|u1", "(3, 2)", std::string(6, '\x10'))).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/y.npy", Npy("|u1", "(2,)", std::string("\x01\x00", 2))).ok());
  Result<ClassificationData> d = LoadNpyPair(&env, "/x.npy", "/y.npy", 0, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("has 2 labels but /x.npy has 3 samples"), std::string::npos)
      << d.status().message();
  ASSERT_TRUE(
      env.WriteFileAtomic("/y.npy", Npy("|u1", "(3,)", std::string("\x01\x00\x02", 3))).ok());
  d = LoadNpyPair(&env, "/x.npy", "/y.npy", 0, 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->num_classes, 3);
}

TEST(DataTest, TokensValidate) {
  MemEnv env;
  ASSERT_TRUE(env.WriteFileAtomic("/t.bin", std::string("\x01\x00\x05\x00\x03", 5)).ok());
  Result<TokenData> t = LoadTokens(&env, "/t.bin", 10);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("odd number of bytes"), std::string::npos);
  ASSERT_TRUE(env.WriteFileAtomic("/t.bin", std::string("\x01\x00\x05\x00", 4)).ok());
  t = LoadTokens(&env, "/t.bin", 5);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("token 5 at index 1 is >= vocab_size 5"), std::string::npos)
      << t.status().message();
  t = LoadTokens(&env, "/t.bin", 6);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->tokens, (std::vector<int32_t>{1, 5}));
}

TEST(DataTest, PermutationIsAPermutationAndDependsOnStream) {
  std::vector<int64_t> p = BatchSampler::Permutation(7, 0, 0, 1000);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(p, BatchSampler::Permutation(7, 1, 0, 1000));
  EXPECT_NE(p, BatchSampler::Permutation(7, 0, 1, 1000));
  EXPECT_NE(p, BatchSampler::Permutation(8, 0, 0, 1000));
  EXPECT_EQ(p, BatchSampler::Permutation(7, 0, 0, 1000));
}

TEST(DataTest, BatchIndicesArePureFunctionsOfStep) {
  BatchSampler a(3, 5, 100, 32), b(3, 5, 100, 32);
  // Different call orders, same answers: a verifier can start at any step.
  std::vector<int64_t> a7 = a.Indices(7);
  for (int s = 0; s < 7; ++s) b.Indices(s);
  EXPECT_EQ(a7, b.Indices(7));
  // One epoch covers every sample exactly once (steps 0..2 plus part of 3 for N=100, B=32).
  std::set<int64_t> seen;
  BatchSampler c(3, 5, 96, 32);
  for (int s = 0; s < 3; ++s) {
    for (int64_t i : c.Indices(s)) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 96u);
}

// A training loop hands the previous step's inputs back (DataStream::Recycle): the batch made in
// that storage has exactly the rows a fresh one has, whatever the storage held.
TEST(DataTest, ClassificationBatchInReusedStorageEqualsAFreshOne) {
  ClassificationData d;
  d.x = Tensor({5, 2, 3});
  for (int64_t i = 0; i < d.x.size(); ++i) d.x.data()[i] = static_cast<float>(i) + 0.5f;
  d.y = {0, 1, 2, 3, 4};
  d.num_classes = 5;
  const std::vector<int64_t> idx = {4, 0, 3};
  const Batch fresh = MakeClassificationBatch(d, idx);
  Tensor stale({18});
  std::fill(stale.data(), stale.data() + stale.size(), -7.0f);
  const float* storage = stale.data();
  const Batch reused = MakeClassificationBatch(d, idx, std::move(stale));
  EXPECT_EQ(reused.inputs.data(), storage);  // the storage was taken
  EXPECT_EQ(reused.inputs.shape(), fresh.inputs.shape());
  EXPECT_EQ(reused.inputs.vec(), fresh.inputs.vec());
  EXPECT_EQ(reused.targets, fresh.targets);
  // Storage of another size is left alone.
  const Batch other = MakeClassificationBatch(d, idx, Tensor({7}));
  EXPECT_EQ(other.inputs.shape(), fresh.inputs.shape());
  EXPECT_EQ(other.inputs.vec(), fresh.inputs.vec());
}

TEST(DataTest, WindowStartsInRangeAndDeterministic) {
  std::vector<int64_t> w = WindowStarts(1, 2, 3, 64, 100, 10);
  for (int64_t s : w) {
    EXPECT_GE(s, 0);
    EXPECT_LE(s, 89);
  }
  EXPECT_EQ(w, WindowStarts(1, 2, 3, 64, 100, 10));
  EXPECT_NE(w, WindowStarts(1, 2, 4, 64, 100, 10));
}

TEST(DataTest, CharVocab) {
  CharVocab v = BuildCharVocab("hello");
  EXPECT_EQ(v.chars, (std::vector<uint8_t>{'e', 'h', 'l', 'o'}));
  EXPECT_EQ(EncodeChars(v, "hole"), (std::vector<int32_t>{1, 3, 2, 0}));
}

}  // namespace
}  // namespace meshlearn::engine

#include "meshlearn/base/encoding.h"

#include <gtest/gtest.h>

#include <limits>

namespace meshlearn {
namespace {

struct Sample {
  uint8_t a = 0;
  uint16_t b = 0;
  uint32_t c = 0;
  uint64_t d = 0;
  int64_t e = 0;
  bool f = false;
  float g = 0;
  std::string s;
  Bytes bytes;
  Hash256 h;
  PublicKey pk;
  std::vector<uint64_t> list;

  Bytes Encode() const {
    Encoder enc;
    enc.PutU8(a).PutU16(b).PutU32(c).PutU64(d).PutI64(e).PutBool(f).PutF32(g).PutString(s)
        .PutBytes(bytes).PutHash(h).PutPublicKey(pk).PutU32(static_cast<uint32_t>(list.size()));
    for (uint64_t x : list) enc.PutU64(x);
    return enc.Take();
  }

  static Result<Sample> Decode(ByteSpan data) {
    Sample x;
    Decoder dec(data, "sample");
    ML_RETURN_IF_ERROR(dec.GetU8(&x.a, "a"));
    ML_RETURN_IF_ERROR(dec.GetU16(&x.b, "b"));
    ML_RETURN_IF_ERROR(dec.GetU32(&x.c, "c"));
    ML_RETURN_IF_ERROR(dec.GetU64(&x.d, "d"));
    ML_RETURN_IF_ERROR(dec.GetI64(&x.e, "e"));
    ML_RETURN_IF_ERROR(dec.GetBool(&x.f, "f"));
    ML_RETURN_IF_ERROR(dec.GetF32(&x.g, "g"));
    ML_RETURN_IF_ERROR(dec.GetString(&x.s, "s", 64));
    ML_RETURN_IF_ERROR(dec.GetBytes(&x.bytes, "bytes", 64));
    ML_RETURN_IF_ERROR(dec.GetHash(&x.h, "h"));
    ML_RETURN_IF_ERROR(dec.GetPublicKey(&x.pk, "pk"));
    uint32_t n;
    ML_RETURN_IF_ERROR(dec.GetCount(&n, "list", 16, 8));
    x.list.resize(n);
    for (uint32_t i = 0; i < n; ++i) ML_RETURN_IF_ERROR(dec.GetU64(&x.list[i], "list[]"));
    ML_RETURN_IF_ERROR(dec.Finish());
    return x;
  }
};

Sample MakeSample() {
  Sample x;
  x.a = 0xab;
  x.b = 0xbeef;
  x.c = 0xdeadbeef;
  x.d = std::numeric_limits<uint64_t>::max() - 1;
  x.e = -42;
  x.f = true;
  x.g = -1.5f;
  x.s = "héllo";
  x.bytes = {1, 2, 3};
  x.h = Blake2b("h");
  x.pk.bytes.fill(9);
  x.list = {1, 2, 3};
  return x;
}

TEST(Encoding, RoundTrip) {
  Sample x = MakeSample();
  Bytes wire = x.Encode();
  Result<Sample> y = Sample::Decode(wire);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(y->a, x.a);
  EXPECT_EQ(y->b, x.b);
  EXPECT_EQ(y->c, x.c);
  EXPECT_EQ(y->d, x.d);
  EXPECT_EQ(y->e, x.e);
  EXPECT_EQ(y->f, x.f);
  EXPECT_EQ(y->g, x.g);
  EXPECT_EQ(y->s, x.s);
  EXPECT_EQ(y->bytes, x.bytes);
  EXPECT_EQ(y->h, x.h);
  EXPECT_EQ(y->pk, x.pk);
  EXPECT_EQ(y->list, x.list);
  EXPECT_EQ(y->Encode(), wire);  // canonical: re-encoding gives the same bytes
}

TEST(Encoding, LittleEndianFixedWidth) {
  Encoder e;
  e.PutU32(0x01020304).PutU16(0x0506);
  EXPECT_EQ(e.bytes(), (Bytes{4, 3, 2, 1, 6, 5}));
}

TEST(Encoding, EveryTruncationIsRejected) {
  Bytes wire = MakeSample().Encode();
  for (size_t n = 0; n < wire.size(); ++n) {
    Result<Sample> r = Sample::Decode(ByteSpan(wire.data(), n));
    ASSERT_FALSE(r.ok()) << "accepted a prefix of " << n << " bytes";
    EXPECT_NE(r.status().message().find("sample"), std::string::npos);
  }
}

TEST(Encoding, TrailingBytesRejected) {
  Bytes wire = MakeSample().Encode();
  wire.push_back(0);
  Result<Sample> r = Sample::Decode(wire);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trailing"), std::string::npos);
}

TEST(Encoding, OversizedLengthRejected) {
  Encoder e;
  e.PutU8(0).PutU16(0).PutU32(0).PutU64(0).PutI64(0).PutBool(false).PutF32(0);
  e.PutString(std::string(65, 'x'));  // over the 64-byte limit of field s
  Result<Sample> r = Sample::Decode(e.bytes());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'s'"), std::string::npos);
  EXPECT_NE(r.status().message().find("limit"), std::string::npos);
}

TEST(Encoding, ForgedCountCannotAllocate) {
  Sample x = MakeSample();
  x.list.clear();
  Bytes wire = x.Encode();
  // Overwrite the list count (last 4 bytes) with 15: within the limit but with no bytes behind.
  wire[wire.size() - 4] = 15;
  Result<Sample> r = Sample::Decode(wire);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  wire[wire.size() - 4] = 0xff;
  wire[wire.size() - 1] = 0xff;  // 4 billion elements: over the limit
  EXPECT_FALSE(Sample::Decode(wire).ok());
}

TEST(Encoding, InvalidBoolRejected) {
  Encoder e;
  e.PutU8(2);
  Decoder d(e.bytes(), "flag");
  bool b;
  EXPECT_FALSE(d.GetBool(&b, "f").ok());
}

}  // namespace
}  // namespace meshlearn

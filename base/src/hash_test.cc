#include "meshlearn/base/hash.h"

#include <gtest/gtest.h>

#include "meshlearn/base/hex.h"

namespace meshlearn {
namespace {

TEST(Blake2b, KnownVector) {
  // BLAKE2b-256("abc"), from the reference implementation (RFC 7693 family).
  EXPECT_EQ(Blake2b("abc").ToHex(),
            "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
}

TEST(Blake2b, StreamingEqualsOneShot) {
  Hasher h;
  h.Update("a").Update("bc");
  EXPECT_EQ(h.Finish(), Blake2b("abc"));
}

TEST(Blake2b, DomainsSeparate) {
  Hasher a("state"), b("block");
  a.Update("x");
  b.Update("x");
  EXPECT_NE(a.Finish(), b.Finish());
}

TEST(Hex, RoundTripAndErrors) {
  Bytes b = {0x00, 0x7f, 0xff, 0x10};
  EXPECT_EQ(HexEncode(b), "007fff10");
  EXPECT_EQ(*HexDecode("007FFF10"), b);
  Result<Bytes> odd = HexDecode("abc", "nonce");
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("nonce"), std::string::npos);
  EXPECT_FALSE(HexDecode("zz").ok());
  Hash256 h = Blake2b("x");
  EXPECT_EQ(*Hash256::FromHex(h.ToHex()), h);
  EXPECT_FALSE(Hash256::FromHex("abcd").ok());
}

}  // namespace
}  // namespace meshlearn

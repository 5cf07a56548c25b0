#include "meshlearn/base/sign.h"

#include <gtest/gtest.h>

namespace meshlearn {
namespace {

TEST(Ed25519, ValidSignatureVerifies) {
  KeyPair kp = KeyPair::Generate();
  Signature sig = kp.Sign("transfer 10 to bob");
  EXPECT_TRUE(Verify(kp.public_key(), "transfer 10 to bob", sig));
}

TEST(Ed25519, WrongKeyFails) {
  KeyPair a = KeyPair::Generate();
  KeyPair b = KeyPair::Generate();
  EXPECT_FALSE(Verify(b.public_key(), "msg", a.Sign("msg")));
}

TEST(Ed25519, FlippedBitFails) {
  KeyPair kp = KeyPair::Generate();
  Signature sig = kp.Sign("msg");
  for (size_t i = 0; i < Signature::kSize; i += 7) {
    Signature bad = sig;
    bad.bytes[i] ^= 0x01;
    EXPECT_FALSE(Verify(kp.public_key(), "msg", bad)) << "byte " << i;
  }
  EXPECT_FALSE(Verify(kp.public_key(), "msh", sig));  // flipped message bit
  PublicKey pk = kp.public_key();
  pk.bytes[3] ^= 0x20;
  EXPECT_FALSE(Verify(pk, "msg", sig));
}

TEST(Ed25519, SeedIsDeterministic) {
  KeySeed seed;
  seed.bytes.fill(7);
  EXPECT_EQ(KeyPair::FromSeed(seed).public_key(), KeyPair::FromSeed(seed).public_key());
  EXPECT_EQ(KeyPair::FromSeed(seed).Sign("m"), KeyPair::FromSeed(seed).Sign("m"));
}

TEST(Ed25519, HexRoundTrip) {
  KeyPair kp = KeyPair::Generate();
  EXPECT_EQ(*PublicKey::FromHex(kp.public_key().ToHex()), kp.public_key());
  Signature sig = kp.Sign("m");
  EXPECT_EQ(*Signature::FromHex(sig.ToHex()), sig);
  EXPECT_FALSE(PublicKey::FromHex("00").ok());
}

}  // namespace
}  // namespace meshlearn

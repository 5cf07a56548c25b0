#include "meshlearn/base/sign.h"

#include <sodium.h>

#include <cstring>

#include "meshlearn/base/hex.h"
#include "sodium_init.h"

namespace meshlearn {
namespace {

using internal::InitSodium;

template <typename T>
Result<T> FixedFromHex(std::string_view hex, std::string_view what) {
  if (hex.size() != 2 * T::kSize) {
    return InvalidArgument(std::string(what) + ": expected " + std::to_string(2 * T::kSize) +
                           " hex digits, got " + std::to_string(hex.size()));
  }
  ML_ASSIGN_OR_RETURN(Bytes b, HexDecode(hex, what));
  T out;
  std::memcpy(out.bytes.data(), b.data(), T::kSize);
  return out;
}

}  // namespace

static_assert(PublicKey::kSize == crypto_sign_PUBLICKEYBYTES);
static_assert(Signature::kSize == crypto_sign_BYTES);
static_assert(KeySeed::kSize == crypto_sign_SEEDBYTES);

std::string PublicKey::ToHex() const { return HexEncode(span()); }
std::string PublicKey::ShortHex() const { return ToHex().substr(0, 12); }
Result<PublicKey> PublicKey::FromHex(std::string_view hex, std::string_view what) {
  return FixedFromHex<PublicKey>(hex, what);
}
std::string Signature::ToHex() const { return HexEncode(span()); }
Result<Signature> Signature::FromHex(std::string_view hex, std::string_view what) {
  return FixedFromHex<Signature>(hex, what);
}

KeyPair KeyPair::Generate() {
  KeySeed seed;
  SecureRandomBytes(seed.bytes);
  KeyPair kp = FromSeed(seed);
  sodium_memzero(seed.bytes.data(), seed.bytes.size());
  return kp;
}

KeyPair KeyPair::FromSeed(const KeySeed& seed) {
  InitSodium();
  KeyPair kp;
  kp.seed_ = seed;
  crypto_sign_seed_keypair(kp.public_key_.bytes.data(), kp.secret_.data(), seed.bytes.data());
  return kp;
}

KeyPair::KeyPair(const KeyPair&) = default;
KeyPair& KeyPair::operator=(const KeyPair&) = default;

KeyPair::~KeyPair() {
  sodium_memzero(seed_.bytes.data(), seed_.bytes.size());
  sodium_memzero(secret_.data(), secret_.size());
}

Signature KeyPair::Sign(ByteSpan message) const {
  Signature sig;
  crypto_sign_detached(sig.bytes.data(), nullptr, message.data(), message.size(), secret_.data());
  return sig;
}

bool Verify(const PublicKey& key, ByteSpan message, const Signature& sig) {
  InitSodium();
  return crypto_sign_verify_detached(sig.bytes.data(), message.data(), message.size(),
                                     key.bytes.data()) == 0;
}

void SecureRandomBytes(std::span<uint8_t> out) {
  InitSodium();
  randombytes_buf(out.data(), out.size());
}

}  // namespace meshlearn

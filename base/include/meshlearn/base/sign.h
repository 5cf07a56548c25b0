// ed25519 signatures (libsodium). Accounts and nodes are identified by their public keys.
//
//   KeyPair kp = KeyPair::Generate();
//   Signature sig = kp.Sign(message);
//   bool ok = Verify(kp.public_key(), message, sig);
//
// Secret key material is wiped from memory when a KeyPair is destroyed.
#pragma once

#include <array>
#include <compare>
#include <string>
#include <string_view>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

struct PublicKey {
  static constexpr size_t kSize = 32;
  std::array<uint8_t, kSize> bytes{};
  std::string ToHex() const;
  std::string ShortHex() const;  // first 12 hex digits, for logs
  static Result<PublicKey> FromHex(std::string_view hex, std::string_view what = "public key");
  ByteSpan span() const { return {bytes.data(), bytes.size()}; }
  auto operator<=>(const PublicKey&) const = default;
};

struct Signature {
  static constexpr size_t kSize = 64;
  std::array<uint8_t, kSize> bytes{};
  std::string ToHex() const;
  static Result<Signature> FromHex(std::string_view hex, std::string_view what = "signature");
  ByteSpan span() const { return {bytes.data(), bytes.size()}; }
  auto operator<=>(const Signature&) const = default;
};

// 32-byte seed from which an ed25519 key pair is derived deterministically.
struct KeySeed {
  static constexpr size_t kSize = 32;
  std::array<uint8_t, kSize> bytes{};
};

class KeyPair {
 public:
  static KeyPair Generate();                    // from the OS's secure RNG
  static KeyPair FromSeed(const KeySeed& seed);  // deterministic (tests, devnets)
  KeyPair(const KeyPair&);
  KeyPair& operator=(const KeyPair&);
  ~KeyPair();

  const PublicKey& public_key() const { return public_key_; }
  const KeySeed& seed() const { return seed_; }
  Signature Sign(ByteSpan message) const;
  Signature Sign(std::string_view message) const { return Sign(AsBytes(message)); }

 private:
  KeyPair() = default;
  KeySeed seed_;
  PublicKey public_key_;
  std::array<uint8_t, 64> secret_{};  // libsodium's expanded secret key
};

bool Verify(const PublicKey& key, ByteSpan message, const Signature& sig);
inline bool Verify(const PublicKey& key, std::string_view message, const Signature& sig) {
  return Verify(key, AsBytes(message), sig);
}

// Fills `out` from the OS's cryptographically secure RNG.
void SecureRandomBytes(std::span<uint8_t> out);

}  // namespace meshlearn

// BLAKE2b-256 (libsodium): the one hash of meshlearn. Content addresses, state hashes, Merkle
// trees, transaction ids all use it.
//
//   Hash256 h = Blake2b(AsBytes("abc"));
//   Hasher hs; hs.Update(a); hs.Update(b); Hash256 h2 = hs.Finish();
//   std::string s = h.ToHex();
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

struct Hash256 {
  static constexpr size_t kSize = 32;
  std::array<uint8_t, kSize> bytes{};

  std::string ToHex() const;
  // Short form for logs and progress lines: first 12 hex digits.
  std::string ShortHex() const;
  static Result<Hash256> FromHex(std::string_view hex, std::string_view what = "hash");
  static Hash256 FromSpan(ByteSpan b);  // REQUIRES: b.size() == 32
  ByteSpan span() const { return {bytes.data(), bytes.size()}; }
  bool IsZero() const;

  auto operator<=>(const Hash256&) const = default;
};

Hash256 Blake2b(ByteSpan data);
inline Hash256 Blake2b(std::string_view s) { return Blake2b(AsBytes(s)); }

// Streaming BLAKE2b-256. Not thread-safe; one per stream.
class Hasher {
 public:
  Hasher();
  // An optional personalization tag separates hash domains ("state", "tx", "block"). The tag is
  // hashed in first, length-prefixed, so two domains never collide.
  explicit Hasher(std::string_view domain);
  Hasher& Update(ByteSpan data);
  Hasher& Update(std::string_view s) { return Update(AsBytes(s)); }
  Hasher& UpdateU64(uint64_t v);  // little-endian
  Hasher& Update(const Hash256& h) { return Update(h.span()); }
  // REQUIRES: called once.
  Hash256 Finish();

 private:
  alignas(64) unsigned char state_[384];
  bool finished_ = false;
};

struct Hash256Less {
  bool operator()(const Hash256& a, const Hash256& b) const { return a < b; }
};

}  // namespace meshlearn

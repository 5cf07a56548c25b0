#include "meshlearn/base/hash.h"

#include <sodium.h>

#include <cstring>

#include "meshlearn/base/hex.h"
#include "sodium_init.h"

namespace meshlearn {
namespace {

using internal::InitSodium;

static_assert(sizeof(crypto_generichash_state) <= 384, "Hasher::state_ too small");

}  // namespace

std::string Hash256::ToHex() const { return HexEncode(span()); }
std::string Hash256::ShortHex() const { return ToHex().substr(0, 12); }

Result<Hash256> Hash256::FromHex(std::string_view hex, std::string_view what) {
  if (hex.size() != 2 * kSize) {
    return InvalidArgument(std::string(what) + ": expected 64 hex digits, got " +
                           std::to_string(hex.size()));
  }
  ML_ASSIGN_OR_RETURN(Bytes b, HexDecode(hex, what));
  return FromSpan(b);
}

Hash256 Hash256::FromSpan(ByteSpan b) {
  CHECK_EQ(b.size(), kSize);
  Hash256 h;
  std::memcpy(h.bytes.data(), b.data(), kSize);
  return h;
}

bool Hash256::IsZero() const {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

Hash256 Blake2b(ByteSpan data) {
  InitSodium();
  Hash256 h;
  crypto_generichash(h.bytes.data(), Hash256::kSize, data.data(), data.size(), nullptr, 0);
  return h;
}

Hasher::Hasher() {
  InitSodium();
  crypto_generichash_init(reinterpret_cast<crypto_generichash_state*>(state_), nullptr, 0,
                          Hash256::kSize);
}

Hasher::Hasher(std::string_view domain) : Hasher() {
  UpdateU64(domain.size());
  Update(domain);
}

Hasher& Hasher::Update(ByteSpan data) {
  CHECK(!finished_);
  crypto_generichash_update(reinterpret_cast<crypto_generichash_state*>(state_), data.data(),
                            data.size());
  return *this;
}

Hasher& Hasher::UpdateU64(uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return Update(ByteSpan(b, 8));
}

Hash256 Hasher::Finish() {
  CHECK(!finished_) << "Hasher::Finish called twice";
  finished_ = true;
  Hash256 h;
  crypto_generichash_final(reinterpret_cast<crypto_generichash_state*>(state_), h.bytes.data(),
                           Hash256::kSize);
  return h;
}

}  // namespace meshlearn

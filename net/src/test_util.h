// Helpers shared by net's tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/rng.h"

namespace meshlearn::net::test_util {

// The chunk size the blob tests use: small, so that a few KB of data make several chunks.
inline constexpr uint32_t kTestChunk = 4096;

// `n` bytes drawn from `seed`: the same bytes for the same seed.
inline Bytes RandomBytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng.NextU32());
  return b;
}

}  // namespace meshlearn::net::test_util

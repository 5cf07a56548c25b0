#include "meshlearn/base/rng.h"

#include "meshlearn/base/check.h"

namespace meshlearn {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

Rng::Rng(uint64_t seed, uint64_t stream)
    : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}, stream_(stream) {}

uint32_t Rng::NextU32() {
  if (used_ == 4) {
    block_ = Philox4x32({static_cast<uint32_t>(counter_), static_cast<uint32_t>(counter_ >> 32),
                         static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)},
                        key_);
    ++counter_;
    used_ = 0;
  }
  return block_[used_++];
}

uint64_t Rng::NextU64() {
  uint64_t lo = NextU32();
  uint64_t hi = NextU32();
  return hi << 32 | lo;
}

uint64_t Rng::Uniform(uint64_t n) {
  CHECK_GT(n, 0u);
  // Rejection sampling: draw until the value falls below the largest multiple of n.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = NextU64();
  } while (x >= limit);
  return x % n;
}

double Rng::UniformDouble() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

Rng Rng::Fork(uint64_t stream_id) {
  uint64_t seed = NextU64();
  return Rng(seed, stream_id);
}

}  // namespace meshlearn

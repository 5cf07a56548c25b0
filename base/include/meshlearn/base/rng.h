// Deterministic random numbers, the same on every platform, compiler and standard library
// (std::mt19937 is portable but std::uniform_int_distribution and friends are not).
//
// Philox4x32-10 is the counter-based generator: a pure function of (key, counter), so the
// n-th random number of a stream can be computed without generating the ones before it. The
// engine uses it for dropout masks and initialisation; protocol code uses Rng.
//
//   Rng rng(seed);            // sequential stream
//   uint64_t i = rng.Uniform(n);  // unbiased integer in [0, n)
//   double u = rng.UniformDouble();
//
// There is no Rng interface with a fake: an Rng is a pure function of (seed, stream), so a test
// that needs particular draws picks a seed, and production code and tests run the same generator.
#pragma once

#include <array>
#include <cstdint>

namespace meshlearn {

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Uniform float in [0, 1) built from the top 24 bits of a u32: exact, portable.
inline float U32ToUnitFloat(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// A sequential stream over Philox: key = seed, counter = (stream, position).
class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0);

  uint32_t NextU32();
  uint64_t NextU64();
  // Unbiased integer in [0, n). REQUIRES: n > 0.
  uint64_t Uniform(uint64_t n);
  // Uniform double in [0, 1) with 53 random bits.
  double UniformDouble();
  // Fork an independent stream (e.g. one per simulated node) deterministically.
  Rng Fork(uint64_t stream_id);

 private:
  std::array<uint32_t, 2> key_;
  uint64_t stream_;
  uint64_t counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

}  // namespace meshlearn

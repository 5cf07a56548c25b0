#include "meshlearn/protocol/state_blob.h"

#include <bit>
#include <cstring>
#include <string>

#include "meshlearn/base/check.h"

namespace meshlearn::protocol {
namespace {

static_assert(std::endian::native == std::endian::little, "meshlearn assumes little-endian");

void PutHeader(Bytes& out, const char* magic, uint64_t n) {
  out.insert(out.end(), magic, magic + kBlobMagicSize);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
}

void PutFloats(Bytes& out, std::span<const float> v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(float));
}

// Checks magic and count of a blob of `size` bytes whose first bytes are `blob` (at least its
// header, or all of it); returns n. `vectors` floats vectors of n follow the header.
Result<uint64_t> ReadHeader(ByteSpan blob, uint64_t size, const char* magic, const char* what,
                            int vectors, uint64_t expected_n) {
  const size_t header = kBlobMagicSize + 8;
  if (blob.size() < header) {
    return InvalidArgument(std::string(what) + " is truncated: " + std::to_string(blob.size()) +
                           " bytes, the header alone is " + std::to_string(header));
  }
  if (std::memcmp(blob.data(), magic, kBlobMagicSize) != 0) {
    return InvalidArgument(std::string(what) + " has a wrong magic (expected \"" + magic +
                           "\"): not a " + what);
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(blob[kBlobMagicSize + i]) << (8 * i);
  if (n > kMaxStateFloats) {
    return InvalidArgument(std::string(what) + " declares " + std::to_string(n) +
                           " floats, more than the limit " + std::to_string(kMaxStateFloats));
  }
  if (expected_n != 0 && n != expected_n) {
    return InvalidArgument(std::string(what) + " holds " + std::to_string(n) +
                           " floats but the model has " + std::to_string(expected_n) +
                           " parameters");
  }
  const uint64_t want = header + static_cast<uint64_t>(vectors) * n * sizeof(float);
  if (size < want) {
    return InvalidArgument(std::string(what) + " is truncated: " + std::to_string(size) +
                           " bytes, " + std::to_string(want) + " expected for " +
                           std::to_string(n) + " floats");
  }
  if (size > want) {
    return InvalidArgument(std::string(what) + " has " + std::to_string(size - want) +
                           " trailing bytes after its " + std::to_string(n) + " floats");
  }
  return n;
}

std::vector<float> ReadFloats(ByteSpan blob, size_t offset, uint64_t n) {
  std::vector<float> v(n);
  if (n > 0) std::memcpy(v.data(), blob.data() + offset, n * sizeof(float));
  return v;
}

}  // namespace

Bytes EncodeGlobalState(std::span<const float> weights, std::span<const float> momentum) {
  CHECK_EQ(weights.size(), momentum.size());
  Bytes out;
  out.reserve(kBlobMagicSize + 8 + 8 * weights.size());
  PutHeader(out, kGlobalStateMagic, weights.size());
  PutFloats(out, weights);
  PutFloats(out, momentum);
  return out;
}

Result<GlobalState> DecodeGlobalState(ByteSpan blob, uint64_t expected_n) {
  ML_ASSIGN_OR_RETURN(uint64_t n, GlobalStateCount(blob, blob.size(), expected_n));
  GlobalState s;
  const size_t header = kBlobMagicSize + 8;
  s.weights = ReadFloats(blob, header, n);
  s.momentum = ReadFloats(blob, header + n * sizeof(float), n);
  return s;
}

Result<uint64_t> GlobalStateCount(ByteSpan head, uint64_t blob_size, uint64_t expected_n) {
  return ReadHeader(head, blob_size, kGlobalStateMagic, "global state blob", 2, expected_n);
}

Bytes EncodeDelta(std::span<const float> delta) {
  Bytes out;
  out.reserve(kBlobMagicSize + 8 + 4 * delta.size());
  PutHeader(out, kDeltaMagic, delta.size());
  const ByteSpan floats = DeltaFloatBytes(delta);
  out.insert(out.end(), floats.begin(), floats.end());
  return out;
}

Bytes EncodeDeltaHeader(uint64_t n) {
  Bytes out;
  PutHeader(out, kDeltaMagic, n);
  return out;
}

ByteSpan DeltaFloatBytes(std::span<const float> floats) {
  // Little-endian float32, the blobs' format (the static_assert above).
  return ByteSpan(reinterpret_cast<const uint8_t*>(floats.data()), floats.size() * sizeof(float));
}

Result<std::vector<float>> DecodeDelta(ByteSpan blob, uint64_t expected_n) {
  ML_ASSIGN_OR_RETURN(uint64_t n,
                      ReadHeader(blob, blob.size(), kDeltaMagic, "delta blob", 1, expected_n));
  return ReadFloats(blob, kBlobMagicSize + 8, n);
}

}  // namespace meshlearn::protocol

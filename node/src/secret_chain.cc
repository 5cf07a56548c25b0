#include "meshlearn/node/secret_chain.h"

#include "meshlearn/base/check.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::node {

Hash256 SecretChainSeed(const KeySeed& key_seed, uint64_t epoch) {
  return Hasher("meshlearn.node.secret_chain.v1")
      .Update(ByteSpan(key_seed.bytes.data(), key_seed.bytes.size()))
      .UpdateU64(epoch)
      .Finish();
}

SecretChain::SecretChain(const Hash256& seed) {
  constexpr uint64_t kLength = protocol::kSecretChainLength;
  static_assert(kLength % kStride == 0, "the chain length must be a multiple of the stride");
  marks_.resize(kLength / kStride + 1);
  // x_L as protocol::SecretChainElement grows it, then x_{i-1} = SecretCommitment(x_i).
  Hash256 x = protocol::SecretChainElement(seed, kLength);
  marks_.back() = x;
  for (uint64_t i = kLength; i > 0; --i) {
    x = protocol::SecretCommitment(x);
    if ((i - 1) % kStride == 0) marks_[(i - 1) / kStride] = x;
  }
}

Hash256 SecretChain::Element(uint64_t index) const {
  CHECK_LE(index, protocol::kSecretChainLength);
  uint64_t m = (index + kStride - 1) / kStride;
  Hash256 x = marks_[m];
  for (uint64_t i = m * kStride; i > index; --i) x = protocol::SecretCommitment(x);
  return x;
}

}  // namespace meshlearn::node

#include "meshlearn/node/secret_chain.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <utility>

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

std::shared_ptr<const SecretChain> SecretChain::Shared(const Hash256& seed) {
  static std::mutex mu;
  static std::deque<std::pair<Hash256, std::shared_ptr<const SecretChain>>> shared;  // oldest first
  auto find = [&]() {
    return std::find_if(shared.begin(), shared.end(),
                        [&](const auto& e) { return e.first == seed; });
  };
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = find(); it != shared.end()) return it->second;
  }
  // Built outside the lock: another thread may build the same chain meanwhile, and the first
  // one kept is the one shared.
  auto chain = std::make_shared<const SecretChain>(seed);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = find(); it != shared.end()) return it->second;
  if (shared.size() == kShared) shared.pop_front();
  shared.emplace_back(seed, chain);
  return chain;
}

Hash256 SecretChain::Element(uint64_t index) const {
  CHECK_LE(index, protocol::kSecretChainLength);
  uint64_t m = (index + kStride - 1) / kStride;
  Hash256 x = marks_[m];
  for (uint64_t i = m * kStride; i > index; --i) x = protocol::SecretCommitment(x);
  return x;
}

}  // namespace meshlearn::node

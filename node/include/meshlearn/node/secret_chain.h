// A solver's forced-error secrets (docs/verification.md, "Forced errors"): the hash chain
// x_L .. x_0 of protocol/verification.h grown from a seed only this node knows. The node
// registers the head x_0 (RegisterNodeTx::secret_head); its i-th committed unit uses x_i, which it
// reveals in the unit's reveal window.
//
// The seed comes from the node's private key seed and a registration epoch, through a
// domain-separated hash: nobody else can compute it, and every (re-)registration starts a chain
// whose elements were never revealed (a rejoining node must not reuse secrets it already
// published).
//
//   SecretChain chain(SecretChainSeed(key.seed(), epoch));   // ~kSecretChainLength hashes, once
//   tx.secret_head = chain.head();
//   Hash256 x = chain.Element(secret_index);                  // at most kStride hashes
//
// Element(i) equals protocol::SecretChainElement(seed, i), which costs kSecretChainLength - i
// hashes; the chain keeps every kStride-th element, so an element costs at most kStride - 1.
// Thread-compatible; Shared is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"

namespace meshlearn::node {

// The private seed of the node's secret chain for registration `epoch`.
Hash256 SecretChainSeed(const KeySeed& key_seed, uint64_t epoch);

class SecretChain {
 public:
  static constexpr uint64_t kStride = 256;

  explicit SecretChain(const Hash256& seed);

  // The chain of `seed`, built once per process and shared (thread-safe): a node restarted in
  // the same process (the simulations: chaos_test.cc restarts nodes hundreds of times) loads its
  // chain again at each restart, and its kSecretChainLength hashes were most of such a restart's
  // CPU time. Keeps the kShared chains last asked for (8 KiB each).
  static constexpr size_t kShared = 64;
  static std::shared_ptr<const SecretChain> Shared(const Hash256& seed);

  const Hash256& head() const { return marks_.front(); }
  // x_index. REQUIRES: index <= protocol::kSecretChainLength.
  Hash256 Element(uint64_t index) const;

 private:
  std::vector<Hash256> marks_;  // marks_[m] = x_{m * kStride}
};

}  // namespace meshlearn::node

// Binary Merkle tree over a list of 32-byte hashes, with inclusion proofs.
//
// Leaves and inner nodes are hashed in separate domains (0x00 / 0x01 prefix) so a leaf can never
// be passed off as an inner node. An odd node at the end of a level is promoted unchanged. The
// root of an empty list is Blake2b("") in the leaf domain, so it is well defined.
//
//   Hash256 root = MerkleRoot(leaves);
//   MerkleProof p = MerkleProve(leaves, 3);
//   bool ok = MerkleVerify(root, leaves[3], p);
#pragma once

#include <cstdint>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

struct MerkleProof {
  uint64_t index = 0;       // position of the leaf
  uint64_t leaf_count = 0;  // number of leaves in the tree
  std::vector<Hash256> siblings;  // bottom-up; levels where the node was promoted have none
  bool operator==(const MerkleProof&) const = default;
};

Hash256 MerkleLeafHash(const Hash256& leaf);
// The parent of two nodes (for trees built level by level elsewhere, e.g. engine::DataTree).
Hash256 MerkleInnerHash(const Hash256& left, const Hash256& right);
Hash256 MerkleRoot(const std::vector<Hash256>& leaves);

// REQUIRES: index < leaves.size().
MerkleProof MerkleProve(const std::vector<Hash256>& leaves, uint64_t index);

// True iff `proof` shows that `leaf` sits at proof.index in a tree with root `root`.
bool MerkleVerify(const Hash256& root, const Hash256& leaf, const MerkleProof& proof);

}  // namespace meshlearn

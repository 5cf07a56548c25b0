#include "meshlearn/base/merkle.h"

#include <gtest/gtest.h>

namespace meshlearn {
namespace {

std::vector<Hash256> Leaves(int n) {
  std::vector<Hash256> v;
  for (int i = 0; i < n; ++i) v.push_back(Blake2b("leaf" + std::to_string(i)));
  return v;
}

TEST(Merkle, EveryProofVerifiesForManySizes) {
  for (int n = 1; n <= 17; ++n) {
    std::vector<Hash256> leaves = Leaves(n);
    Hash256 root = MerkleRoot(leaves);
    for (int i = 0; i < n; ++i) {
      MerkleProof p = MerkleProve(leaves, i);
      EXPECT_TRUE(MerkleVerify(root, leaves[i], p)) << "n=" << n << " i=" << i;
    }
  }
}

TEST(Merkle, RootDependsOnOrderAndContent) {
  std::vector<Hash256> a = Leaves(4);
  std::vector<Hash256> b = a;
  std::swap(b[0], b[1]);
  EXPECT_NE(MerkleRoot(a), MerkleRoot(b));
  EXPECT_NE(MerkleRoot(Leaves(3)), MerkleRoot(Leaves(4)));
  EXPECT_NE(MerkleRoot({}), MerkleRoot(Leaves(1)));
}

TEST(Merkle, TamperedProofsFail) {
  std::vector<Hash256> leaves = Leaves(9);
  Hash256 root = MerkleRoot(leaves);
  MerkleProof p = MerkleProve(leaves, 5);
  EXPECT_FALSE(MerkleVerify(root, leaves[4], p));  // wrong leaf
  MerkleProof wrong_index = p;
  wrong_index.index = 4;
  EXPECT_FALSE(MerkleVerify(root, leaves[5], wrong_index));
  MerkleProof flipped = p;
  flipped.siblings[0].bytes[0] ^= 1;
  EXPECT_FALSE(MerkleVerify(root, leaves[5], flipped));
  MerkleProof extra = p;
  extra.siblings.push_back(leaves[0]);
  EXPECT_FALSE(MerkleVerify(root, leaves[5], extra));
  MerkleProof short_proof = p;
  short_proof.siblings.pop_back();
  EXPECT_FALSE(MerkleVerify(root, leaves[5], short_proof));
  MerkleProof out_of_range = p;
  out_of_range.index = 9;
  EXPECT_FALSE(MerkleVerify(root, leaves[5], out_of_range));
  Hash256 other_root = root;
  other_root.bytes[31] ^= 0x80;
  EXPECT_FALSE(MerkleVerify(other_root, leaves[5], p));
}

TEST(Merkle, LeafCannotPoseAsInnerNode) {
  // A two-leaf tree's root must not be reproducible as a one-leaf tree whose leaf is the
  // concatenation hash: domain separation between leaves and inner nodes.
  std::vector<Hash256> two = Leaves(2);
  Hash256 root = MerkleRoot(two);
  EXPECT_NE(MerkleRoot({root}), root);
}

}  // namespace
}  // namespace meshlearn

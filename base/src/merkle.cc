#include "meshlearn/base/merkle.h"

namespace meshlearn {
Hash256 MerkleInnerHash(const Hash256& left, const Hash256& right) {
  uint8_t tag = 0x01;
  Hasher h;
  h.Update(ByteSpan(&tag, 1)).Update(left).Update(right);
  return h.Finish();
}

namespace {

std::vector<Hash256> NextLevel(const std::vector<Hash256>& level) {
  std::vector<Hash256> next;
  next.reserve((level.size() + 1) / 2);
  for (size_t i = 0; i + 1 < level.size(); i += 2) {
    next.push_back(MerkleInnerHash(level[i], level[i + 1]));
  }
  if (level.size() % 2 == 1) next.push_back(level.back());  // promoted unchanged
  return next;
}

}  // namespace

Hash256 MerkleLeafHash(const Hash256& leaf) {
  uint8_t tag = 0x00;
  Hasher h;
  h.Update(ByteSpan(&tag, 1)).Update(leaf);
  return h.Finish();
}

Hash256 MerkleRoot(const std::vector<Hash256>& leaves) {
  if (leaves.empty()) {
    uint8_t tag = 0x00;
    return Blake2b(ByteSpan(&tag, 1));
  }
  std::vector<Hash256> level;
  level.reserve(leaves.size());
  for (const Hash256& l : leaves) level.push_back(MerkleLeafHash(l));
  while (level.size() > 1) level = NextLevel(level);
  return level[0];
}

MerkleProof MerkleProve(const std::vector<Hash256>& leaves, uint64_t index) {
  CHECK_LT(index, leaves.size());
  MerkleProof proof;
  proof.index = index;
  proof.leaf_count = leaves.size();
  std::vector<Hash256> level;
  for (const Hash256& l : leaves) level.push_back(MerkleLeafHash(l));
  uint64_t pos = index;
  while (level.size() > 1) {
    uint64_t sibling = pos ^ 1;
    if (sibling < level.size()) proof.siblings.push_back(level[sibling]);
    level = NextLevel(level);
    pos /= 2;
  }
  return proof;
}

bool MerkleVerify(const Hash256& root, const Hash256& leaf, const MerkleProof& proof) {
  if (proof.leaf_count == 0 || proof.index >= proof.leaf_count) return false;
  Hash256 node = MerkleLeafHash(leaf);
  uint64_t pos = proof.index;
  uint64_t width = proof.leaf_count;
  size_t used = 0;
  while (width > 1) {
    uint64_t sibling = pos ^ 1;
    if (sibling < width) {
      if (used >= proof.siblings.size()) return false;
      const Hash256& s = proof.siblings[used++];
      node = (pos % 2 == 0) ? MerkleInnerHash(node, s) : MerkleInnerHash(s, node);
    }
    pos /= 2;
    width = (width + 1) / 2;
  }
  return used == proof.siblings.size() && node == root;
}

}  // namespace meshlearn

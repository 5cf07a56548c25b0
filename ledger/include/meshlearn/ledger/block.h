// Blocks and receipts.
//
// A block is produced by the sequencer (Chain::ProduceBlock), which signs BlockHash(header).
// The header commits to the transactions (MerkleRoot over TxIds, in block order), to their
// receipts (MerkleRoot over ReceiptHashes) and to the state after the block. A follower
// re-executes the transactions and refuses the block if any of the three roots differ.
//
// Every transaction in a block was admissible (valid signature, chain id, the sender's next
// nonce, size); it either succeeded or failed while executing. A failed transaction has a
// receipt with the reason, its nonce is consumed, and nothing else changes (no fee either).
//
// Encoding (canonical, base/encoding.h):
//   header: u8 version | string chain_id | u64 height | hash prev_hash | i64 time_ms |
//           hash tx_root | hash state_hash | hash receipts_root | pubkey sequencer
//   block:  header | signature | u32 n | n x bytes(EncodeTx) | u32 n | n x receipt
//   receipt: hash tx_id | u64 height | u32 index | u8 ok | u8 code | string reason
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

inline constexpr uint32_t kMaxTxsPerBlock = 10000;
inline constexpr size_t kMaxBlockBytes = 64u << 20;
inline constexpr uint32_t kMaxReasonLength = 512;

struct BlockHeader {
  std::string chain_id;
  uint64_t height = 0;  // the first block after genesis is 1
  Hash256 prev_hash;    // BlockHash of the previous header; GenesisHash for block 1
  int64_t time_ms = 0;  // set by the sequencer; never decreases
  Hash256 tx_root;
  Hash256 state_hash;  // Chain state after this block
  Hash256 receipts_root;
  PublicKey sequencer;
  bool operator==(const BlockHeader&) const = default;
};

struct Receipt {
  Hash256 tx_id;
  uint64_t height = 0;
  uint32_t index = 0;  // position in the block
  bool ok = true;
  StatusCode code = StatusCode::kOk;
  std::string reason;  // empty when ok
  bool operator==(const Receipt&) const = default;
};

struct Block {
  BlockHeader header;
  Signature signature;  // by header.sequencer over BlockHash(header)
  std::vector<Transaction> txs;
  std::vector<Receipt> receipts;  // one per tx, same order
  bool operator==(const Block&) const = default;
};

Bytes EncodeHeader(const BlockHeader& h);
Hash256 BlockHash(const BlockHeader& h);  // domain "meshlearn.block.v1"
Hash256 ReceiptHash(const Receipt& r);
Hash256 TxRoot(const std::vector<Transaction>& txs);
Hash256 ReceiptsRoot(const std::vector<Receipt>& receipts);

void EncodeReceipt(Encoder& e, const Receipt& r);
Status DecodeReceipt(Decoder& d, Receipt* r);

Bytes EncodeBlock(const Block& b);
// Refuses oversize, truncated, trailing input and malformed transactions. Checks the shape
// (one receipt per tx) but not signatures or roots: that is Chain::ApplyBlock's job.
Result<Block> DecodeBlock(ByteSpan wire);

bool VerifyBlockSignature(const Block& b);

nlohmann::json HeaderToJson(const BlockHeader& h);  // includes "hash"
nlohmann::json ReceiptToJson(const Receipt& r);
nlohmann::json BlockToJson(const Block& b);  // header, signature, txs (TxToJson), receipts

}  // namespace meshlearn::ledger

#include "meshlearn/ledger/block.h"

#include "execute.h"
#include "fields.h"
#include "meshlearn/base/merkle.h"

namespace meshlearn::ledger {

namespace {

constexpr uint8_t kBlockVersion = 1;

void PutHeader(Encoder& e, const BlockHeader& h) {
  e.PutU8(kBlockVersion).PutString(h.chain_id).PutU64(h.height).PutHash(h.prev_hash);
  e.PutI64(h.time_ms).PutHash(h.tx_root).PutHash(h.state_hash).PutHash(h.receipts_root);
  e.PutPublicKey(h.sequencer);
}

Status GetHeader(Decoder& d, BlockHeader* h) {
  uint8_t version;
  ML_RETURN_IF_ERROR(d.GetU8(&version, "version"));
  if (version != kBlockVersion) {
    return InvalidArgument("block: unsupported version " + std::to_string(version));
  }
  ML_RETURN_IF_ERROR(d.GetString(&h->chain_id, "chain_id", kMaxChainIdLength));
  if (!internal::IsValidUtf8(h->chain_id)) {
    return InvalidArgument("block: chain_id is not valid UTF-8");
  }
  ML_RETURN_IF_ERROR(d.GetU64(&h->height, "height"));
  ML_RETURN_IF_ERROR(d.GetHash(&h->prev_hash, "prev_hash"));
  ML_RETURN_IF_ERROR(d.GetI64(&h->time_ms, "time_ms"));
  ML_RETURN_IF_ERROR(d.GetHash(&h->tx_root, "tx_root"));
  ML_RETURN_IF_ERROR(d.GetHash(&h->state_hash, "state_hash"));
  ML_RETURN_IF_ERROR(d.GetHash(&h->receipts_root, "receipts_root"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&h->sequencer, "sequencer"));
  return Status::Ok();
}

}  // namespace

Bytes EncodeHeader(const BlockHeader& h) {
  Encoder e;
  PutHeader(e, h);
  return e.Take();
}

Hash256 BlockHash(const BlockHeader& h) {
  Hasher hs("meshlearn.block.v1");
  hs.Update(EncodeHeader(h));
  return hs.Finish();
}

void EncodeReceipt(Encoder& e, const Receipt& r) {
  e.PutHash(r.tx_id).PutU64(r.height).PutU32(r.index).PutBool(r.ok);
  e.PutU8(static_cast<uint8_t>(r.code)).PutString(r.reason);
}

Status DecodeReceipt(Decoder& d, Receipt* r) {
  ML_RETURN_IF_ERROR(d.GetHash(&r->tx_id, "receipt.tx_id"));
  ML_RETURN_IF_ERROR(d.GetU64(&r->height, "receipt.height"));
  ML_RETURN_IF_ERROR(d.GetU32(&r->index, "receipt.index"));
  ML_RETURN_IF_ERROR(d.GetBool(&r->ok, "receipt.ok"));
  uint8_t code;
  ML_RETURN_IF_ERROR(d.GetU8(&code, "receipt.code"));
  if (code > static_cast<uint8_t>(StatusCode::kInternal)) {
    return InvalidArgument("receipt: unknown status code " + std::to_string(code));
  }
  r->code = static_cast<StatusCode>(code);
  if (r->ok != (r->code == StatusCode::kOk)) {
    return InvalidArgument("receipt: ok flag and status code disagree");
  }
  ML_RETURN_IF_ERROR(d.GetString(&r->reason, "receipt.reason", kMaxReasonLength));
  if (!internal::IsValidUtf8(r->reason)) {
    return InvalidArgument("receipt: reason is not valid UTF-8");
  }
  return Status::Ok();
}

Hash256 ReceiptHash(const Receipt& r) {
  Encoder e;
  EncodeReceipt(e, r);
  Hasher h("meshlearn.receipt.v1");
  h.Update(e.bytes());
  return h.Finish();
}

Hash256 TxRoot(const std::vector<Transaction>& txs) {
  std::vector<Hash256> ids;
  ids.reserve(txs.size());
  for (const Transaction& tx : txs) ids.push_back(TxId(tx));
  return MerkleRoot(ids);
}

Hash256 ReceiptsRoot(const std::vector<Receipt>& receipts) {
  std::vector<Hash256> hs;
  hs.reserve(receipts.size());
  for (const Receipt& r : receipts) hs.push_back(ReceiptHash(r));
  return MerkleRoot(hs);
}

Bytes EncodeBlock(const Block& b) {
  std::vector<Bytes> wires;
  std::vector<ByteSpan> spans;
  wires.reserve(b.txs.size());
  for (const Transaction& tx : b.txs) {
    wires.push_back(EncodeTx(tx));
    spans.push_back(wires.back());
  }
  return EncodeBlockWithTxWires(b, spans);
}

Bytes EncodeBlockWithTxWires(const Block& b, const std::vector<ByteSpan>& tx_wires) {
  DCHECK(tx_wires.size() == b.txs.size());
  Encoder e;
  PutHeader(e, b.header);
  e.PutSignature(b.signature);
  e.PutU32(static_cast<uint32_t>(tx_wires.size()));
  for (ByteSpan w : tx_wires) e.PutBytes(w);
  e.PutU32(static_cast<uint32_t>(b.receipts.size()));
  for (const Receipt& r : b.receipts) EncodeReceipt(e, r);
  return e.Take();
}

Result<Block> DecodeBlock(ByteSpan wire) {
  if (wire.size() > kMaxBlockBytes) {
    return ResourceExhausted("block: " + std::to_string(wire.size()) +
                             " bytes, over the limit of " + std::to_string(kMaxBlockBytes));
  }
  Decoder d(wire, "block");
  Block b;
  ML_RETURN_IF_ERROR(GetHeader(d, &b.header));
  ML_RETURN_IF_ERROR(d.GetSignature(&b.signature, "signature"));
  uint32_t n;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "txs", kMaxTxsPerBlock, 4));
  b.txs.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    Bytes raw;
    ML_RETURN_IF_ERROR(d.GetBytes(&raw, "tx", static_cast<uint32_t>(kMaxLargeTxBytes)));
    auto tx = DecodeTx(raw);
    if (!tx.ok()) return tx.status().WithPrefix("block: tx " + std::to_string(i));
    b.txs.push_back(std::move(*tx));
  }
  uint32_t m;
  ML_RETURN_IF_ERROR(d.GetCount(&m, "receipts", kMaxTxsPerBlock, 50));
  if (m != n) {
    return InvalidArgument("block: " + std::to_string(n) + " transactions but " +
                           std::to_string(m) + " receipts");
  }
  b.receipts.resize(m);
  for (Receipt& r : b.receipts) ML_RETURN_IF_ERROR(DecodeReceipt(d, &r));
  ML_RETURN_IF_ERROR(d.Finish());
  return b;
}

bool VerifyBlockSignature(const Block& b) {
  Hash256 h = BlockHash(b.header);
  return Verify(b.header.sequencer, h.span(), b.signature);
}

nlohmann::json HeaderToJson(const BlockHeader& h) {
  return {{"hash", BlockHash(h).ToHex()},
          {"chain_id", h.chain_id},
          {"height", h.height},
          {"prev_hash", h.prev_hash.ToHex()},
          {"time_ms", h.time_ms},
          {"tx_root", h.tx_root.ToHex()},
          {"state_hash", h.state_hash.ToHex()},
          {"receipts_root", h.receipts_root.ToHex()},
          {"sequencer", h.sequencer.ToHex()}};
}

nlohmann::json ReceiptToJson(const Receipt& r) {
  return {{"tx_id", r.tx_id.ToHex()},
          {"height", r.height},
          {"index", r.index},
          {"ok", r.ok},
          {"code", std::string(StatusCodeName(r.code))},
          {"reason", r.reason}};
}

nlohmann::json BlockToJson(const Block& b) {
  nlohmann::json txs = nlohmann::json::array();
  for (const Transaction& tx : b.txs) txs.push_back(TxToJson(tx));
  nlohmann::json receipts = nlohmann::json::array();
  for (const Receipt& r : b.receipts) receipts.push_back(ReceiptToJson(r));
  return {{"header", HeaderToJson(b.header)},
          {"signature", b.signature.ToHex()},
          {"txs", std::move(txs)},
          {"receipts", std::move(receipts)}};
}

}  // namespace meshlearn::ledger

#include "meshlearn/ledger/tx.h"

#include <bit>

#include "fields.h"
#include "meshlearn/base/encoding.h"
#include "witness_codec.h"

namespace meshlearn::ledger {

namespace {

// Everything but the signature.
void EncodeUnsigned(Encoder& e, const Transaction& tx) {
  e.PutU8(kTxVersion).PutString(tx.chain_id).PutPublicKey(tx.sender).PutU64(tx.nonce);
  e.PutU64(tx.fee).PutU16(static_cast<uint16_t>(PayloadType(tx.payload)));
  std::visit([&](const auto& p) { std::decay_t<decltype(p)>::Visit(p, internal::FieldEncoder{e}); },
             tx.payload);
}

template <typename T>
Status DecodePayloadAs(Decoder& d, TxPayload* out) {
  T p;
  internal::FieldDecoder fd{d, Status::Ok()};
  T::Visit(p, fd);
  ML_RETURN_IF_ERROR(fd.status);
  *out = std::move(p);
  return Status::Ok();
}

Status DecodePayload(Decoder& d, uint16_t tag, TxPayload* out) {
  switch (tag) {
#define ML_TX_DECODE_CASE_(Name, tag, module) \
  case tag:                                   \
    return DecodePayloadAs<Name##Tx>(d, out);
    MESHLEARN_LEDGER_TX_TYPES(ML_TX_DECODE_CASE_)
#undef ML_TX_DECODE_CASE_
  }
  return InvalidArgument("transaction: unknown type tag " + std::to_string(tag));
}

template <typename T>
Result<TxPayload> PayloadFromJsonAs(const nlohmann::json& j) {
  T p;
  internal::FieldFromJson r{j, std::string(TxTypeName(T::kType)) + " payload", Status::Ok(), {}};
  T::Visit(p, r);
  r.CheckNoUnknownKeys({"type"});
  if (!r.status.ok()) return r.status;
  return TxPayload(std::move(p));
}

}  // namespace

std::string_view TxTypeName(TxType t) {
  switch (t) {
#define ML_TX_NAME_CASE_(Name, tag, module) \
  case TxType::k##Name:                     \
    return #Name;
    MESHLEARN_LEDGER_TX_TYPES(ML_TX_NAME_CASE_)
#undef ML_TX_NAME_CASE_
  }
  return "Unknown";
}

Result<TxType> TxTypeFromName(std::string_view name) {
#define ML_TX_FROM_NAME_(Name, tag, module) \
  if (name == #Name) return TxType::k##Name;
  MESHLEARN_LEDGER_TX_TYPES(ML_TX_FROM_NAME_)
#undef ML_TX_FROM_NAME_
  std::string known;
#define ML_TX_LIST_NAME_(Name, tag, module) \
  known += (known.empty() ? "" : ", ") + std::string(#Name);
  MESHLEARN_LEDGER_TX_TYPES(ML_TX_LIST_NAME_)
#undef ML_TX_LIST_NAME_
  return InvalidArgument("unknown transaction type '" + std::string(name) + "' (known: " + known +
                         ")");
}

TxType PayloadType(const TxPayload& p) {
  return std::visit([](const auto& v) { return std::decay_t<decltype(v)>::kType; }, p);
}

size_t MaxTxBytes(TxType t) {
  if (t == TxType::kRefereeTile) return kMaxTileTxBytes;
  return t == TxType::kRefereeStep || t == TxType::kRefereeStageStep || t == TxType::kProveResult ||
                 t == TxType::kProveFraud || t == TxType::kProveMerits ||
                 t == TxType::kRevealSecret || t == TxType::kServeStageEvidence
             ? kMaxLargeTxBytes
             : kMaxTxBytes;
}

namespace {
// One proof's witness id: the fields that say what it shows, the witness by its hash.
Hash256 WitnessIdOf(TxType type, const Hash256& task_id, uint32_t index, uint32_t segment,
                    ByteSpan witness) {
  return Hasher("meshlearn.proof_witness.v1")
      .UpdateU64(static_cast<uint64_t>(type))
      .Update(task_id)
      .UpdateU64(index)
      .UpdateU64(segment)
      .Update(Blake2b(witness))
      .Finish();
}
}  // namespace

Hash256 ProofWitnessId(const ProveFraudTx& tx) {
  return WitnessIdOf(tx.kType, tx.task_id, tx.index, tx.segment, tx.witness.bytes);
}
Hash256 ProofWitnessId(const ProveResultTx& tx) {
  return WitnessIdOf(tx.kType, tx.task_id, tx.index, 0, tx.witness.bytes);
}
Hash256 ProofWitnessId(const ProveMeritsTx& tx) {
  return WitnessIdOf(tx.kType, tx.task_id, tx.index, tx.segment, tx.witness.bytes);
}

std::optional<Hash256> ProofWitnessIdOf(const TxPayload& payload) {
  if (const auto* f = std::get_if<ProveFraudTx>(&payload)) return ProofWitnessId(*f);
  if (const auto* r = std::get_if<ProveResultTx>(&payload)) return ProofWitnessId(*r);
  if (const auto* m = std::get_if<ProveMeritsTx>(&payload)) return ProofWitnessId(*m);
  return std::nullopt;
}

Hash256 ProofCommitment(const Hash256& witness_id, const PublicKey& prover) {
  return Hasher("meshlearn.proof_commitment.v1").Update(witness_id).Update(prover.span()).Finish();
}

namespace {

constexpr std::string_view kWitnessMagic = "meshlearn.step_witness.v1";
constexpr std::string_view kResultWitnessMagic = "meshlearn.result_witness.v1";
constexpr std::string_view kSegmentWitnessMagic = "meshlearn.segment_witness.v1";
// A token task's segment witness: v1's fields, then its steps' token pages.
constexpr std::string_view kSegmentWitnessMagicPages = "meshlearn.segment_witness.v2";
// A witness's size (at most kMaxWitnessBytes: only small models are refereed on chain) and its
// leading magic string.
// `alt`, when given, is a second magic the witness may start with (a later version); *got_alt
// says which it was.
Status ReadWitnessHeader(Decoder& d, size_t size, std::string_view magic, const char* what,
                         std::string_view alt = {}, bool* got_alt = nullptr) {
  if (size > kMaxWitnessBytes) {
    return InvalidArgument(std::string(what) + ": " + std::to_string(size) +
                           " bytes, over the limit of " + std::to_string(kMaxWitnessBytes) +
                           " (only small models are refereed on chain)");
  }
  std::string got;
  ML_RETURN_IF_ERROR(d.GetString(&got, "magic", 64));
  if (got_alt != nullptr) *got_alt = !alt.empty() && got == alt;
  if (got != magic && (alt.empty() || got != alt)) {
    return InvalidArgument(std::string(what) + ": starts with '" + got + "', expected '" +
                           std::string(magic) + "'" +
                           (alt.empty() ? "" : " or '" + std::string(alt) + "'"));
  }
  return Status::Ok();
}

}  // namespace

Status GetWitnessMagic(Decoder& d, std::string_view what, std::string_view magic,
                       std::string_view hint) {
  std::string got;
  ML_RETURN_IF_ERROR(d.GetString(&got, "magic", 64));
  if (got != magic) {
    return InvalidArgument(std::string(what) + ": starts with '" + got + "', expected '" +
                           std::string(magic) + "'" + std::string(hint));
  }
  return Status::Ok();
}

bool HasWitnessMagic(ByteSpan bytes, std::string_view magic) {
  Decoder d(bytes, "witness");
  std::string got;
  return d.GetString(&got, "magic", 64).ok() && got == magic;
}

void PutWitnessFloats(Encoder& e, const std::vector<float>& v) {
  e.PutU32(static_cast<uint32_t>(v.size()));
  // Every float as PutF32 writes it (its IEEE-754 bits, little-endian), in one copy: on a
  // little-endian machine those are its bytes in memory. A witness holds up to 64K floats.
  static_assert(std::endian::native == std::endian::little,
                "meshlearn encodes floats little-endian");
  e.PutRaw(ByteSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)));
}
Status GetWitnessFloats(Decoder& d, std::vector<float>* v, std::string_view field) {
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, field, static_cast<uint32_t>(kMaxWitnessBytes / 4), 4));
  v->resize(n);
  for (float& f : *v) ML_RETURN_IF_ERROR(d.GetF32(&f, field));
  return Status::Ok();
}

void PutMerkleProof(Encoder& e, const MerkleProof& p) {
  e.PutU64(p.index).PutU64(p.leaf_count).PutU32(static_cast<uint32_t>(p.siblings.size()));
  for (const Hash256& h : p.siblings) e.PutHash(h);
}
Status GetMerkleProof(Decoder& d, MerkleProof* p, std::string_view field) {
  ML_RETURN_IF_ERROR(d.GetU64(&p->index, field));
  ML_RETURN_IF_ERROR(d.GetU64(&p->leaf_count, field));
  uint32_t depth = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&depth, field, kMaxWitnessProofDepth, 32));
  p->siblings.resize(depth);
  for (Hash256& h : p->siblings) ML_RETURN_IF_ERROR(d.GetHash(&h, field));
  return Status::Ok();
}

void PutWitnessExamples(Encoder& e, const std::vector<StepWitnessExample>& examples) {
  e.PutU32(static_cast<uint32_t>(examples.size()));
  for (const StepWitnessExample& x : examples) {
    e.PutU64(x.index);
    PutWitnessFloats(e, x.x);
    e.PutU32(static_cast<uint32_t>(x.y));
    PutMerkleProof(e, x.proof);
  }
}
Status GetWitnessExamples(Decoder& d, std::vector<StepWitnessExample>* examples) {
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "examples", kMaxWitnessItems, 28));
  examples->resize(n);
  for (StepWitnessExample& x : *examples) {
    ML_RETURN_IF_ERROR(d.GetU64(&x.index, "example.index"));
    ML_RETURN_IF_ERROR(GetWitnessFloats(d, &x.x, "example.x"));
    uint32_t y = 0;
    ML_RETURN_IF_ERROR(d.GetU32(&y, "example.y"));
    x.y = static_cast<int32_t>(y);
    ML_RETURN_IF_ERROR(GetMerkleProof(d, &x.proof, "example.proof"));
  }
  return Status::Ok();
}

void PutWitnessPages(Encoder& e, const std::vector<TileWitnessPage>& pages) {
  e.PutU32(static_cast<uint32_t>(pages.size()));
  for (const TileWitnessPage& p : pages) {
    e.PutU64(p.page).PutU32(static_cast<uint32_t>(p.tokens.size()));
    for (int32_t t : p.tokens) e.PutU32(static_cast<uint32_t>(t));
    PutMerkleProof(e, p.proof);
  }
}
Status GetWitnessPages(Decoder& d, std::vector<TileWitnessPage>* pages) {
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "pages", kMaxWitnessItems, 24));
  pages->resize(n);
  for (TileWitnessPage& p : *pages) {
    ML_RETURN_IF_ERROR(d.GetU64(&p.page, "page.index"));
    uint32_t k = 0;
    ML_RETURN_IF_ERROR(
        d.GetCount(&k, "page.tokens", static_cast<uint32_t>(kMaxWitnessBytes / 4), 4));
    p.tokens.resize(k);
    for (int32_t& t : p.tokens) {
      uint32_t u = 0;
      ML_RETURN_IF_ERROR(d.GetU32(&u, "page.tokens"));
      t = static_cast<int32_t>(u);
    }
    ML_RETURN_IF_ERROR(GetMerkleProof(d, &p.proof, "page.proof"));
  }
  return Status::Ok();
}

void PutWitnessTiles(Encoder& e, const std::vector<TileWitnessTile>& tiles) {
  e.PutU32(static_cast<uint32_t>(tiles.size()));
  for (const TileWitnessTile& t : tiles) {
    e.PutU32(t.op).PutU64(t.tile);
    PutWitnessFloats(e, t.values);
    PutMerkleProof(e, t.proof);
  }
}
Status GetWitnessTiles(Decoder& d, std::vector<TileWitnessTile>* tiles, uint32_t max,
                       uint32_t min_bytes) {
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "tiles", max, min_bytes));
  tiles->resize(n);
  for (TileWitnessTile& t : *tiles) {
    ML_RETURN_IF_ERROR(d.GetU32(&t.op, "tile.op"));
    ML_RETURN_IF_ERROR(d.GetU64(&t.tile, "tile.index"));
    ML_RETURN_IF_ERROR(GetWitnessFloats(d, &t.values, "tile.values"));
    ML_RETURN_IF_ERROR(GetMerkleProof(d, &t.proof, "tile.proof"));
  }
  return Status::Ok();
}

Bytes EncodeStepWitness(const StepWitness& w) {
  Encoder e;
  e.PutString(kWitnessMagic).PutString(w.bundle);
  PutWitnessFloats(e, w.state);
  PutWitnessExamples(e, w.examples);
  return e.Take();
}

Result<StepWitness> DecodeStepWitness(ByteSpan bytes) {
  Decoder d(bytes, "step witness");
  ML_RETURN_IF_ERROR(ReadWitnessHeader(d, bytes.size(), kWitnessMagic, "step witness"));
  StepWitness w;
  ML_RETURN_IF_ERROR(d.GetString(&w.bundle, "bundle", 1u << 20));
  ML_RETURN_IF_ERROR(GetWitnessFloats(d, &w.state, "state"));
  ML_RETURN_IF_ERROR(GetWitnessExamples(d, &w.examples));
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

Bytes EncodeSegmentWitness(const SegmentWitness& w) {
  Encoder e;
  e.PutString(w.pages.empty() ? kSegmentWitnessMagic : kSegmentWitnessMagicPages)
      .PutString(w.bundle)
      .PutBytes(w.start_state);
  PutWitnessFloats(e, w.state);
  PutWitnessExamples(e, w.examples);
  if (!w.pages.empty()) PutWitnessPages(e, w.pages);
  return e.Take();
}

Result<SegmentWitness> DecodeSegmentWitness(ByteSpan bytes) {
  Decoder d(bytes, "segment witness");
  bool pages = false;
  ML_RETURN_IF_ERROR(ReadWitnessHeader(d, bytes.size(), kSegmentWitnessMagic, "segment witness",
                                       kSegmentWitnessMagicPages, &pages));
  SegmentWitness w;
  ML_RETURN_IF_ERROR(d.GetString(&w.bundle, "bundle", 1u << 20));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.start_state, "start_state", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(GetWitnessFloats(d, &w.state, "state"));
  ML_RETURN_IF_ERROR(GetWitnessExamples(d, &w.examples));
  if (pages) {
    ML_RETURN_IF_ERROR(GetWitnessPages(d, &w.pages));
    if (w.pages.empty()) {
      return InvalidArgument("segment witness: a v2 witness carries token pages; it has none");
    }
  }
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

Bytes EncodeTx(const Transaction& tx) {
  Encoder e;
  EncodeUnsigned(e, tx);
  e.PutSignature(tx.signature);
  return e.Take();
}

Bytes EncodeResultWitness(const ResultWitness& w) {
  Encoder e;
  e.PutString(kResultWitnessMagic).PutString(w.bundle).PutBytes(w.start_state);
  PutWitnessFloats(e, w.state);
  return e.Take();
}

Result<ResultWitness> DecodeResultWitness(ByteSpan bytes) {
  Decoder d(bytes, "result witness");
  ML_RETURN_IF_ERROR(ReadWitnessHeader(d, bytes.size(), kResultWitnessMagic, "result witness"));
  ResultWitness w;
  ML_RETURN_IF_ERROR(d.GetString(&w.bundle, "bundle", 1u << 20));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.start_state, "start_state", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(GetWitnessFloats(d, &w.state, "state"));
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

namespace {

// Whether `wire` starts like a transaction that may be longer than kMaxTxBytes (MaxTxBytes of
// its type tag): the header decodes and names such a type. Nothing past the tag is read.
bool StartsAsLargeTx(ByteSpan wire) {
  Decoder d(wire, "transaction");
  uint8_t version = 0;
  std::string chain_id;
  PublicKey sender;
  uint64_t nonce = 0, fee = 0;
  uint16_t tag = 0;
  return d.GetU8(&version, "version").ok() &&
         d.GetString(&chain_id, "chain_id", kMaxChainIdLength).ok() &&
         d.GetPublicKey(&sender, "sender").ok() && d.GetU64(&nonce, "nonce").ok() &&
         d.GetU64(&fee, "fee").ok() && d.GetU16(&tag, "type").ok() &&
         MaxTxBytes(static_cast<TxType>(tag)) > kMaxTxBytes;
}

}  // namespace

Result<Transaction> DecodeTx(ByteSpan wire) {
  if (wire.size() > kMaxTxBytes && (wire.size() > kMaxLargeTxBytes || !StartsAsLargeTx(wire))) {
    const size_t limit = wire.size() > kMaxLargeTxBytes ? kMaxLargeTxBytes : kMaxTxBytes;
    return ResourceExhausted(
        "transaction: " + std::to_string(wire.size()) + " bytes, over the limit of " +
        std::to_string(limit) +
        " (only RefereeStep, RefereeStageStep, ServeStageEvidence, ProveResult, ProveFraud, "
        "ProveMerits, "
        "RevealSecret and RefereeTile may be "
        "longer than " +
        std::to_string(kMaxTxBytes) + ")");
  }
  Decoder d(wire, "transaction");
  Transaction tx;
  uint8_t version;
  ML_RETURN_IF_ERROR(d.GetU8(&version, "version"));
  if (version != kTxVersion) {
    return InvalidArgument("transaction: unsupported version " + std::to_string(version) +
                           " (this build understands " + std::to_string(kTxVersion) + ")");
  }
  ML_RETURN_IF_ERROR(d.GetString(&tx.chain_id, "chain_id", kMaxChainIdLength));
  if (!internal::IsValidUtf8(tx.chain_id)) {
    return InvalidArgument("transaction: chain_id is not valid UTF-8");
  }
  ML_RETURN_IF_ERROR(d.GetPublicKey(&tx.sender, "sender"));
  ML_RETURN_IF_ERROR(d.GetU64(&tx.nonce, "nonce"));
  ML_RETURN_IF_ERROR(d.GetU64(&tx.fee, "fee"));
  uint16_t tag;
  ML_RETURN_IF_ERROR(d.GetU16(&tag, "type"));
  ML_RETURN_IF_ERROR(DecodePayload(d, tag, &tx.payload));

  ML_RETURN_IF_ERROR(d.GetSignature(&tx.signature, "signature"));
  ML_RETURN_IF_ERROR(d.Finish());
  return tx;
}

Bytes SigningBytes(const Transaction& tx) {
  Encoder e;
  e.PutRaw(AsBytes(kTxDomain));
  EncodeUnsigned(e, tx);
  return e.Take();
}

Hash256 TxId(const Transaction& tx) { return TxIdOfEncoded(EncodeTx(tx)); }

Hash256 TxIdOfEncoded(ByteSpan wire) {
  Hasher h("meshlearn.txid.v1");
  h.Update(wire);
  return h.Finish();
}

bool VerifyTxSignature(const Transaction& tx) {
  return Verify(tx.sender, SigningBytes(tx), tx.signature);
}

Transaction SignTx(Transaction tx, const KeyPair& signer) {
  tx.sender = signer.public_key();
  tx.signature = signer.Sign(SigningBytes(tx));
  return tx;
}

Transaction BuildSignedTx(const KeyPair& signer, std::string chain_id, uint64_t nonce,
                          TxPayload payload, Amount fee) {
  Transaction tx;
  tx.chain_id = std::move(chain_id);
  tx.nonce = nonce;
  tx.fee = fee;
  tx.payload = std::move(payload);
  return SignTx(std::move(tx), signer);
}

nlohmann::json PayloadToJson(const TxPayload& p) {
  nlohmann::json j = nlohmann::json::object();
  j["type"] = std::string(TxTypeName(PayloadType(p)));
  std::visit([&](const auto& v) { std::decay_t<decltype(v)>::Visit(v, internal::FieldToJson{j}); },
             p);
  return j;
}

Result<TxPayload> PayloadFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("payload: must be a JSON object, got " + j.dump());
  auto type = j.find("type");
  if (type == j.end() || !type->is_string()) {
    return InvalidArgument("payload: needs \"type\" (e.g. \"Transfer\")");
  }
  ML_ASSIGN_OR_RETURN(TxType t, TxTypeFromName(type->get<std::string>()));
  switch (t) {
#define ML_TX_FROM_JSON_CASE_(Name, tag, module) \
  case TxType::k##Name:                          \
    return PayloadFromJsonAs<Name##Tx>(j);
    MESHLEARN_LEDGER_TX_TYPES(ML_TX_FROM_JSON_CASE_)
#undef ML_TX_FROM_JSON_CASE_
  }
  return Internal("unreachable");
}

nlohmann::json TxToJson(const Transaction& tx) {
  return {{"id", TxId(tx).ToHex()},
          {"chain_id", tx.chain_id},
          {"sender", tx.sender.ToHex()},
          {"nonce", tx.nonce},
          {"fee", tx.fee},
          {"type", std::string(TxTypeName(PayloadType(tx.payload)))},
          {"payload", PayloadToJson(tx.payload)},
          {"signature", tx.signature.ToHex()}};
}

Result<Transaction> TxFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("transaction: must be a JSON object");
  Transaction tx;
  auto get_str = [&](const char* k) -> Result<std::string> {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string()) {
      return InvalidArgument(std::string("transaction: needs string field '") + k + "'");
    }
    return it->get<std::string>();
  };
  auto get_u64 = [&](const char* k) -> Result<uint64_t> {
    auto it = j.find(k);
    if (it == j.end()) return uint64_t{0};
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
      return InvalidArgument(std::string("transaction: field '") + k +
                             "' must be a non-negative integer");
    }
    return it->get<uint64_t>();
  };
  ML_ASSIGN_OR_RETURN(tx.chain_id, get_str("chain_id"));
  ML_ASSIGN_OR_RETURN(std::string sender, get_str("sender"));
  ML_ASSIGN_OR_RETURN(tx.sender, PublicKey::FromHex(sender, "sender"));
  ML_ASSIGN_OR_RETURN(tx.nonce, get_u64("nonce"));
  ML_ASSIGN_OR_RETURN(tx.fee, get_u64("fee"));
  auto payload = j.find("payload");
  if (payload == j.end()) return InvalidArgument("transaction: needs 'payload'");
  ML_ASSIGN_OR_RETURN(tx.payload, PayloadFromJson(*payload));
  if (j.contains("signature")) {
    ML_ASSIGN_OR_RETURN(std::string sig, get_str("signature"));
    ML_ASSIGN_OR_RETURN(tx.signature, Signature::FromHex(sig, "signature"));
  }
  return tx;
}

}  // namespace meshlearn::ledger

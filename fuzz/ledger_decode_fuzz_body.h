// The body of the ledger decoding fuzz target, shared by the libFuzzer binary
// (fuzz/ledger_decode_fuzz.cc, clang only) and the bounded corpus + mutation test that runs in
// the default test suite (ledger/src/decode_fuzz_test.cc).
//
// Input: byte 0 selects the decoder (even: transaction, odd: block), the rest is the wire
// encoding. Properties checked, aborting on violation:
//   - decoding never crashes, whatever the bytes;
//   - what decodes re-encodes to exactly the same bytes (one value, one encoding);
//   - the JSON views of what decodes can be printed, and a transaction's JSON reads back to
//     the same transaction.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger::fuzz {

inline void FuzzCheck(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "ledger_decode_fuzz: property violated: %s\n", what);
    std::abort();
  }
}

inline void CheckTxViews(const Transaction& tx) {
  std::string text = TxToJson(tx).dump();
  auto back = TxFromJson(nlohmann::json::parse(text));
  FuzzCheck(back.ok(), "TxFromJson(TxToJson(tx)) failed");
  FuzzCheck(*back == tx, "TxFromJson(TxToJson(tx)) != tx");
  (void)VerifyTxSignature(tx);
}

inline int LedgerDecodeOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ByteSpan wire(data + 1, size - 1);
  if ((data[0] & 1) == 0) {
    auto tx = DecodeTx(wire);
    if (!tx.ok()) return 0;
    Bytes again = EncodeTx(*tx);
    FuzzCheck(again.size() == wire.size() &&
                  std::memcmp(again.data(), wire.data(), wire.size()) == 0,
              "EncodeTx(DecodeTx(x)) != x");
    FuzzCheck(TxId(*tx) == TxIdOfEncoded(wire), "TxId differs from the id of the encoding");
    CheckTxViews(*tx);
  } else {
    auto block = DecodeBlock(wire);
    if (!block.ok()) return 0;
    Bytes again = EncodeBlock(*block);
    FuzzCheck(again.size() == wire.size() &&
                  std::memcmp(again.data(), wire.data(), wire.size()) == 0,
              "EncodeBlock(DecodeBlock(x)) != x");
    (void)BlockToJson(*block).dump();
    (void)VerifyBlockSignature(*block);
    for (const Transaction& tx : block->txs) CheckTxViews(tx);
  }
  return 0;
}

}  // namespace meshlearn::ledger::fuzz

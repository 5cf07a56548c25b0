#include "meshlearn/ledger/tx.h"

#include <gtest/gtest.h>

namespace meshlearn::ledger {
namespace {

KeyPair Key(uint8_t i) {
  KeySeed s;
  s.bytes.fill(i);
  return KeyPair::FromSeed(s);
}

TEST(TxTest, EncodeDecodeRoundTrip) {
  KeyPair a = Key(1), b = Key(2);
  Transaction tx = BuildSignedTx(a, "test", 7, TransferTx{.to = b.public_key(), .amount = 5});
  Bytes wire = EncodeTx(tx);
  auto back = DecodeTx(wire);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, tx);
  EXPECT_EQ(TxId(*back), TxId(tx));
  EXPECT_TRUE(VerifyTxSignature(*back));
}

}  // namespace
}  // namespace meshlearn::ledger

#include "meshlearn/ledger/block.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestKey;

Block SampleBlock() {
  KeyPair seq = TestKey(100), a = TestKey(1);
  Block b;
  b.header.chain_id = "test";
  b.header.height = 3;
  b.header.prev_hash = Blake2b("prev");
  b.header.time_ms = 12345;
  b.header.sequencer = seq.public_key();
  for (uint64_t i = 0; i < 3; ++i) {
    b.txs.push_back(BuildSignedTx(a, "test", i, TransferTx{.to = seq.public_key(), .amount = i + 1}));
    Receipt r;
    r.tx_id = TxId(b.txs.back());
    r.height = 3;
    r.index = static_cast<uint32_t>(i);
    if (i == 1) {
      r.ok = false;
      r.code = StatusCode::kFailedPrecondition;
      r.reason = "insufficient funds";
    }
    b.receipts.push_back(r);
  }
  b.header.tx_root = TxRoot(b.txs);
  b.header.receipts_root = ReceiptsRoot(b.receipts);
  b.header.state_hash = Blake2b("state");
  b.signature = seq.Sign(BlockHash(b.header).span());
  return b;
}

TEST(BlockTest, RoundTrip) {
  Block b = SampleBlock();
  EXPECT_TRUE(VerifyBlockSignature(b));
  auto back = DecodeBlock(EncodeBlock(b));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, b);
  nlohmann::json j = BlockToJson(b);
  EXPECT_EQ(j["header"]["hash"], BlockHash(b.header).ToHex());
  EXPECT_EQ(j["txs"].size(), 3u);
  EXPECT_EQ(j["receipts"][1]["ok"], false);
}

TEST(BlockTest, DecodeRefusesTruncatedTrailingAndInconsistent) {
  Bytes wire = EncodeBlock(SampleBlock());
  for (size_t n = 0; n < wire.size(); n += 7) {
    EXPECT_FALSE(DecodeBlock(ByteSpan(wire.data(), n)).ok()) << n;
  }
  wire.push_back(1);
  EXPECT_FALSE(DecodeBlock(wire).ok());
  Block b = SampleBlock();
  b.receipts.pop_back();
  EXPECT_NE(DecodeBlock(EncodeBlock(b)).status().message().find("receipts"), std::string::npos);
}

TEST(BlockTest, HeaderHashCoversEveryField) {
  Block b = SampleBlock();
  Hash256 h = BlockHash(b.header);
  BlockHeader x = b.header;
  x.time_ms++;
  EXPECT_NE(BlockHash(x), h);
  x = b.header;
  x.state_hash.bytes[3] ^= 1;
  EXPECT_NE(BlockHash(x), h);
  x = b.header;
  x.receipts_root.bytes[3] ^= 1;
  EXPECT_NE(BlockHash(x), h);
}

}  // namespace
}  // namespace meshlearn::ledger

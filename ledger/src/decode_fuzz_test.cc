// Runs the ledger decoding fuzz body (fuzz/ledger_decode_fuzz_body.h) over the committed seed
// corpus and a bounded number of deterministic random mutations of it, so the default test
// suite exercises the decoders without clang or libFuzzer.
//
// MESHLEARN_WRITE_LEDGER_CORPUS=1 rewrites the seed corpus (fuzz/corpus/ledger_decode/) from
// the samples below; commit the result.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "../../fuzz/ledger_decode_fuzz_body.h"
#include "meshlearn/base/rng.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestKey;

const std::string kCorpusDir = std::string(MESHLEARN_SOURCE_DIR) + "/fuzz/corpus/ledger_decode";

std::vector<std::pair<std::string, Bytes>> Seeds() {
  KeyPair a = TestKey(1), seq = TestKey(100);
  PublicKey k = TestKey(2).public_key();
  NodeCapabilities caps{.cores = 4, .memory_bytes = 1 << 30, .accelerator = "cuda", .throughput = 5,
                        .latency_ms = 3, .bandwidth_bytes_per_s = 1 << 20};
  std::vector<std::pair<std::string, TxPayload>> payloads = {
      {"transfer", TransferTx{.to = k, .amount = 5, .memo = "m\xc3\xa9mo"}},
      {"faucet", FaucetTx{.recipient = k, .amount = 9}},
      {"stake", StakeTx{.node_id = k, .amount = 1}},
      {"unstake", UnstakeTx{.node_id = k, .amount = 1}},
      {"withdraw", WithdrawTx{}},
      {"register_node", RegisterNodeTx{.node_id = k, .endpoint = "http://h:1", .roles = 3,
                                       .capabilities = caps, .price = 2, .stake = 100}},
      {"update_node", UpdateNodeTx{.node_id = k, .endpoint = "http://h:2", .roles = 8,
                                   .capabilities = caps, .price = 3}},
      {"heartbeat", HeartbeatTx{.node_id = k}},
      {"leave_node", LeaveNodeTx{.node_id = k}},
      {"report_links",
       ReportLinksTx{
           .node_id = k,
           .links = {{.peer = a.public_key(), .latency_ms = 2, .bandwidth_bytes_per_s = 9}}}},
      {"submit_task", SubmitTaskTx{.spec_hash = Blake2b("s"), .budget = 10, .price_cap = 1,
                                   .params = testing::TestTaskParams()}},
      {"cancel_task", CancelTaskTx{.task_id = Blake2b("t")}},
      {"commit_unit", CommitUnitTx{.task_id = Blake2b("t"), .index = 3, .node_id = k,
                                   .result_hash = Blake2b("d"), .commitment = Blake2b("c"),
                                   .loss_micros = 9}},
      {"commit_aggregate", CommitAggregateTx{.task_id = Blake2b("t"), .round = 1, .node_id = k,
                                             .state_hash = Blake2b("g"),
                                             .test_accuracy_ppm = 5, .test_loss_micros = 6}},
      {"report_unavailable", ReportUnavailableTx{.task_id = Blake2b("t"), .index = 2, .node_id = k}},
      {"commit_stage", CommitStageTx{.task_id = Blake2b("t"), .round = 1, .replica = 1, .stage = 2,
                                     .node_id = k, .result_hash = Blake2b("d"),
                                     .commitment = Blake2b("c")}},
  };
  std::vector<std::pair<std::string, Bytes>> out;
  Block block;
  block.header.chain_id = "fuzz";
  block.header.height = 1;
  block.header.sequencer = seq.public_key();
  uint64_t nonce = 0;
  for (auto& [name, p] : payloads) {
    Transaction tx = BuildSignedTx(a, "fuzz", nonce, p, /*fee=*/nonce % 2);
    ++nonce;
    Bytes wire = EncodeTx(tx);
    wire.insert(wire.begin(), 0);
    out.push_back({"tx_" + name, wire});
    Receipt r;
    r.tx_id = TxId(tx);
    r.height = 1;
    r.index = static_cast<uint32_t>(block.txs.size());
    if (nonce % 3 == 0) {
      r.ok = false;
      r.code = StatusCode::kFailedPrecondition;
      r.reason = "insufficient funds";
    }
    block.txs.push_back(tx);
    block.receipts.push_back(r);
  }
  auto add_block = [&](const std::string& name, Block b) {
    b.header.tx_root = TxRoot(b.txs);
    b.header.receipts_root = ReceiptsRoot(b.receipts);
    b.signature = seq.Sign(BlockHash(b.header).span());
    Bytes wire = EncodeBlock(b);
    wire.insert(wire.begin(), 1);
    out.push_back({name, wire});
  };
  add_block("block_full", block);
  Block empty;
  empty.header = block.header;
  add_block("block_empty", empty);
  return out;
}

TEST(DecodeFuzzTest, SeedsAreValidInputs) {
  for (const auto& [name, bytes] : Seeds()) {
    ByteSpan wire(bytes.data() + 1, bytes.size() - 1);
    bool ok = bytes[0] == 0 ? DecodeTx(wire).ok() : DecodeBlock(wire).ok();
    EXPECT_TRUE(ok) << name;
  }
  if (std::getenv("MESHLEARN_WRITE_LEDGER_CORPUS") != nullptr) {
    std::filesystem::create_directories(kCorpusDir);
    for (const auto& [name, bytes] : Seeds()) {
      std::ofstream f(kCorpusDir + "/" + name, std::ios::binary);
      f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
  }
}

std::vector<Bytes> LoadCorpus() {
  std::vector<Bytes> corpus;
  if (!std::filesystem::exists(kCorpusDir)) return corpus;
  std::vector<std::filesystem::path> paths;
  for (const auto& e : std::filesystem::directory_iterator(kCorpusDir)) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());  // deterministic order
  for (const auto& p : paths) {
    std::ifstream f(p, std::ios::binary);
    corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return corpus;
}

TEST(DecodeFuzzTest, CorpusPasses) {
  std::vector<Bytes> corpus = LoadCorpus();
  EXPECT_GE(corpus.size(), 13u) << "seed corpus missing from " << kCorpusDir;
  for (const Bytes& b : corpus) fuzz::LedgerDecodeOneInput(b.data(), b.size());
}

// Bounded random mutations (bit flips, byte sets, truncation, insertion, deletion, splicing,
// length-field edits) of the corpus, from a fixed seed: the same inputs every run.
TEST(DecodeFuzzTest, RandomMutationsNeverBreakTheProperties) {
  std::vector<Bytes> corpus = LoadCorpus();
  for (const auto& [name, bytes] : Seeds()) corpus.push_back(bytes);
  Rng rng(20261129);
  const int kIterations = 20000;
  int decoded = 0;
  for (int it = 0; it < kIterations; ++it) {
    Bytes b = corpus[rng.Uniform(corpus.size())];
    int edits = 1 + static_cast<int>(rng.Uniform(4));
    for (int e = 0; e < edits && !b.empty(); ++e) {
      size_t pos = rng.Uniform(b.size());
      switch (rng.Uniform(7)) {
        case 0: b[pos] ^= static_cast<uint8_t>(1u << rng.Uniform(8)); break;
        case 1: b[pos] = static_cast<uint8_t>(rng.NextU32()); break;
        case 2: b.resize(pos); break;
        case 3: b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<uint8_t>(rng.NextU32())); break;
        case 4: b.erase(b.begin() + static_cast<std::ptrdiff_t>(pos)); break;
        case 5: {
          const Bytes& other = corpus[rng.Uniform(corpus.size())];
          size_t from = rng.Uniform(other.size());
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
          break;
        }
        case 6: {  // a plausible u32 length or count: small, zero or huge
          uint32_t v = rng.Uniform(2) ? static_cast<uint32_t>(rng.Uniform(64)) : 0xffffffffu;
          for (int k = 0; k < 4 && pos + k < b.size(); ++k) b[pos + k] = static_cast<uint8_t>(v >> (8 * k));
          break;
        }
      }
    }
    if (!b.empty()) {
      ByteSpan wire(b.data() + 1, b.size() - 1);
      decoded += ((b[0] & 1) == 0 ? DecodeTx(wire).ok() : DecodeBlock(wire).ok()) ? 1 : 0;
    }
    fuzz::LedgerDecodeOneInput(b.data(), b.size());
  }
  // Some mutations (a flipped amount bit, a changed signature byte) still decode: the
  // re-encoding property is exercised on those, not only the error paths.
  EXPECT_GT(decoded, 0);
}

}  // namespace
}  // namespace meshlearn::ledger

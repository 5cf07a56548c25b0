#include "meshlearn/ledger/tx.h"

#include <gtest/gtest.h>

#include "meshlearn/base/rng.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_serve.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestKey;

// One sample payload of every type, with every field set.
std::vector<TxPayload> SamplePayloads() {
  PublicKey k = TestKey(9).public_key();
  NodeCapabilities caps{.cores = 16, .memory_bytes = 1ull << 35, .accelerator = "cuda:H200",
                        .throughput = 777, .latency_ms = 12, .bandwidth_bytes_per_s = 1ull << 30};
  MismatchClaimField claim{
      .segment = 3,
      .start = Blake2b("s3"),
      .start_proof = {.index = 3, .leaf_count = 11, .siblings = {Blake2b("a"), Blake2b("b")}},
      .solver_end = Blake2b("s4"),
      .end_proof = {.index = 4, .leaf_count = 11, .siblings = {Blake2b("c")}},
      .replayed_end = Blake2b("r4")};
  std::vector<TxPayload> out = {
      TransferTx{.to = k, .amount = 12345, .memo = "rent"},
      FaucetTx{.recipient = k, .amount = 99},
      StakeTx{.node_id = k, .amount = 1},
      UnstakeTx{.node_id = k, .amount = 2},
      WithdrawTx{},
      RegisterNodeTx{.node_id = k,
                     .endpoint = "http://h:1",
                     .roles = kRoleSolver | kRoleAggregator,
                     .capabilities = caps,
                     .price = 3,
                     .stake = 400,
                     .secret_head = Blake2b("head")},
      UpdateNodeTx{.node_id = k,
                   .endpoint = "http://h:2",
                   .roles = kRoleVerifier,
                   .capabilities = caps,
                   .price = 4},
      HeartbeatTx{.node_id = k},
      LeaveNodeTx{.node_id = k},
      ReportLinksTx{.node_id = k,
                    .links = {{.peer = TestKey(3).public_key(),
                               .latency_ms = 4,
                               .bandwidth_bytes_per_s = 125'000'000},
                              {.peer = TestKey(4).public_key(),
                               .latency_ms = 0,
                               .bandwidth_bytes_per_s = 1}}},
      SubmitTaskTx{.spec_hash = Blake2b("spec"),
                   .budget = 1000,
                   .price_cap = 10,
                   .memo = "m",
                   .params = testing::TestTaskParams()},
      CancelTaskTx{.task_id = Blake2b("task")},
      CommitUnitTx{.task_id = Blake2b("task"),
                   .index = 5,
                   .node_id = k,
                   .result_hash = Blake2b("delta"),
                   .commitment = Blake2b("root"),
                   .loss_micros = 2'300'000,
                   .secret_index = 3},
      CommitAggregateTx{.task_id = Blake2b("task"),
                        .round = 1,
                        .node_id = k,
                        .state_hash = Blake2b("state"),
                        .test_accuracy_ppm = 871'000,
                        .test_loss_micros = 380'000},
      ReportUnavailableTx{.task_id = Blake2b("task"), .index = 7, .node_id = k},
      CommitStageTx{.task_id = Blake2b("task"),
                    .round = 1,
                    .replica = 2,
                    .stage = 3,
                    .node_id = k,
                    .result_hash = Blake2b("stage delta"),
                    .commitment = Blake2b("stage root"),
                    .loss_micros = 7,
                    .secret_index = 3,
                    .leaves = {Blake2b("step 0"), Blake2b("step 1")},
                    .commits = Blake2b("stage commits"),
                    .assignment_beacon = Blake2b("placement")},
      CommitVerdictTx{
          .task_id = Blake2b("task"), .index = 2, .node_id = k, .commitment = Blake2b("sealed")},
      RevealVerdictTx{.task_id = Blake2b("task"),
                      .index = 2,
                      .node_id = k,
                      .verdict = 2,
                      .salt = Blake2b("salt"),
                      .claim = claim,
                      .bundle = {"[task]\nname = \"t\"\n"}},
      RevealSecretTx{.task_id = Blake2b("task"),
                     .index = 2,
                     .node_id = k,
                     .secret = Blake2b("secret"),
                     .start_leaf = Blake2b("leaf0")},
      DisputePostTx{.task_id = Blake2b("task"),
                    .index = 2,
                    .node_id = k,
                    .position = 17,
                    .hash = Blake2b("mid")},
      ChallengeUnitTx{.task_id = Blake2b("task"), .index = 2, .node_id = k, .claim = claim},
      DisputeChildrenTx{.task_id = Blake2b("task"),
                        .index = 2,
                        .node_id = k,
                        .position = 3,
                        .left = Blake2b("left"),
                        .right = Blake2b("right")},
      RefereeTileTx{
          .task_id = Blake2b("task"), .index = 2, .bundle = {"[task]"}, .witness = {Bytes(100, 7)}},
      RuleDisputeTx{.task_id = Blake2b("task"), .index = 2, .output = Blake2b("out")},
      RefereeStageStepTx{.task_id = Blake2b("task"),
                         .index = 4,
                         .witness = {EncodeStageStepWitness(
                             {.bundle = "[task]",
                              .commit = Bytes(3, 1),
                              .checkpoint = Bytes(5, 2),
                              .received = {Bytes(8, 3)},
                              .pages = {{.page = 2, .tokens = {1, 2}, .proof = {}}}})}},
      ServeStageEvidenceTx{
          .task_id = Blake2b("task"),
          .index = 4,
          .piece = 1,
          .bundle = {"[task]"},
          .witness = {EncodeStageServePiece(
              {.roots = {.commit = Bytes(3, 1), .seed = 5, .stream = 6, .outputs = {Blake2b("r")}},
               .tiles = {{.op = 1, .tile = 0, .values = {1, 2}, .proof = {}}}})}},
      RefereeStepTx{
          .task_id = Blake2b("task"),
          .index = 2,
          .witness = {EncodeStepWitness({.bundle = "[task]", .state = {1, 2}, .examples = {}})}},
      ProveResultTx{.task_id = Blake2b("task"),
                    .index = 2,
                    .node_id = k,
                    .witness = {EncodeResultWitness(
                        {.bundle = "[task]", .start_state = {1, 2}, .state = {3}})}},
      ProveFraudTx{.task_id = Blake2b("task"),
                   .index = 2,
                   .segment = 1,
                   .witness = {EncodeSegmentWitness(
                       {.bundle = "[task]", .start_state = {}, .state = {3}, .examples = {}})}},
      ProveMeritsTx{.task_id = Blake2b("task"),
                    .index = 2,
                    .node_id = k,
                    .segment = 1,
                    .witness = {EncodeSegmentWitness(
                        {.bundle = "[task]", .start_state = {}, .state = {3}, .examples = {}})}},
      LateChallengeTx{.task_id = Blake2b("task"),
                      .index = 2,
                      .segment = 1,
                      .end = Blake2b("end"),
                      .bond = 70,
                      .bundle = {"[task]"}},
      CommitProofTx{.commitment = Blake2b("commitment"), .prover = k},
  };
  return out;
}

TEST(TxTest, SamplesCoverEveryType) {
  std::set<TxType> seen;
  for (const TxPayload& p : SamplePayloads()) seen.insert(PayloadType(p));
  EXPECT_EQ(seen.size(), std::variant_size_v<TxPayload>);
}

TEST(TxTest, ABundleFieldIsBoundedAndUtf8) {
  KeyPair a = TestKey(1);
  auto reveal = [&](std::string bundle) {
    return EncodeTx(BuildSignedTx(
        a, "test", 1,
        RevealVerdictTx{.task_id = Blake2b("task"), .verdict = 2, .bundle = {std::move(bundle)}}));
  };
  EXPECT_TRUE(DecodeTx(reveal(std::string(kMaxBundleBytes - 200, 'x'))).ok());
  Result<Transaction> long_bundle = DecodeTx(reveal(std::string(kMaxBundleBytes + 1, 'x')));
  ASSERT_FALSE(long_bundle.ok());
  EXPECT_NE(long_bundle.status().message().find("bundle"), std::string::npos)
      << long_bundle.status().ToString();
  Result<Transaction> not_utf8 = DecodeTx(reveal(std::string("[task]\xff\xfe")));
  ASSERT_FALSE(not_utf8.ok());
  EXPECT_NE(not_utf8.status().message().find("not valid UTF-8"), std::string::npos)
      << not_utf8.status().ToString();
  // A RefereeTile may carry a witness up to kMaxTileWitnessBytes (longer than kMaxTxBytes).
  Bytes tile = EncodeTx(BuildSignedTx(a, "test", 1,
                                      RefereeTileTx{.task_id = Blake2b("task"),
                                                    .bundle = {"[task]"},
                                                    .witness = {Bytes(kMaxTileWitnessBytes, 1)}}));
  EXPECT_GT(tile.size(), kMaxTxBytes);
  EXPECT_LE(tile.size(), MaxTxBytes(TxType::kRefereeTile));
  EXPECT_TRUE(DecodeTx(tile).ok());
  // So may a RefereeStageStep (a whole stage step: up to kMaxWitnessBytes).
  Bytes stage = EncodeTx(BuildSignedTx(
      a, "test", 1,
      RefereeStageStepTx{.task_id = Blake2b("task"), .witness = {Bytes(1 << 20, 1)}}));
  EXPECT_LE(stage.size(), MaxTxBytes(TxType::kRefereeStageStep));
  EXPECT_TRUE(DecodeTx(stage).ok());
  // And a ServeStageEvidence (a piece of a stage's evidence: up to kMaxWitnessBytes).
  Bytes piece = EncodeTx(BuildSignedTx(
      a, "test", 1,
      ServeStageEvidenceTx{.task_id = Blake2b("task"), .witness = {Bytes(1 << 20, 1)}}));
  EXPECT_GT(piece.size(), kMaxTxBytes);
  EXPECT_LE(piece.size(), MaxTxBytes(TxType::kServeStageEvidence));
  EXPECT_TRUE(DecodeTx(piece).ok());
}

// A piece of a stage's evidence decodes to what was encoded; truncated or trailing bytes and
// another magic are refused.
TEST(TxTest, AStageEvidencePieceRoundTripsAndRefusesBadBytes) {
  const StageServePiece p{
      .roots = {.commit = Bytes(7, 1),
                .seed = 3,
                .stream = 4,
                .outputs = {Blake2b("a"), Blake2b("b")}},
      .tiles = {{.op = 2,
                 .tile = 5,
                 .values = {1.5f, -2.0f},
                 .proof = {.index = 5, .leaf_count = 9, .siblings = {Blake2b("s")}}}}};
  const Bytes bytes = EncodeStageServePiece(p);
  Result<StageServePiece> back = DecodeStageServePiece(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, p);
  EXPECT_FALSE(DecodeStageServePiece(ByteSpan(bytes.data(), bytes.size() - 1)).ok());
  Bytes longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(DecodeStageServePiece(longer).ok());
  EXPECT_FALSE(DecodeStageServePiece(EncodeStageRootsWitness(p.roots)).ok());
}

TEST(TxTest, EveryTypeRoundTripsThroughBytesAndJson) {
  KeyPair a = TestKey(1);
  for (const TxPayload& p : SamplePayloads()) {
    Transaction tx = BuildSignedTx(a, "test", 7, p, /*fee=*/2);
    SCOPED_TRACE(TxTypeName(PayloadType(p)));
    EXPECT_TRUE(VerifyTxSignature(tx));
    auto back = DecodeTx(EncodeTx(tx));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, tx);
    EXPECT_EQ(TxId(*back), TxId(tx));
    nlohmann::json j = TxToJson(tx);
    EXPECT_EQ(j["type"], std::string(TxTypeName(PayloadType(p))));
    EXPECT_EQ(j["id"], TxId(tx).ToHex());
    auto from_json = TxFromJson(nlohmann::json::parse(j.dump()));
    ASSERT_TRUE(from_json.ok()) << from_json.status().ToString();
    EXPECT_EQ(*from_json, tx);
    EXPECT_EQ(TxTypeFromName(TxTypeName(PayloadType(p))).value(), PayloadType(p));
  }
}

TEST(TxTest, DecodeRefusesEveryTruncationAndTrailingByte) {
  KeyPair a = TestKey(1);
  for (const TxPayload& p : SamplePayloads()) {
    Bytes wire = EncodeTx(BuildSignedTx(a, "test", 1, p));
    for (size_t n = 0; n < wire.size(); ++n) {
      EXPECT_FALSE(DecodeTx(ByteSpan(wire.data(), n)).ok()) << n;
    }
    wire.push_back(0);
    auto r = DecodeTx(wire);
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("trailing"), std::string::npos) << r.status().ToString();
  }
}

TEST(TxTest, DecodeRefusesUnknownTypeVersionAndOversize) {
  Bytes wire = EncodeTx(BuildSignedTx(TestKey(1), "test", 1, WithdrawTx{}));
  // Layout: version(1) chain_id(4+4) sender(32) nonce(8) fee(8) type(2).
  size_t type_at = 1 + 4 + 4 + 32 + 8 + 8;
  Bytes bad = wire;
  bad[type_at] = 0xff;
  EXPECT_NE(DecodeTx(bad).status().message().find("unknown type"), std::string::npos);
  bad = wire;
  bad[0] = 9;
  EXPECT_NE(DecodeTx(bad).status().message().find("version"), std::string::npos);
  Bytes big(kMaxTxBytes + 1, 1);
  EXPECT_EQ(DecodeTx(big).status().code(), StatusCode::kResourceExhausted);
}

TEST(TxTest, SignatureCoversEverything) {
  KeyPair a = TestKey(1);
  Transaction tx = BuildSignedTx(a, "test", 1, TransferTx{.to = TestKey(2).public_key(), .amount = 5});
  Transaction t = tx;
  t.nonce = 2;
  EXPECT_FALSE(VerifyTxSignature(t));
  t = tx;
  t.chain_id = "other";
  EXPECT_FALSE(VerifyTxSignature(t));
  t = tx;
  t.fee = 1;
  EXPECT_FALSE(VerifyTxSignature(t));
  t = tx;
  t.sender = TestKey(2).public_key();
  EXPECT_FALSE(VerifyTxSignature(t));
  t = tx;
  t.payload = FaucetTx{.recipient = TestKey(2).public_key(), .amount = 5};
  EXPECT_FALSE(VerifyTxSignature(t));
}

TEST(TxTest, PayloadFromJsonForTheCli) {
  auto p = PayloadFromJson(nlohmann::json::parse(
      R"({"type":"Transfer","to":")" + TestKey(2).public_key().ToHex() + R"(","amount":5})"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(std::get<TransferTx>(*p).amount, 5u);
  EXPECT_EQ(std::get<TransferTx>(*p).memo, "");
  // Typos, wrong types, negative amounts, unknown types are refused with the field named.
  auto bad = PayloadFromJson(nlohmann::json::parse(R"({"type":"Transfer","amonut":5})"));
  EXPECT_NE(bad.status().message().find("amonut"), std::string::npos);
  bad = PayloadFromJson(nlohmann::json::parse(R"({"type":"Transfer","amount":-5})"));
  EXPECT_NE(bad.status().message().find("amount"), std::string::npos);
  bad = PayloadFromJson(nlohmann::json::parse(R"({"type":"Transfer","amount":"5"})"));
  EXPECT_FALSE(bad.ok());
  bad = PayloadFromJson(nlohmann::json::parse(R"({"type":"Tranfser"})"));
  EXPECT_NE(bad.status().message().find("unknown transaction type"), std::string::npos);
  bad = PayloadFromJson(nlohmann::json::parse(R"({"type":"RegisterNode","capabilities":{"cpus":1}})"));
  EXPECT_NE(bad.status().message().find("cpus"), std::string::npos);
  bad = PayloadFromJson(nlohmann::json::parse(R"([1,2])"));
  EXPECT_FALSE(bad.ok());
  bad = PayloadFromJson(nlohmann::json::parse(R"({"type":"RegisterNode","capabilities":[1]})"));
  EXPECT_FALSE(bad.ok());
}

TEST(TxTest, StringsMustBeUtf8) {
  Transaction tx = BuildSignedTx(TestKey(1), "test", 1,
                                 TransferTx{.to = TestKey(2).public_key(), .amount = 1,
                                            .memo = "caf\xc3\xa9 \xf0\x9f\x9a\x80"});
  EXPECT_TRUE(DecodeTx(EncodeTx(tx)).ok());
  for (std::string bad : {"\xff", "\xc3", "\xc0\x80", "\xed\xa0\x80", "ab\xf4\x90\x80\x80"}) {
    std::get<TransferTx>(tx.payload).memo = bad;
    auto r = DecodeTx(EncodeTx(tx));
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("UTF-8"), std::string::npos) << r.status().ToString();
  }
}

TEST(TxTest, RolesParse) {
  EXPECT_EQ(ParseRoles("solver,verifier").value(), kRoleSolver | kRoleVerifier);
  EXPECT_EQ(ParseRoles("aggregator, whistleblower").value(),
            kRoleAggregator | kRoleWhistleblower);
  EXPECT_FALSE(ParseRoles("").ok());
  EXPECT_FALSE(ParseRoles("miner").ok());
  EXPECT_EQ(RolesToString(kAllRoles), "solver,verifier,whistleblower,aggregator");
}

}  // namespace
}  // namespace meshlearn::ledger

// Signed stage transfers and stage step commitments (stage_transfer.h): what a sender signs is
// bound to every field, decode refuses bad shapes naming them, a receiver's tensor is checked
// against the record, and a step's leaf changes with any record it lists.
#include "meshlearn/protocol/stage_transfer.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/rng.h"

namespace meshlearn::protocol {
namespace {

KeyPair StageKey(uint8_t i) {
  KeySeed seed;
  seed.bytes.fill(i);
  return KeyPair::FromSeed(seed);
}

StageTensorKey ActivationKey() {
  StageTensorKey k;
  k.task = Blake2b("task");
  k.round = 2;
  k.replica = 1;
  k.stages = 3;
  k.from_stage = 0;
  k.to_stage = 1;
  k.step = 4;
  k.micro_batch = 1;
  k.kind = StageTensorKind::kStageTensorActivation;
  return k;
}

bool Has(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

TEST(StageTransferTest, SignedRecordsRoundTripAndVerify) {
  const KeyPair sender = StageKey(1);
  const StageTransfer t = SignStageTransfer(ActivationKey(), Blake2b("tensor"), 64, sender);
  const Bytes wire = EncodeStageTransfer(t);
  EXPECT_EQ(wire.size(), kStageTransferWireBytes);
  Result<StageTransfer> back = DecodeStageTransfer(wire);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, t);
  EXPECT_TRUE(VerifyStageTransfer(*back, sender.public_key()).ok());
  EXPECT_TRUE(CheckReceivedTensor(*back, Blake2b("tensor"), 64).ok());
  EXPECT_EQ(t.key.ToString(), "replica 1, step 4, micro-batch 1: activation stage 0 -> 1");
}

TEST(StageTransferTest, EveryFieldIsBoundByTheSignature) {
  const KeyPair sender = StageKey(1);
  const StageTransfer t = SignStageTransfer(ActivationKey(), Blake2b("tensor"), 64, sender);
  std::vector<StageTransfer> altered(9, t);
  altered[0].key.task = Blake2b("other task");
  altered[1].key.round = 3;
  altered[2].key.replica = 0;
  altered[3].key.step = 5;
  altered[4].key.micro_batch = 0;
  altered[5].tensor = Blake2b("other tensor");
  altered[6].bytes = 68;
  altered[7].key.stages = 4;
  altered[8].key.kind = StageTensorKind::kStageTensorGradSquares;
  altered[8].key.micro_batch = -1;
  altered[8].bytes = 4;
  for (const StageTransfer& a : altered) {
    Status st = VerifyStageTransfer(a, sender.public_key());
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << a.key.ToString();
    EXPECT_TRUE(Has(st, "does not verify")) << st.ToString();
  }
  // A record signed by another node than the chain's stage 0.
  const StageTransfer other = SignStageTransfer(ActivationKey(), t.tensor, 64, StageKey(2));
  Status st = VerifyStageTransfer(other, sender.public_key());
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Has(st, "but stage 0 of the replica is node")) << st.ToString();
}

TEST(StageTransferTest, ReceivedTensorsAreCheckedAgainstTheRecord) {
  const StageTransfer t = SignStageTransfer(ActivationKey(), Blake2b("tensor"), 64, StageKey(1));
  Status hash = CheckReceivedTensor(t, Blake2b("something else"), 64);
  EXPECT_FALSE(hash.ok());
  EXPECT_TRUE(Has(hash,
                  "replica 1, step 4, micro-batch 1: activation stage 0 -> 1: the tensor "
                  "received hashes to"))
      << hash.ToString();
  Status size = CheckReceivedTensor(t, Blake2b("tensor"), 60);
  EXPECT_TRUE(Has(size, "has 60 bytes, the signed record says 64")) << size.ToString();
}

TEST(StageTransferTest, DecodeRefusesBadShapesNamingThem) {
  const KeyPair sender = StageKey(1);
  const StageTransfer good = SignStageTransfer(ActivationKey(), Blake2b("tensor"), 64, sender);
  struct Case {
    std::string what;
    StageTransfer t;
    std::string message;
  };
  std::vector<Case> cases;
  auto with = [&](std::string what, auto edit, std::string message) {
    StageTransfer t = good;
    edit(t);
    cases.push_back({std::move(what), t, std::move(message)});
  };
  with(
      "no micro-batch", [](StageTransfer& t) { t.key.micro_batch = -1; }, "micro_batch -1");
  with(
      "backward activation", [](StageTransfer& t) { t.key.to_stage = 0; },
      "goes from a stage to the next one");
  with(
      "stage out of the chain", [](StageTransfer& t) { t.key.to_stage = 3; },
      "both stages must be below");
  with(
      "no stages", [](StageTransfer& t) { t.key.stages = 0; }, "stages 0 must be in");
  with(
      "odd size", [](StageTransfer& t) { t.bytes = 63; }, "multiple of 4");
  with(
      "grad total to itself",
      [](StageTransfer& t) {
        t.key.kind = StageTensorKind::kStageTensorGradTotal;
        t.key.micro_batch = -1;
        t.key.from_stage = 2;
        t.key.to_stage = 2;
        t.bytes = 4;
      },
      "from the last stage to an earlier one");
  with(
      "a sum of two floats",
      [](StageTransfer& t) {
        t.key.kind = StageTensorKind::kStageTensorGradSquares;
        t.key.micro_batch = -1;
        t.bytes = 8;
      },
      "must be 4 (one float32)");
  with(
      "tied weight to a middle stage",
      [](StageTransfer& t) {
        t.key.kind = StageTensorKind::kStageTensorTiedWeight;
        t.key.micro_batch = -1;
      },
      "from stage 0 to the last stage");
  for (const Case& c : cases) {
    Result<StageTransfer> r = DecodeStageTransfer(EncodeStageTransfer(c.t));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_TRUE(Has(r.status(), c.message)) << c.what << ": " << r.status().ToString();
  }
  Bytes wire = EncodeStageTransfer(good);
  Bytes kind = wire;
  kind[32 + 20 + 16] = 9;  // the kind byte
  EXPECT_TRUE(Has(DecodeStageTransfer(kind).status(), "kind 9 is not a stage tensor kind"));
  EXPECT_FALSE(DecodeStageTransfer(ByteSpan(wire.data(), wire.size() - 1)).ok());
  wire.push_back(0);
  EXPECT_FALSE(DecodeStageTransfer(wire).ok());
}

// Stage 1 of 3 at step 4 with two micro-batches: what it received and sent.
StageStepCommit MiddleStageCommit(const std::vector<KeyPair>& chain) {
  StageStepCommit c;
  c.task = Blake2b("task");
  c.round = 2;
  c.replica = 1;
  c.stage = 1;
  c.stages = 3;
  c.step = 4;
  c.state_before = Blake2b("before");
  c.state_after = Blake2b("after");
  auto key = [&](StageTensorKind kind, uint32_t from, uint32_t to, int64_t m) {
    StageTensorKey k = ActivationKey();
    k.kind = kind;
    k.from_stage = from;
    k.to_stage = to;
    k.micro_batch = m;
    return k;
  };
  using K = StageTensorKind;
  for (int64_t m = 0; m < 2; ++m) {
    c.received.push_back(SignStageTransfer(key(K::kStageTensorActivation, 0, 1, m),
                                           Blake2b("a" + std::to_string(m)), 32, chain[0]));
    c.sent.push_back(SignStageTransfer(key(K::kStageTensorActivation, 1, 2, m),
                                       Blake2b("b" + std::to_string(m)), 32, chain[1]));
  }
  for (int64_t m = 0; m < 2; ++m) {
    c.received.push_back(SignStageTransfer(key(K::kStageTensorActivationGrad, 2, 1, m),
                                           Blake2b("g" + std::to_string(m)), 32, chain[2]));
    c.sent.push_back(SignStageTransfer(key(K::kStageTensorActivationGrad, 1, 0, m),
                                       Blake2b("h" + std::to_string(m)), 32, chain[1]));
  }
  c.received.push_back(
      SignStageTransfer(key(K::kStageTensorGradSquares, 0, 1, -1), Blake2b("s0"), 4, chain[0]));
  c.sent.push_back(
      SignStageTransfer(key(K::kStageTensorGradSquares, 1, 2, -1), Blake2b("s1"), 4, chain[1]));
  c.received.push_back(
      SignStageTransfer(key(K::kStageTensorGradTotal, 2, 1, -1), Blake2b("t"), 4, chain[2]));
  return c;
}

TEST(StageStepCommitTest, RoundTripsAndItsLeafBindsEveryRecord) {
  const std::vector<KeyPair> chain = {StageKey(1), StageKey(2), StageKey(3)};
  const std::vector<NodeId> nodes = {chain[0].public_key(), chain[1].public_key(),
                                     chain[2].public_key()};
  const StageStepCommit c = MiddleStageCommit(chain);
  ASSERT_TRUE(ValidateStageStepCommit(c).ok()) << ValidateStageStepCommit(c).ToString();
  EXPECT_TRUE(VerifyStageStepSignatures(c, nodes).ok());
  Result<StageStepCommit> back = DecodeStageStepCommit(EncodeStageStepCommit(c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);
  const Hash256 leaf = StageStepLeaf(c);
  EXPECT_EQ(StageStepLeaf(*back), leaf);

  // Any record or hash changed: another leaf.
  StageStepCommit other = c;
  other.received[1].tensor = Blake2b("x");
  EXPECT_NE(StageStepLeaf(other), leaf);
  other = c;
  other.sent[3].signature.bytes[0] ^= 1;
  EXPECT_NE(StageStepLeaf(other), leaf);
  other = c;
  std::swap(other.sent[0], other.sent[1]);  // the order is the schedule's
  EXPECT_NE(StageStepLeaf(other), leaf);
  other = c;
  other.state_after = Blake2b("x");
  EXPECT_NE(StageStepLeaf(other), leaf);
  EXPECT_NE(StageCommitment({leaf, StageStepLeaf(other)}), StageCommitment({leaf, leaf}));

  // A record signed by a node that is not the sending stage's.
  other = c;
  other.received[0] = SignStageTransfer(c.received[0].key, c.received[0].tensor, 32, chain[1]);
  Status st = VerifyStageStepSignatures(other, nodes);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Has(st, "replica 1, step 4, micro-batch 0: activation stage 0 -> 1"))
      << st.ToString();
  EXPECT_FALSE(VerifyStageStepSignatures(c, {nodes[0], nodes[1]}).ok());
}

// A drawn stage's forced form (docs/verification.md, "Forced errors for stage units"): the
// records stay, step 0 starts at the true start, every later state is the unit's ForcedLeaf, so
// the chain of states runs on from step to step; every departure is named, and the H commits
// round-trip as RevealSecret carries them.
TEST(StageStepCommitTest, ADrawnStagesForcedFormKeepsItsRecordsAndForcesItsStates) {
  const std::vector<KeyPair> chain = {StageKey(1), StageKey(2), StageKey(3)};
  const StageStepCommit real = MiddleStageCommit(chain);
  const Hash256 secret = Blake2b("secret");
  // Replica 1, stage 1 of 3 in round 2: shard 4.
  const UnitId unit{real.task, real.round, 1 * 3 + 1};
  std::vector<StageStepCommit> commits;
  for (uint64_t j = 0; j < 3; ++j) {
    StageStepCommit c = real;
    c.step = j;
    for (std::vector<StageTransfer>* list : {&c.received, &c.sent}) {
      for (StageTransfer& t : *list) t.key.step = j;
    }
    c.state_before = Blake2b("state " + std::to_string(j));
    c.state_after = Blake2b("state " + std::to_string(j + 1));
    commits.push_back(c);
  }
  EXPECT_FALSE(CheckForcedStageForm(secret, unit, commits).ok()) << "the real states";
  std::vector<StageStepCommit> forced = commits;
  ForceStageStepStates(secret, unit, forced);
  ASSERT_TRUE(CheckForcedStageForm(secret, unit, forced).ok())
      << CheckForcedStageForm(secret, unit, forced).ToString();
  EXPECT_EQ(forced[0].state_before, commits[0].state_before);
  for (size_t j = 0; j < forced.size(); ++j) {
    EXPECT_EQ(forced[j].received, commits[j].received);
    EXPECT_EQ(forced[j].sent, commits[j].sent);
    EXPECT_EQ(forced[j].state_after, ForcedLeaf(secret, unit, j + 1));
    if (j > 0) {
      EXPECT_EQ(forced[j].state_before, forced[j - 1].state_after);
    }
  }
  auto refused = [&](auto edit, const std::string& message) {
    std::vector<StageStepCommit> x = forced;
    edit(x);
    Status st = CheckForcedStageForm(secret, unit, x);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << message;
    EXPECT_TRUE(Has(st, message)) << st.ToString();
  };
  refused([](auto& x) { x[1].state_before = Blake2b("x"); },
          "forced stage commit of step 1: state_before");
  refused([](auto& x) { x[2].state_after = Blake2b("x"); },
          "forced stage commit of step 2: state_after");
  refused([](auto& x) { std::swap(x[0], x[1]); },
          "forced stage commit of step 0: names replica "
          "1, stage 1, step 1, not unit");
  refused([](auto& x) { x[0].replica = 0; }, "forced stage commit of step 0: names");
  refused([](auto& x) { x[0].task = Blake2b("other"); }, "forced stage commit of step 0: names");
  // Another secret or another unit forces other states.
  EXPECT_FALSE(CheckForcedStageForm(Blake2b("other"), unit, forced).ok());

  Result<std::vector<StageStepCommit>> back =
      DecodeStageStepCommits(EncodeStageStepCommits(forced), 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, forced);
  EXPECT_TRUE(DecodeStageStepCommits(EncodeStageStepCommits({}), 3)->empty());
  EXPECT_FALSE(DecodeStageStepCommits(EncodeStageStepCommits(forced), 2).ok()) << "over the max";
  Bytes wire = EncodeStageStepCommits(forced);
  wire.push_back(0);
  EXPECT_FALSE(DecodeStageStepCommits(wire, 3).ok()) << "trailing bytes";
  wire.resize(wire.size() - 10);
  Status st = DecodeStageStepCommits(wire, 3).status();
  EXPECT_TRUE(Has(st, "stage step commits")) << st.ToString();
}

TEST(StageStepCommitTest, StructureIsValidated) {
  const std::vector<KeyPair> chain = {StageKey(1), StageKey(2), StageKey(3)};
  const StageStepCommit c = MiddleStageCommit(chain);
  auto refused = [&](auto edit, const std::string& message) {
    StageStepCommit x = c;
    edit(x);
    Status st = ValidateStageStepCommit(x);
    EXPECT_FALSE(st.ok()) << message;
    EXPECT_TRUE(Has(st, message)) << st.ToString();
    Result<StageStepCommit> decoded = DecodeStageStepCommit(EncodeStageStepCommit(x));
    EXPECT_FALSE(decoded.ok()) << message;
  };
  refused([&](StageStepCommit& x) { x.received.push_back(x.received[0]); }, "listed twice");
  refused([&](StageStepCommit& x) { x.received.push_back(x.sent[0]); }, "is not to this stage");
  refused([&](StageStepCommit& x) { x.sent.push_back(x.received[0]); }, "is not from this stage");
  refused(
      [&](StageStepCommit& x) {
        StageTensorKey k = x.received[0].key;
        k.step = 5;
        x.received[0] = SignStageTransfer(k, x.received[0].tensor, 32, chain[0]);
      },
      "belongs to another task, round, replica, chain or step");
  refused([&](StageStepCommit& x) { x.stage = 3; }, "stage must be below stages (3");
  Bytes wire = EncodeStageStepCommit(c);
  wire.push_back(1);
  EXPECT_FALSE(DecodeStageStepCommit(wire).ok());
}

// Mutated encodings (bytes changed, cut, added): decoding never crashes, and whatever decodes
// re-encodes to exactly the input (one value, one encoding), so a record's id and a commit's leaf
// name one thing.
Bytes StageMutate(Rng& rng, Bytes b) {
  const uint64_t edits = 1 + rng.Uniform(4);
  for (uint64_t i = 0; i < edits; ++i) {
    switch (rng.Uniform(4)) {
      case 0:
      case 1:
        if (!b.empty()) b[rng.Uniform(b.size())] = static_cast<uint8_t>(rng.Uniform(256));
        break;
      case 2:
        if (!b.empty()) b.resize(rng.Uniform(b.size()));
        break;
      default:
        b.push_back(static_cast<uint8_t>(rng.Uniform(256)));
        break;
    }
  }
  return b;
}

TEST(StageTransferTest, MutatedEncodingsDecodeToThemselvesOrNotAtAll) {
  const std::vector<KeyPair> chain = {StageKey(1), StageKey(2), StageKey(3)};
  const Bytes record = EncodeStageTransfer(MiddleStageCommit(chain).received[0]);
  const Bytes commit = EncodeStageStepCommit(MiddleStageCommit(chain));
  Rng rng(15);
  int decoded_records = 0, decoded_commits = 0;
  for (int i = 0; i < 4000; ++i) {
    const Bytes r = StageMutate(rng, record);
    Result<StageTransfer> t = DecodeStageTransfer(r);
    if (t.ok()) {
      ++decoded_records;
      ASSERT_EQ(EncodeStageTransfer(*t), r) << "mutation " << i;
    }
    const Bytes c = StageMutate(rng, commit);
    Result<StageStepCommit> sc = DecodeStageStepCommit(c);
    if (sc.ok()) {
      ++decoded_commits;
      ASSERT_EQ(EncodeStageStepCommit(*sc), c) << "mutation " << i;
    }
  }
  // Some mutations still decode (a changed hash byte is still a record): both paths are run.
  EXPECT_GT(decoded_records, 0);
  EXPECT_GT(decoded_commits, 0);
}

}  // namespace
}  // namespace meshlearn::protocol

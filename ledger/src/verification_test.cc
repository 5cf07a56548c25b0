// Verified training on the ledger (verification.cc): committed units checked through blocks by
// simulated solvers, verifiers, a whistleblower and the referee — clean work paid, a cheater
// caught through the dispute game (silent or overruled by the referee), a lying verifier slashed,
// a rubber stamp caught by a forced error and by a whistleblower, a crashed solver not slashed,
// and every new transaction's failure paths. Every block is replayed by a follower (same state
// hash) and the token invariant is checked after it.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "execute.h"
#include "meshlearn/base/blob.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/state_blob.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using protocol::CheckResult;
using protocol::CheckStage;
using protocol::RoundPhase;
using protocol::UnitCheck;
using protocol::Verdict;
using testing::ExpectRulings;
using testing::FollowedChainFixture;
using testing::RulingBy;
using testing::TestKey;
using testing::TestTaskParams;

using testing::kTestPrice;
using testing::kTestUnitCost;
constexpr Amount kStake = 100'000;
constexpr uint32_t kSlashMultiple = 10;

// State hashes of a unit's training, as the simulated parties see them: the honest state after
// step s, and a lazy solver's (right at step 0, wrong after).
Hash256 TrueState(uint32_t index, uint64_t step) {
  if (step == 0) return Hasher("start").UpdateU64(index).Finish();
  return Hasher("true").UpdateU64(index).UpdateU64(step).Finish();
}
Hash256 LazyState(uint32_t index, uint64_t step) {
  if (step == 0) return TrueState(index, 0);
  return Hasher("lazy").UpdateU64(index).UpdateU64(step).Finish();
}

class VerificationTest : public FollowedChainFixture {
 protected:
  VerificationTest()
      : dave_(TestKey(4)), erin_(TestKey(5)), frank_(TestKey(6)), gina_(TestKey(7)),
        referee_(TestKey(8)), s1_(TestKey(21)), s2_(TestKey(22)), v1_(TestKey(23)),
        v2_(TestKey(24)), wb_(TestKey(25)), agg_(TestKey(26)) {
    genesis_ = DevnetGenesis({alice_.public_key(), bob_.public_key(), carol_.public_key(),
                              dave_.public_key(), erin_.public_key(), frank_.public_key(),
                              gina_.public_key(), referee_.public_key()},
                             kFunds, "verify-chain");
    testing::SetVerifyingTestParams(genesis_.params);
    genesis_.params.slash_multiple = kSlashMultiple;
    genesis_.referee = referee_.public_key();
    owner_[s1_.public_key()] = &alice_;
    owner_[s2_.public_key()] = &bob_;
    owner_[v1_.public_key()] = &carol_;
    owner_[v2_.public_key()] = &dave_;
    owner_[wb_.public_key()] = &erin_;
    owner_[agg_.public_key()] = &frank_;
  }

  static Hash256 SeedOf(const KeyPair& node) { return Blake2b("secret seed " + node.public_key().ToHex()); }
  static Hash256 Secret(const KeyPair& node, uint64_t i) {
    return protocol::SecretChainElement(SeedOf(node), i);
  }

  // A node's transaction, signed by its owner.
  Transaction N(const KeyPair& node, TxPayload p) { return Q(*owner_.at(node.public_key()), p); }
  // Commit, then prove (CommitProofTx): the commitment to `proof` for `prover` (an account's own
  // key, sent with Q, or a node's, sent by its owner with N).
  static CommitProofTx CommitOf(const TxPayload& proof, const PublicKey& prover) {
    return {.commitment = ProofCommitment(*ProofWitnessIdOf(proof), prover), .prover = prover};
  }

  void StepOk(std::vector<Transaction> txs) {
    for (const Receipt& r : Step(std::move(txs))) EXPECT_TRUE(r.ok) << r.reason;
  }
  void Steps(int n) {
    for (int i = 0; i < n; ++i) Step();
  }

  RegisterNodeTx Reg(const KeyPair& node, uint32_t roles) {
    return RegisterNodeTx{.node_id = node.public_key(),
                          .endpoint = "http://node:1",
                          .roles = roles,
                          .capabilities = {.cores = 4,
                                           .memory_bytes = 1ull << 30,
                                           .throughput = 1'000'000'000'000,
                                           .latency_ms = 1,
                                           .bandwidth_bytes_per_s = 1'000'000'000},
                          .price = kTestPrice,
                          .stake = kStake,
                          .secret_head = Secret(node, 0)};
  }

  // Registers the nodes (`verifiers` of v1, v2 with the verifier role) and submits a task of
  // one round of two units (H = 4, k = 2: 2 segments, 3 leaves).
  void Start(int verifiers = 1, uint32_t tolerance_ppm = 0, Amount s1_stake = kStake) {
    RegisterNodes(verifiers, s1_stake);
    StepOk({SubmitTask(tolerance_ppm)});
  }

  void RegisterNodes(int verifiers = 1, Amount s1_stake = kStake) {
    RegisterNodeTx s1 = Reg(s1_, kRoleSolver);
    s1.stake = s1_stake;
    std::vector<Transaction> txs = {N(s1_, s1), N(s2_, Reg(s2_, kRoleSolver)),
                                    N(wb_, Reg(wb_, kRoleWhistleblower)),
                                    N(agg_, Reg(agg_, kRoleAggregator))};
    if (verifiers >= 1) txs.push_back(N(v1_, Reg(v1_, kRoleVerifier)));
    if (verifiers >= 2) txs.push_back(N(v2_, Reg(v2_, kRoleVerifier)));
    StepOk(txs);
  }

  // Start's SubmitTask (its id in task_id_, its budget in budget_), to send.
  Transaction SubmitTask(uint32_t tolerance_ppm = 0) {
    TaskParams p = TestTaskParams();
    p.rounds = rounds_;
    p.units_per_round = 2;
    p.num_examples = num_examples_;
    p.data_page_tokens = data_page_tokens_;
    if (model_bytes_ != 0) p.model_bytes = model_bytes_;
    p.verification_window_blocks = 12;
    p.tolerance_rel_l2_ppm = tolerance_ppm;
    p.assurance = assurance_;
    p.target_escape_ppm = target_escape_ppm_;
    Amount unit_cost = 0;
    Amount budget = MaxTaskCost(p, 20, &unit_cost, genesis_.params.verifiers_per_unit);
    p.data_root = data_root_;
    p.initial_state = initial_state_;
    Transaction submit = Q(gina_, SubmitTaskTx{.spec_hash = spec_hash_,
                                               .budget = budget,
                                               .price_cap = 20,
                                               .params = p});
    task_id_ = TaskIdFor(gina_.public_key(), submit.nonce);
    budget_ = budget;
    return submit;
  }

  TaskRecord Task() { return chain_->GetTask(task_id_).value(); }
  protocol::RoundStateMachine Machine() {
    return protocol::RoundStateMachine::Decode(Task().runtime).value();
  }
  WorkUnit Unit(uint32_t index) { return chain_->GetWorkUnit(task_id_, index).value(); }
  NodeRecord Node(const KeyPair& k) { return chain_->GetNode(k.public_key()).value(); }
  // The nodes' earnings (written where each payment is made) add up to the task's own tallies.
  void ExpectEarningsAddUpToTheTask() {
    NodeEarnings all;
    for (const NodeRecord& n : chain_->ListNodes(0, 1000)) {
      all.units += n.earnings.units;
      all.aggregation += n.earnings.aggregation;
      all.verification += n.earnings.verification;
      all.jackpot += n.earnings.jackpot;
      all.slashed += n.earnings.slashed;
      all.clawed_back += n.earnings.clawed_back;
    }
    const TaskRecord t = Task();
    Amount aggregators = 0;
    for (const RoundResult& r : t.round_results) aggregators += r.aggregator_paid;
    EXPECT_EQ(all.verification, t.verification.verifiers_paid);
    EXPECT_EQ(all.jackpot, t.verification.jackpot_paid);
    EXPECT_EQ(all.slashed, t.verification.slashed);
    EXPECT_EQ(all.clawed_back, t.verification.clawed_back);
    if (t.verification.rounds_rewound == 0) {  // a rewound round's records were reset
      EXPECT_EQ(all.aggregation, aggregators);
      Amount units = 0;
      for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) units += u.paid;
      EXPECT_EQ(all.units, units);
      // What the escrow paid out, each kind counted once.
      EXPECT_EQ(all.units + all.aggregation + all.verification, t.spent);
    }
  }
  UnitCheck Check(uint32_t index) { return UnitCheck::Decode(Unit(index).check).value(); }
  // False once the unit's round re-ran (its check was dropped).
  bool HasCheck(uint32_t index) { return !Unit(index).check.empty(); }
  const KeyPair& Key(const PublicKey& id) {
    for (const KeyPair* k : {&s1_, &s2_, &v1_, &v2_, &wb_, &agg_}) {
      if (k->public_key() == id) return *k;
    }
    ADD_FAILURE() << "unknown node " << id.ShortHex();
    return s1_;
  }
  // The unit assigned to `solver` (its first), or -1.
  int UnitOf(const KeyPair& solver) {
    for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) {
      if (u.assignee == solver.public_key() && u.status == WorkUnitStatus::kAssigned) {
        return static_cast<int>(u.index);
      }
    }
    return -1;
  }

  // The units s1 and s2 are assigned next (stepping until both have one), or -1.
  std::pair<int, int> NextUnitsOfBothSolvers() {
    int p = -1, h = -1;
    for (int i = 0; i < 10 && (p < 0 || h < 0); ++i) {
      p = UnitOf(s1_), h = UnitOf(s2_);
      if (p < 0 || h < 0) Step();
    }
    return {p, h};
  }
  // A task whose cheater (s1) was caught and rewound out: every unit is s2's, verified and paid.
  void ExpectOnlyTheHonestSolversWorkPaid() {
    for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) {
      EXPECT_EQ(u.assignee, s2_.public_key()) << u.index;
      EXPECT_EQ(u.status, WorkUnitStatus::kVerified) << u.index;
      EXPECT_EQ(u.paid, kTestUnitCost) << u.index;
    }
    EXPECT_EQ(Node(s2_).reputation.slashes, 0u);
  }

  static std::vector<Hash256> Leaves(uint32_t index, bool lazy) {
    std::vector<Hash256> l;
    for (uint64_t s : {0, 2, 4}) l.push_back(lazy ? LazyState(index, s) : TrueState(index, s));
    return l;
  }
  // A solver's commit of unit `index` with these leaves.
  Transaction CommitTx(uint32_t index, const std::vector<Hash256>& leaves,
                       std::optional<Hash256> result = std::nullopt) {
    const WorkUnit u = Unit(index);
    const KeyPair& solver = Key(u.assignee);
    uint64_t next = Node(solver).secrets_committed + 1 + pending_secrets_[u.assignee]++;
    return N(solver, CommitUnitTx{.task_id = task_id_,
                                  .index = index,
                                  .node_id = u.assignee,
                                  .result_hash =
                                      result.value_or(Blake2b("delta " + std::to_string(index))),
                                  .commitment = MerkleRoot(leaves),
                                  .loss_micros = 1,
                                  .secret_index = next,
                                  .leaves = leaves});
  }
  void CommitAll(const std::map<uint32_t, bool>& lazy) {
    std::vector<Transaction> txs;
    for (const auto& [index, l] : lazy) txs.push_back(CommitTx(index, Leaves(index, l)));
    pending_secrets_.clear();
    StepOk(txs);
  }

  static MismatchClaimField ClaimOf(const std::vector<Hash256>& leaves, uint32_t segment,
                                    const Hash256& replayed) {
    auto proof = [&](uint64_t i) {
      MerkleProof p = MerkleProve(leaves, i);
      return MerkleProofField{.index = p.index, .leaf_count = p.leaf_count, .siblings = p.siblings};
    };
    return MismatchClaimField{.segment = segment,
                              .start = leaves[segment],
                              .start_proof = proof(segment),
                              .solver_end = leaves[segment + 1],
                              .end_proof = proof(segment + 1),
                              .replayed_end = replayed};
  }

  // A verifier's verdict on unit `index`: sealed now, opened by Reveal later.
  struct Sealed {
    Verdict verdict;
    Hash256 salt;
    MismatchClaimField claim;
  };
  Transaction SealTx(const KeyPair& verifier, uint32_t index, const Sealed& v) {
    const UnitCheck c = Check(index);
    Hash256 evidence = v.verdict == Verdict::kVerdictMismatch
                           ? protocol::MismatchEvidence(v.claim.segment, v.claim.replayed_end)
                           : Hash256{};
    return N(verifier, CommitVerdictTx{.task_id = task_id_,
                                       .index = index,
                                       .node_id = verifier.public_key(),
                                       .commitment = protocol::VerdictCommitment(
                                           v.verdict, v.salt, verifier.public_key(),
                                           c.config().unit, evidence)});
  }
  Transaction RevealTx(const KeyPair& verifier, uint32_t index, const Sealed& v) {
    return N(verifier, RevealVerdictTx{.task_id = task_id_,
                                       .index = index,
                                       .node_id = verifier.public_key(),
                                       .verdict = static_cast<uint8_t>(v.verdict),
                                       .salt = v.salt,
                                       .claim = v.claim});
  }
  Transaction SecretTx(uint32_t index) {
    const WorkUnit u = Unit(index);
    const KeyPair& solver = Key(u.assignee);
    return N(solver, RevealSecretTx{.task_id = task_id_,
                                    .index = index,
                                    .node_id = u.assignee,
                                    .secret = Secret(solver, u.secret_index),
                                    .start_leaf = TrueState(index, 0)});
  }
  // Steps until unit `index`'s check is in `stage` (at most `limit` blocks).
  void StepUntil(uint32_t index, CheckStage stage, int limit = 10) {
    for (int i = 0; i < limit && HasCheck(index) && Check(index).stage() != stage; ++i) Step();
    ASSERT_TRUE(HasCheck(index)) << "the round re-ran";
    ASSERT_EQ(Check(index).stage(), stage) << CheckStageName(Check(index).stage());
  }
  // Steps until the check settles or the round re-runs (which drops it).
  void StepUntilDone(uint32_t index, int limit = 10) {
    for (int i = 0; i < limit && HasCheck(index) &&
                    Check(index).stage() != CheckStage::kCheckSettled;
         ++i) {
      Step();
    }
  }
  // Units `a` and `b` committed honestly and aggregated, v1 the verifier of both, its clean
  // verdicts sealed and revealed with the solvers' secrets; steps until a's check is done.
  void SettleBothClean(int a, int b) {
    CommitAll({{a, false}, {b, false}});
    Aggregate();
    Sealed clean_a = Clean(), clean_b = Clean();
    StepOk({SealTx(v1_, a, clean_a), SealTx(v1_, b, clean_b)});
    StepUntil(a, CheckStage::kCheckRevealVerdicts);
    StepOk({RevealTx(v1_, a, clean_a), RevealTx(v1_, b, clean_b), SecretTx(a), SecretTx(b)});
    StepUntilDone(a);
  }
  Sealed Clean() { return Sealed{Verdict::kVerdictClean, Blake2b("salt " + std::to_string(++salt_)), {}}; }
  Sealed Mismatch(uint32_t index, uint32_t segment, bool solver_lazy, const Hash256& replayed) {
    return Sealed{Verdict::kVerdictMismatch, Blake2b("salt " + std::to_string(++salt_)),
                  ClaimOf(Leaves(index, solver_lazy), segment, replayed)};
  }
  // The verifier drawn for unit `index`.
  const KeyPair& VerifierOf(uint32_t index) { return Key(Check(index).verifiers().at(0)); }

  // Plays the dispute on unit `index`: the defender posts `defender(step)`, the challenger
  // `challenger(step)` (a party whose function is null stays silent) until it resolves or
  // reaches the referee.
  void PlayDispute(uint32_t index, std::function<Hash256(uint64_t)> defender,
                   std::function<Hash256(uint64_t)> challenger) {
    auto of = [](std::function<Hash256(uint64_t)> f) -> std::function<Hash256(uint32_t, uint64_t)> {
      if (!f) return nullptr;
      return [f](uint32_t, uint64_t step) { return f(step); };
    };
    PlayDisputes({index}, of(std::move(defender)), of(std::move(challenger)));
  }
  // PlayDispute for the disputes on several units at once, a turn of each in the same block (the
  // functions are given the unit and the step): games opened in one block are ruled in one.
  void PlayDisputes(const std::vector<uint32_t>& indices,
                    std::function<Hash256(uint32_t, uint64_t)> defender,
                    std::function<Hash256(uint32_t, uint64_t)> challenger) {
    for (int turn = 0; turn < 20; ++turn) {
      std::vector<Transaction> txs;
      bool playing = false;
      for (uint32_t index : indices) {
        if (!HasCheck(index)) continue;
        const UnitCheck c = Check(index);
        if (c.stage() != CheckStage::kCheckDisputed) continue;
        const protocol::DisputeGame& g = *c.dispute();
        if (g.stage() != protocol::DisputeStage::kDisputeSteps) continue;
        playing = true;
        const uint64_t pos = g.query().position;
        if (defender) {
          txs.push_back(N(Key(g.config().defender),
                          DisputePostTx{.task_id = task_id_, .index = index,
                                        .node_id = g.config().defender, .position = pos,
                                        .hash = defender(index, pos)}));
        }
        if (challenger) {
          txs.push_back(N(Key(g.config().challenger),
                          DisputePostTx{.task_id = task_id_, .index = index,
                                        .node_id = g.config().challenger, .position = pos,
                                        .hash = challenger(index, pos)}));
        }
      }
      if (!playing) return;
      StepOk(txs);
      if (!defender || !challenger) Steps(genesis_.params.dispute_response_blocks + 1);
    }
  }

  // The round restarted (a rewind): no unit committed, no aggregate, units pending or assigned.
  bool Rerunning() {
    protocol::RoundStateMachine m = Machine();
    return (m.phase() == RoundPhase::kRoundPhaseAssigning ||
            m.phase() == RoundPhase::kRoundPhaseTraining) &&
           m.CommittedUnits().empty() && Task().round_results.size() == m.round();
  }

  // The aggregator commits the round (at once: the round is final only once its checks settle
  // and its verification window closes).
  void Aggregate() {
    for (int i = 0; i < 10 && !Machine().aggregator(); ++i) Step();
    ASSERT_TRUE(Machine().aggregator().has_value());
    StepOk({N(agg_, CommitAggregateTx{.task_id = task_id_, .round = Machine().round(),
                                      .node_id = agg_.public_key(),
                                      .state_hash = Blake2b("aggregate"),
                                      .test_accuracy_ppm = 900'000})});
  }
  void FinishTask() {
    for (int i = 0; i < 40 && Task().status == TaskStatus::kOpen; ++i) Step();
    ASSERT_EQ(Task().status, TaskStatus::kFinished);
  }

  KeyPair dave_, erin_, frank_, gina_, referee_;
  KeyPair s1_, s2_, v1_, v2_, wb_, agg_;
  std::map<PublicKey, const KeyPair*> owner_;
  std::map<PublicKey, uint64_t> pending_secrets_;
  Hash256 task_id_;
  Amount budget_ = 0;
  int salt_ = 0;
  // The task Start() submits: a bundle that is not a real task and a data root over no real
  // examples (no dispute over it reaches a ruling: the ledger would rule it from the bundle and
  // the examples), unless a fixture sets them.
  Hash256 spec_hash_ = Blake2b("bundle");
  Hash256 data_root_ = testing::TestTaskParams().data_root;
  Hash256 initial_state_ = testing::TestTaskParams().initial_state;
  // The task's assurance (TaskParams::assurance), economic unless a test sets it before Start.
  uint8_t assurance_ = 0;
  uint32_t target_escape_ppm_ = 0;
  uint32_t rounds_ = 1;  // of the task Start submits
  // Its data: 200 examples, unless a fixture sets a token stream (its tokens, a data root over
  // its pages, and the model's size, which gives a GPT its vocabulary).
  uint64_t num_examples_ = 200;
  uint32_t data_page_tokens_ = 0;
  uint64_t model_bytes_ = 0;  // 0: TestTaskParams'

  // Unit `lazy` is committed lazy and `honest` honestly; v1 claims a mismatch in the lazy one's
  // segment 0 and calls the other clean; both solvers reveal their secrets; the lazy unit's
  // dispute opens. (The aggregator works at once; the round is final only after the checks.)
  void CommitAndDispute(int lazy, int honest) {
    CommitAll({{lazy, true}, {honest, false}});
    Aggregate();
    Sealed caught = Mismatch(lazy, 0, /*solver_lazy=*/true, TrueState(lazy, 2));
    Sealed ok = Clean();
    StepOk({SealTx(v1_, lazy, caught), SealTx(v1_, honest, ok)});
    StepUntil(lazy, CheckStage::kCheckRevealVerdicts);
    StepOk({RevealTx(v1_, lazy, caught), RevealTx(v1_, honest, ok), SecretTx(lazy),
            SecretTx(honest)});
    StepUntil(lazy, CheckStage::kCheckDisputed);
  }

  // The verifier drawn for each of `units` (checks in the commit-verdicts stage) seals "clean",
  // then reveals it with the solvers' secrets; steps until every check settled.
  void SettleClean(const std::vector<int>& units) {
    std::map<int, Sealed> verdicts;
    std::vector<Transaction> seal, reveal;
    for (int index : units) {
      verdicts[index] = Clean();
      seal.push_back(SealTx(VerifierOf(index), index, verdicts[index]));
    }
    StepOk(seal);
    StepUntil(units.front(), CheckStage::kCheckRevealVerdicts);
    for (const auto& [index, v] : verdicts) {
      reveal.push_back(RevealTx(VerifierOf(index), index, v));
      reveal.push_back(SecretTx(index));
    }
    StepOk(reveal);
    for (int index : units) StepUntilDone(index);
  }

  // Every unit of the current round committed honestly, aggregated, checked clean, and the round
  // final (the machine moved on).
  void RunHonestRound() {
    const uint32_t round = Machine().round();
    std::map<uint32_t, bool> units;
    for (int i = 0; i < 10 && units.size() < 2; ++i) {
      units.clear();
      for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) {
        if (u.round == round && u.status == WorkUnitStatus::kAssigned) units[u.index] = false;
      }
      if (units.size() < 2) Step();
    }
    ASSERT_EQ(units.size(), 2u) << "round " << round << " is not assigned";
    CommitAll(units);
    Aggregate();
    std::vector<int> indices;
    for (const auto& [index, lazy] : units) indices.push_back(static_cast<int>(index));
    SettleClean(indices);
    for (int i = 0; i < 40 && Machine().round() == round &&
                    Machine().phase() != RoundPhase::kRoundPhaseFinal;
         ++i) {
      Step();
    }
  }
};

// Taint: a solver whose round-0 unit passed its check (its corrupted second segment was not the
// one replayed) and that is proven fraudulent in round 1 takes the task back to round 0. The
// round-0 aggregate it was in is forgotten, every unit of round 0 runs again without it, what it
// was paid for round 0 comes back out of its stake into the escrow, and the honest solver's
// redo is paid anew; the task finishes with none of the cheater's work.
// Rounds in flight: round 1 trains from round 0's aggregate while round 0's checks run. Fraud
// proven in round 0 then takes the task back to round 0 and drops round 1, whose units (the
// cheater's honest-looking one included) were built on the poisoned aggregate; none of it is
// paid, and the task ends with the honest solver's work only.
// Tests of more than one round: round 1 is assigned as soon as round 0 aggregates (rounds in
// flight), and its assignments must outlive the blocks a test spends on round 0's checks (a
// node trains them meanwhile; the test commits them when it gets to them).
class InFlightVerificationTest : public VerificationTest {
 protected:
  InFlightVerificationTest() { genesis_.params.min_deadline_blocks = 40; }
};

TEST_F(InFlightVerificationTest, FraudInASettlingRoundDropsTheRoundTrainedOnIt) {
  rounds_ = 2;
  Start();
  const int p0 = UnitOf(s1_), h0 = UnitOf(s2_);
  ASSERT_GE(p0, 0);
  ASSERT_GE(h0, 0);
  CommitAndDispute(p0, h0);
  ASSERT_EQ(Machine().round(), 1u);  // started while round 0 settles
  EXPECT_EQ(Machine().final_rounds(), 0u);
  EXPECT_EQ(Machine().weights_history().back(), Blake2b("aggregate"));
  const auto [p1, h1] = NextUnitsOfBothSolvers();
  ASSERT_GE(p1, 2);
  ASSERT_GE(h1, 2);
  CommitAll({{p1, false}, {h1, false}});
  EXPECT_EQ(Unit(p1).status, WorkUnitStatus::kCommitted);
  PlayDispute(p0, nullptr, [&](uint64_t s) { return TrueState(p0, s); });

  EXPECT_EQ(Machine().round(), 0u);
  EXPECT_EQ(Machine().round_weights(), initial_state_);
  EXPECT_TRUE(Task().round_results.empty());
  const VerificationTally tally = Task().verification;
  EXPECT_EQ(tally.fraud, 1u);
  EXPECT_EQ(tally.rounds_dropped, 1u);
  EXPECT_EQ(tally.rounds_rewound, 0u);  // no earlier round held its work
  EXPECT_EQ(tally.clawed_back, 0u);     // nothing was paid: no round was final
  EXPECT_EQ(TaskToJson(Task())["verification"]["rounds_dropped"], 1u);
  EXPECT_EQ(Node(s1_).stake, kStake - kSlashMultiple * kTestUnitCost);
  EXPECT_EQ(Node(s1_).earnings.units, 0u);
  for (int u : {p0, h0, p1, h1}) {
    EXPECT_EQ(Unit(u).paid, 0u) << u;
    EXPECT_NE(Unit(u).status, WorkUnitStatus::kCommitted) << u;
    EXPECT_FALSE(HasCheck(u)) << u;
  }
  RunHonestRound();
  RunHonestRound();
  FinishTask();
  ExpectOnlyTheHonestSolversWorkPaid();
  ExpectEarningsAddUpToTheTask();
}

// A check's windows close early once everyone is in, but a solver's reveal windows still open in
// the order of its secrets: revealing a later unit's secret reveals every earlier one, so a unit
// whose verdicts are in waits while an earlier unit of the same solver still awaits its verdicts
// (a lazy verifier of that one would otherwise learn whether it is a forced error).
class SecretOrderTest : public InFlightVerificationTest {
 protected:
  SecretOrderTest() { genesis_.params.verdict_commit_blocks = 30; }
};

TEST_F(SecretOrderTest, ALaterSecretWaitsForTheVerdictsOnAnEarlierUnit) {
  rounds_ = 2;
  Start();
  const int p0 = UnitOf(s1_), h0 = UnitOf(s2_);
  ASSERT_GE(p0, 0);
  ASSERT_GE(h0, 0);
  CommitAll({{p0, false}, {h0, false}});
  Aggregate();  // round 1 trains while round 0 settles
  StepUntil(p0, CheckStage::kCheckCommitVerdicts);
  const Sealed v_p0 = Clean(), v_h0 = Clean();
  StepOk({SealTx(v1_, h0, v_h0)});  // nobody has committed a verdict on p0 yet
  EXPECT_EQ(Check(h0).stage(), CheckStage::kCheckRevealVerdicts);  // early: all verdicts in
  StepOk({RevealTx(v1_, h0, v_h0), SecretTx(h0)});
  EXPECT_EQ(Check(h0).stage(), CheckStage::kCheckSettled);

  const auto [p1, h1] = NextUnitsOfBothSolvers();
  ASSERT_GE(p1, 2);
  ASSERT_GE(h1, 2);
  CommitAll({{p1, false}, {h1, false}});
  ASSERT_GT(Unit(p1).secret_index, Unit(p0).secret_index);
  StepUntil(p1, CheckStage::kCheckCommitVerdicts);
  const Sealed v_p1 = Clean(), v_h1 = Clean();
  StepOk({SealTx(v1_, p1, v_p1), SealTx(v1_, h1, v_h1)});
  EXPECT_EQ(Check(h1).stage(), CheckStage::kCheckRevealVerdicts);
  EXPECT_EQ(Check(p1).stage(), CheckStage::kCheckCommitVerdicts);  // p0 still awaits its verdict
  const std::vector<Receipt> r = Step({RevealTx(v1_, h1, v_h1), SecretTx(h1), SecretTx(p1)});
  EXPECT_TRUE(r[0].ok && r[1].ok) << r[0].reason << r[1].reason;
  EXPECT_EQ(r[2].code, StatusCode::kFailedPrecondition) << r[2].reason;
  Steps(2);
  EXPECT_EQ(Check(p1).stage(), CheckStage::kCheckCommitVerdicts);
  // p0's verdict comes in: both of s1's reveal windows open with that block.
  StepOk({SealTx(v1_, p0, v_p0)});
  EXPECT_EQ(Check(p0).stage(), CheckStage::kCheckRevealVerdicts);
  EXPECT_EQ(Check(p1).stage(), CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, p0, v_p0), RevealTx(v1_, p1, v_p1), SecretTx(p0), SecretTx(p1)});
  for (int u : {p0, h0, p1, h1}) {  // everything is in: every check settled in that block
    EXPECT_EQ(Check(u).stage(), CheckStage::kCheckSettled) << u;
    EXPECT_EQ(Check(u).result(), protocol::CheckResult::kCheckClean) << u;
  }
  Aggregate();
  FinishTask();
  ExpectEarningsAddUpToTheTask();
}

TEST_F(InFlightVerificationTest, AProvenCheaterTaintsItsEarlierRounds) {
  rounds_ = 2;
  Start();
  const int p0 = UnitOf(s1_), h0 = UnitOf(s2_);
  ASSERT_GE(p0, 0);
  ASSERT_GE(h0, 0);
  const std::vector<Hash256> poisoned = {TrueState(p0, 0), TrueState(p0, 2), LazyState(p0, 4)};
  std::vector<Transaction> commits = {CommitTx(p0, poisoned), CommitTx(h0, Leaves(h0, false))};
  pending_secrets_.clear();
  StepOk(commits);
  Aggregate();
  Sealed a = Clean(), b = Clean();
  StepOk({SealTx(v1_, p0, a), SealTx(v1_, h0, b)});
  StepUntil(p0, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, p0, a), RevealTx(v1_, h0, b), SecretTx(p0), SecretTx(h0)});
  // Round 1 starts from round 0's aggregate at once (rounds in flight); round 0 becomes final
  // when its checks settled and its window closed.
  for (int i = 0; i < 40 && Task().rounds_settled == 0; ++i) Step();
  ASSERT_EQ(Machine().round(), 1u);
  ASSERT_EQ(Unit(p0).status, WorkUnitStatus::kVerified);
  const Amount paid_p0 = Unit(p0).paid;
  EXPECT_EQ(paid_p0, kTestUnitCost);
  ASSERT_EQ(Task().round_results.size(), 1u);

  // Round 1: s1 is lazy, the verifier catches it, it does not defend.
  const auto [p1, h1] = NextUnitsOfBothSolvers();
  ASSERT_GE(p1, 2);
  ASSERT_GE(h1, 2);
  CommitAndDispute(p1, h1);
  PlayDispute(p1, nullptr, [&](uint64_t s) { return TrueState(p1, s); });

  // Back to round 0, from the initial weights.
  EXPECT_EQ(Machine().round(), 0u);
  EXPECT_EQ(Machine().round_weights(), initial_state_);
  EXPECT_TRUE(Task().round_results.empty());
  EXPECT_EQ(Task().rounds_settled, 0u);
  const VerificationTally tally = Task().verification;
  EXPECT_EQ(tally.fraud, 1u);
  EXPECT_EQ(tally.rounds_rewound, 1u);
  EXPECT_EQ(tally.clawed_back, paid_p0);
  EXPECT_EQ(TaskToJson(Task())["verification"]["clawed_back"], paid_p0);
  EXPECT_EQ(Node(s1_).stake, kStake - kSlashMultiple * kTestUnitCost - paid_p0);
  // Its node keeps the record of both: paid for the unit, then the pay taken back.
  EXPECT_EQ(Node(s1_).earnings.units, paid_p0);
  EXPECT_EQ(Node(s1_).earnings.clawed_back, paid_p0);
  EXPECT_EQ(Node(s1_).earnings.slashed, kSlashMultiple * kTestUnitCost);
  const Amount s2_paid_before_rewind = Node(s2_).earnings.units;
  EXPECT_EQ(s2_paid_before_rewind, kTestUnitCost);  // h0, whose record the rewind reset
  for (int u : {p0, h0, p1, h1}) {
    EXPECT_NE(Unit(u).status, WorkUnitStatus::kVerified) << u;
    EXPECT_EQ(Unit(u).paid, 0u) << u;
    EXPECT_NE(Unit(u).assignee, s1_.public_key()) << u;
  }
  // The honest solver does both rounds again; nothing of the cheater's remains.
  RunHonestRound();
  ASSERT_EQ(Machine().round(), 1u);
  RunHonestRound();
  FinishTask();
  ExpectOnlyTheHonestSolversWorkPaid();
  // The honest solver keeps what it was paid for the rewound round, besides the redo's pay.
  Amount units = 0;
  for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) units += u.paid;
  EXPECT_EQ(Node(s2_).earnings.units, s2_paid_before_rewind + units);
  ExpectEarningsAddUpToTheTask();
}

// Assurance full: every unit is checked and every one of its segments replayed, and the
// verifier is paid for all of them; economic replays segments_per_check (1) of the 2.
class AssuranceChainTest : public VerificationTest, public ::testing::WithParamInterface<uint8_t> {};

TEST_P(AssuranceChainTest, FullReplaysEverySegmentOfEveryUnitEconomicOne) {
  const uint8_t level = GetParam();
  assurance_ = level;
  Start();
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  EXPECT_EQ(Task().params.assurance, level);
  const Amount v1_before = Balance(carol_);
  CommitAll({{u1, false}, {u2, false}});
  Step();  // the beacon
  for (int u : {u1, u2}) {
    ASSERT_EQ(Check(u).stage(), CheckStage::kCheckCommitVerdicts);
    EXPECT_EQ(Check(u).segments().size(), level == 1 ? 2u : 1u);
  }
  SettleClean({u1, u2});
  for (int u : {u1, u2}) EXPECT_EQ(Check(u).result(), CheckResult::kCheckClean);
  const Amount pay = protocol::VerifierPay(kTestUnitCost, level == 1 ? 2 : 1, 2);
  const Amount cut = BasisPoints(pay, genesis_.params.treasury_cut_bps);
  EXPECT_EQ(Task().verification.verifiers_paid, 2 * pay);
  EXPECT_EQ(Balance(carol_), v1_before + 2 * (pay - cut));
}

INSTANTIATE_TEST_SUITE_P(Levels, AssuranceChainTest, ::testing::Values(uint8_t{0}, uint8_t{1}),
                         [](const auto& info) {
                           return std::string(info.param == 1 ? "Full" : "Economic");
                         });

// Full assurance promises a replay by a node other than the solver: with no verifier registered
// the units wait for one, holding the round, instead of settling unchecked (economic settles them
// unchecked); once a verifier registers, the next block's beacon draws it for every segment.
TEST_F(VerificationTest, FullAssuranceWaitsForAVerifierInsteadOfSettlingUnchecked) {
  assurance_ = 1;
  Start(/*verifiers=*/0);
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  CommitAll({{u1, false}, {u2, false}});
  for (int i = 0; i < 30; ++i) Step();  // far past every window
  for (int u : {u1, u2}) {
    EXPECT_EQ(Check(u).stage(), CheckStage::kCheckAwaitingBeacon) << u;
    EXPECT_EQ(Unit(u).paid, 0u) << u;
  }
  EXPECT_NE(Machine().phase(), protocol::RoundPhase::kRoundPhaseFinal);
  EXPECT_EQ(Task().verification.unchecked, 0u);
  StepOk({N(v1_, Reg(v1_, kRoleVerifier))});
  Step();  // a beacon with a verifier
  for (int u : {u1, u2}) {
    ASSERT_EQ(Check(u).stage(), CheckStage::kCheckCommitVerdicts) << u;
    EXPECT_EQ(Check(u).verifiers(), std::vector<protocol::NodeId>{v1_.public_key()});
    EXPECT_EQ(Check(u).segments().size(), 2u);
  }
  SettleClean({u1, u2});
  for (int u : {u1, u2}) EXPECT_EQ(Check(u).result(), CheckResult::kCheckClean) << u;
}

TEST_F(VerificationTest, EconomicAssuranceWithoutAVerifierSettlesUnchecked) {
  Start(/*verifiers=*/0);
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  CommitAll({{u1, false}, {u2, false}});
  Step();  // the beacon: no verifier, so not checked
  for (int u : {u1, u2}) EXPECT_TRUE(Check(u).verifiers().empty()) << u;
}

// Verifiers are drawn only from live nodes (a heartbeat within liveness_blocks, the scheduler's
// rule): a verifier that fell silent -- killed, cut off -- would hold its check for the whole
// commit window. Two verifiers a unit, two verifier nodes: both are drawn while both are live.
class LiveVerifierTest : public VerificationTest {
 protected:
  LiveVerifierTest() {
    genesis_.params.liveness_blocks = kLiveness;
    genesis_.params.verifiers_per_unit = 2;
  }
  static constexpr uint64_t kLiveness = 6;

  // `blocks` blocks in which every node but those in `silent` heartbeats.
  void HeartbeatAllBut(const std::vector<const KeyPair*>& silent, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i) {
      std::vector<Transaction> txs;
      for (const KeyPair* k : {&s1_, &s2_, &v1_, &v2_, &wb_, &agg_}) {
        if (std::find(silent.begin(), silent.end(), k) != silent.end()) continue;
        txs.push_back(N(*k, HeartbeatTx{.node_id = k->public_key()}));
      }
      StepOk(txs);
    }
  }
  // The task submitted, both units committed honestly and their beacon drawn; the units.
  std::pair<int, int> CommitAndDraw() {
    StepOk({SubmitTask()});
    const auto [u1, u2] = NextUnitsOfBothSolvers();
    EXPECT_GE(u1, 0);
    EXPECT_GE(u2, 0);
    if (u1 < 0 || u2 < 0) return {u1, u2};
    CommitAll({{u1, false}, {u2, false}});
    Step();  // the beacon
    return {u1, u2};
  }
};

// v1 silent for more than liveness_blocks when the beacon draws: only v2 is drawn, to both units.
// (As every candidate was drawn before liveness counted, both units drew v1 too.)
TEST_F(LiveVerifierTest, AVerifierSilentForLivenessBlocksIsNotDrawn) {
  RegisterNodes(/*verifiers=*/2);
  HeartbeatAllBut({&v1_}, kLiveness + 1);
  EXPECT_GT(chain_->Height() - Node(v1_).last_heartbeat_height, kLiveness);
  const auto [u1, u2] = CommitAndDraw();
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  for (int u : {u1, u2}) {
    ASSERT_EQ(Check(u).stage(), CheckStage::kCheckCommitVerdicts) << u;
    EXPECT_EQ(Check(u).verifiers(), std::vector<protocol::NodeId>{v2_.public_key()}) << u;
  }
  SettleClean({u1, u2});
  for (int u : {u1, u2}) EXPECT_EQ(Check(u).result(), CheckResult::kCheckClean) << u;
}

// Where no verifier is live (a chain whose verifiers do not heartbeat), the draw is the one
// before liveness counted: every active verifier is a candidate, rather than no check at all.
TEST_F(LiveVerifierTest, WhereNoVerifierIsLiveEveryActiveOneIsDrawnAsBefore) {
  RegisterNodes(/*verifiers=*/2);
  HeartbeatAllBut({&v1_, &v2_}, kLiveness + 1);
  const auto [u1, u2] = CommitAndDraw();
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  for (int u : {u1, u2}) {
    ASSERT_EQ(Check(u).stage(), CheckStage::kCheckCommitVerdicts) << u;
    std::vector<protocol::NodeId> drawn = Check(u).verifiers();
    std::sort(drawn.begin(), drawn.end());
    std::vector<protocol::NodeId> both = {v1_.public_key(), v2_.public_key()};
    std::sort(both.begin(), both.end());
    EXPECT_EQ(drawn, both) << u;
  }
}

// The ledger refuses an assurance it cannot give or a malformed one, naming the field.
TEST_F(VerificationTest, AssuranceTermsAreChecked) {
  TaskParams p = TestTaskParams();
  const Amount budget = MaxTaskCost(p, 20, nullptr, 1);
  EXPECT_TRUE(ValidateTaskTerms(p, budget, 20, true, 1).ok());
  p.assurance = 1;
  EXPECT_TRUE(ValidateTaskTerms(p, budget, 20, true, 1).ok());
  Status unverified = ValidateTaskTerms(p, budget, 20, false, 1);
  EXPECT_NE(unverified.message().find("params.assurance is full but this chain does not verify"),
            std::string::npos)
      << unverified.ToString();
  p.assurance = 3;
  EXPECT_NE(ValidateTaskTerms(p, budget, 20, true, 1).message().find("params.assurance must be"),
            std::string::npos);
  p.assurance = 2;
  p.target_escape_ppm = 0;
  EXPECT_NE(ValidateTaskTerms(p, budget, 20, true, 1)
                .message()
                .find("params.target_escape_ppm must be in [1, 999999]"),
            std::string::npos);
  p.target_escape_ppm = 10'000;
  EXPECT_TRUE(ValidateTaskTerms(p, budget, 20, true, 1).ok());
}

TEST_F(VerificationTest, HonestWorkIsCheckedCleanAndEveryonePaid) {
  Start();
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  EXPECT_FALSE(Unit(u1).assignment_beacon.IsZero());
  const Amount v1_before = Balance(carol_);
  CommitAll({{u1, false}, {u2, false}});
  EXPECT_EQ(Unit(u1).secret_index, 1u);
  EXPECT_EQ(Node(s1_).secrets_committed, 1u);
  EXPECT_EQ(Check(u1).stage(), CheckStage::kCheckAwaitingBeacon);
  // The aggregate may come at once, but the round is not final while checks are open.
  Aggregate();
  EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);
  // New nodes: every unit is checked; v1 is the only verifier.
  for (int u : {u1, u2}) {
    ASSERT_EQ(Check(u).stage(), CheckStage::kCheckCommitVerdicts);
    EXPECT_EQ(Check(u).verifiers().at(0), v1_.public_key());
  }
  Sealed a = Clean(), b = Clean();
  StepOk({SealTx(v1_, u1, a), SealTx(v1_, u2, b)});
  StepUntil(u1, CheckStage::kCheckRevealVerdicts);
  // forced_commits is only for a pipeline stage unit its secret draws: a unit's reveal carrying
  // it is refused (in the reveals' block: the window is short).
  const RevealSecretTx with_commits{.task_id = task_id_, .index = static_cast<uint32_t>(u1),
                                    .node_id = s1_.public_key(),
                                    .secret = Secret(s1_, Unit(u1).secret_index),
                                    .start_leaf = TrueState(u1, 0),
                                    .forced_commits = {.bytes = {1, 2, 3}}};
  std::vector<Receipt> refused = Step({N(s1_, with_commits), RevealTx(v1_, u1, a),
                                       RevealTx(v1_, u2, b), SecretTx(u1), SecretTx(u2)});
  ASSERT_EQ(refused.size(), 5u);
  EXPECT_FALSE(refused[0].ok);
  EXPECT_NE(refused[0].reason.find("reveal secret: forced_commits is for a pipeline stage unit "
                                   "drawn for a forced error; unit " + std::to_string(u1)),
            std::string::npos) << refused[0].reason;
  for (size_t i = 1; i < refused.size(); ++i) EXPECT_TRUE(refused[i].ok) << refused[i].reason;
  EXPECT_EQ(Node(s1_).secret_anchor, Secret(s1_, 1));  // the anchor moved down the chain
  StepUntilDone(u1);
  for (int u : {u1, u2}) EXPECT_EQ(Check(u).result(), CheckResult::kCheckClean) << Check(u).reason();
  EXPECT_EQ(Node(s1_).reputation.units_verified_clean, 1u);
  EXPECT_EQ(Node(s1_).reputation.clean_streak, 1u);
  // The verifier replayed 1 of 2 segments of each unit: half a unit's cost each, less the cut.
  const Amount pay = protocol::VerifierPay(kTestUnitCost, 1, 2);
  const Amount cut = BasisPoints(pay, genesis_.params.treasury_cut_bps);
  EXPECT_EQ(Balance(carol_), v1_before + 2 * (pay - cut));
  EXPECT_EQ(Task().verification.clean, 2u);
  EXPECT_EQ(Task().verification.verifiers_paid, 2 * pay);
  EXPECT_EQ(Task().verification.slashed, 0u);
  // The verifier's node records both payments, before the cut, as the task does.
  EXPECT_EQ(Node(v1_).earnings.verification, 2 * pay);
  EXPECT_EQ(Node(v1_).earnings.checks_paid, 2u);
  EXPECT_EQ(NodeToJson(Node(v1_))["earnings"]["verification"], 2 * pay);
  FinishTask();
  EXPECT_EQ(Unit(u1).status, WorkUnitStatus::kVerified);
  EXPECT_EQ(Unit(u1).paid, kTestUnitCost);
  EXPECT_EQ(Node(s1_).earnings.units, kTestUnitCost);
  EXPECT_EQ(Node(agg_).earnings.aggregation, Task().round_results.at(0).aggregator_paid);
  EXPECT_GT(Node(agg_).earnings.aggregation, 0u);
  EXPECT_EQ(Node(s1_).earnings.verification + Node(s1_).earnings.jackpot, 0u);
  ExpectEarningsAddUpToTheTask();
  for (const KeyPair* k : {&s1_, &s2_, &v1_, &wb_, &agg_}) {
    EXPECT_EQ(Node(*k).reputation.slashes, 0u);
    EXPECT_EQ(Node(*k).stake, kStake);
  }
}

// A cancel pays committed work only once its check settled clean or unchecked, as a round's
// settlement does. Found by the chaos workload (node/src/chaos_test.cc, seed 46): a cancel paid
// every committed unit, checks still running, so a cheat committed just before a cancel was paid
// without anyone replaying it.
TEST_F(VerificationTest, ACancelPaysNoWorkWhoseCheckIsStillRunning) {
  Start();
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  CommitAll({{u1, true}, {u2, false}});  // s1 cheats; neither check has settled
  StepOk({Q(gina_, CancelTaskTx{.task_id = task_id_})});
  TaskRecord t = Task();
  EXPECT_EQ(t.status, TaskStatus::kCancelled);
  for (int u : {u1, u2}) EXPECT_EQ(Unit(u).paid, 0u) << u;
  EXPECT_EQ(t.spent, 0u);
  EXPECT_EQ(t.escrow, 0u);
  EXPECT_EQ(t.refunded, budget_);
  EXPECT_TRUE(chain_->CheckInvariants().ok());
}

TEST_F(VerificationTest, ACancelPaysWorkCheckedClean) {
  Start();
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  CommitAll({{u1, false}, {u2, false}});
  StepUntil(u1, CheckStage::kCheckCommitVerdicts);
  SettleClean({u1, u2});
  for (int u : {u1, u2}) ASSERT_EQ(Check(u).result(), CheckResult::kCheckClean) << u;
  StepOk({Q(gina_, CancelTaskTx{.task_id = task_id_})});
  EXPECT_EQ(Task().status, TaskStatus::kCancelled);
  for (int u : {u1, u2}) EXPECT_EQ(Unit(u).paid, kTestUnitCost) << u;
  EXPECT_EQ(Task().escrow, 0u);
  EXPECT_TRUE(chain_->CheckInvariants().ok());
}

TEST_F(VerificationTest, ALazySolverThatDoesNotDefendIsSlashedAndTheRoundReruns) {
  Start();
  const int lazy = UnitOf(s1_), honest = UnitOf(s2_);
  CommitAndDispute(lazy, honest);
  // A unit's dispute turns are the chain's flat dispute_response_blocks, whatever its work (32
  // GFLOP: a stage step of that work would get 2 x 321 blocks, CheckResponseBlocks).
  EXPECT_EQ(Check(lazy).config().dispute_response_blocks, genesis_.params.dispute_response_blocks);
  EXPECT_EQ(Check(lazy).dispute()->config().response_blocks,
            genesis_.params.dispute_response_blocks);
  EXPECT_EQ(CheckResponseBlocks(genesis_, Task().params, static_cast<uint32_t>(lazy)),
            genesis_.params.dispute_response_blocks);
  const Amount escrow_before = Task().escrow;
  const Amount v1_balance = Balance(carol_);
  // The verifier answers every turn with the true state; the cheater is silent and loses.
  PlayDispute(lazy, nullptr, [&](uint64_t s) { return TrueState(lazy, s); });
  NodeRecord cheater = Node(s1_);
  EXPECT_EQ(cheater.reputation.slashes, 1u);
  EXPECT_EQ(cheater.status, NodeStatus::kJailed);
  EXPECT_EQ(cheater.stake, kStake - kSlashMultiple * kTestUnitCost);
  // The round re-runs from its start: every unit given out again, the cheater excluded.
  EXPECT_TRUE(Rerunning());
  EXPECT_TRUE(Unit(lazy).check.empty());
  EXPECT_GT(Task().escrow, escrow_before);  // the cheater's stake pays for the redo
  const VerificationTally tally = Task().verification;  // kept though the checks were dropped
  EXPECT_EQ(tally.fraud, 1u);
  EXPECT_EQ(tally.disputes, 1u);
  EXPECT_EQ(tally.slashed, kSlashMultiple * kTestUnitCost);
  EXPECT_GT(tally.redo_escrow, 0u);
  EXPECT_EQ(TaskToJson(Task())["verification"]["fraud"], 1);
  EXPECT_GT(Balance(carol_), v1_balance);   // the verifier was paid and rewarded
  EXPECT_EQ(cheater.earnings.slashed, kSlashMultiple * kTestUnitCost);
  EXPECT_EQ(cheater.earnings.units, 0u);
  EXPECT_EQ(Node(v1_).earnings.jackpot, tally.jackpot_paid);
  EXPECT_GT(Node(v1_).earnings.jackpot, 0u);
  EXPECT_EQ(Node(v1_).earnings.jackpot_wins, 1u);
  ExpectEarningsAddUpToTheTask();
  // The honest solver does both units now; they are checked and the task finishes.
  Steps(1);
  EXPECT_EQ(Unit(lazy).assignee, s2_.public_key());
  EXPECT_EQ(Unit(honest).assignee, s2_.public_key());
  CommitAll({{lazy, false}, {honest, false}});
  Aggregate();
  Sealed a = Clean(), b = Clean();
  StepOk({SealTx(v1_, lazy, a), SealTx(v1_, honest, b)});
  StepUntil(lazy, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, lazy, a), RevealTx(v1_, honest, b), SecretTx(lazy), SecretTx(honest)});
  FinishTask();
  EXPECT_EQ(Balance(alice_), kFunds - kStake);  // the cheater's owner was never paid
  EXPECT_EQ(Unit(lazy).paid, kTestUnitCost);
  EXPECT_EQ(Node(s2_).reputation.slashes, 0u);
  EXPECT_EQ(Node(v1_).reputation.slashes, 0u);
  EXPECT_EQ(Node(s2_).secrets_committed, 3u);
  EXPECT_EQ(Node(s1_).earnings.units, 0u);
  ExpectEarningsAddUpToTheTask();
}

// No exact-mode dispute is left to the genesis key for lack of a data root: a verifying chain
// refuses an exact-mode task without one at SubmitTask (the ledger could prove none of its
// batches, so the key would rule its whole steps), naming the field and how to get it; nothing
// is escrowed and no task exists. A tolerance-mode task (the key rules its segments anyway)
// still gets on chain without one.
TEST_F(VerificationTest, AnExactModeTaskWithoutADataRootNeverGetsOnChain) {
  RegisterNodes();
  data_root_ = Hash256{};
  const Amount funds = Balance(gina_);
  std::vector<Receipt> r = Step({SubmitTask()});
  EXPECT_EQ(r[0].code, StatusCode::kInvalidArgument) << r[0].reason;
  EXPECT_NE(r[0].reason.find("submit task: params.data_root is zero: an exact-mode task "
                             "(params.tolerance_rel_l2_ppm and params.tolerance_cosine_gap_ppb "
                             "both 0) on a verifying chain"),
            std::string::npos)
      << r[0].reason;
  EXPECT_NE(r[0].reason.find("declare data_root, the Merkle root over the task's examples/token "
                             "pages; `meshlearn task submit` computes it from the bundle's data"),
            std::string::npos)
      << r[0].reason;
  EXPECT_FALSE(chain_->GetTask(task_id_).ok());
  EXPECT_EQ(Balance(gina_), funds);
  // The same task in tolerance mode gets on chain (the terms a client checks:
  // TasksTest.AnExactModeTaskOnAVerifyingChainNeedsADataRoot).
  StepOk({SubmitTask(/*tolerance_ppm=*/50)});
  EXPECT_EQ(Task().params.tolerance_rel_l2_ppm, 50u);
  EXPECT_TRUE(Task().params.data_root.IsZero());
}

// The ledger as referee: a task with a data root. The parties' states come from real training
// (a tiny MLP on synthetic data); the ledger executes the narrowed step from a witness anyone
// posts (RefereeStepTx) and rules with its own output; the genesis referee's word is refused.
constexpr char kTinyBundle[] = R"(
[task]
name = "referee-mlp"
seed = 5
[data]
format = "npy"
train_x = "blob:00"
train_y = "blob:01"
test_x = "blob:02"
test_y = "blob:03"
[model]
input = [6]
[[model.layers]]
kind = "linear"
out = 12
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "dropout"
p = 0.25
[[model.layers]]
kind = "linear"
out = 3
[optimizer]
kind = "adamw"
lr = 1e-2
[train]
steps = 100
batch_size = 5
[network]
rounds = 2
units_per_round = 2
inner_steps = 4
checkpoint_interval = 2
inner_lr_final = 0.5
)";

// A tiny GPT on the GPL text (/usr/share/common-licenses/GPL-3, which Debian's base-files installs;
// its vocabulary from the data), trained as kTinyBundle's MLP is: a token task.
constexpr char kTinyGptBundle[] = R"(
[task]
name = "referee-gpt"
seed = 5
[data]
format = "text"
path = "/usr/share/common-licenses/GPL-3"
[model]
kind = "gpt"
n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
[optimizer]
kind = "adamw"
lr = 3e-3
grad_clip = 1.0
[train]
steps = 100
batch_size = 4
[network]
rounds = 2
units_per_round = 2
inner_steps = 4
checkpoint_interval = 2
inner_lr_final = 0.5
)";

class RealTrainingTest : public VerificationTest {
 protected:
  RealTrainingTest() {
    // 200 examples (TestTaskParams' num_examples as Start() sets it), 6 features, 3 classes.
    engine::TaskData d;
    std::vector<float> x(200 * 6);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
    d.train.x = engine::Tensor({200, 6}, x);
    d.train.y.resize(200);
    for (int i = 0; i < 200; ++i) d.train.y[i] = (i * 7) % 3;
    d.train.num_classes = 3;
    d.test = d.train;
    train_ = d.train;
    spec_ = engine::TaskSpec::Parse(kTinyBundle, "referee-mlp.toml", "").value();
    trainer_ = engine::Trainer::Create(spec_, std::move(d)).value();
    tree_ = std::make_unique<engine::DataTree>(train_);
    data_root_ = tree_->root();
    SetStart();
  }
  // A token task: the bundle `bundle` (a GPT on a text file), its data loaded from the file, a
  // data root over its token pages.
  explicit RealTrainingTest(std::string bundle) : bundle_(std::move(bundle)) {
    spec_ = engine::TaskSpec::Parse(bundle_, "referee-gpt.toml", "/").value();
    engine::TaskData d = engine::LoadTaskData(Env::Default(), spec_).value();
    trainer_ = engine::Trainer::Create(spec_, std::move(d)).value();
    spec_ = trainer_->task();  // with the vocabulary the data gives
    pages_ = std::make_unique<engine::TokenPageTree>(trainer_->data().train_tokens.tokens);
    data_root_ = pages_->root();
    num_examples_ = static_cast<uint64_t>(pages_->num_tokens());
    data_page_tokens_ = static_cast<uint32_t>(engine::kTokenPageTokens);
    model_bytes_ = 4 * static_cast<uint64_t>(trainer_->state().model->NumParameters());
    SetStart();
  }
  void SetStart() {
    global_ = trainer_->FlatParams();
    spec_hash_ = BuildManifest(AsBytes(std::string_view(bundle_))).id().hash;
    start_blob_ = protocol::EncodeGlobalState(global_, std::vector<float>(global_.size(), 0.0f));
    initial_state_ = BuildManifest(start_blob_).id().hash;
  }

  // Trains unit `index` honestly (as a solver does: round 0, its shard's stream, the round's
  // learning rate) and records the state hash and FlatState after every step 0..4.
  void TrainUnit(uint32_t index) {
    const WorkUnit u = Unit(index);
    stream_ = protocol::UnitSeed(
        spec_.seed, protocol::UnitId{engine::TaskContentId(spec_), u.round, u.shard});
    ASSERT_TRUE(trainer_->StartUnit(stream_, global_, protocol::InnerLrScale(2, 0.5, u.round)).ok());
    states_.clear();
    flats_.clear();
    for (int s = 0; s <= 4; ++s) {
      if (s > 0) trainer_->Step();
      states_.push_back(engine::StateHash(trainer_->state()));
      flats_.push_back(engine::FlatState(trainer_->state()));
    }
  }
  std::vector<Hash256> TrueLeaves() const { return {states_[0], states_[2], states_[4]}; }
  // The delta blob id of the honest unit just trained (what its CommitUnit names).
  Hash256 TrueResult() const {
    const std::span<const float> params(flats_[4].data(), global_.size());
    return BuildManifest(protocol::EncodeDelta(protocol::PseudoGradient(global_, params)))
        .id()
        .hash;
  }
  // The witness that unit's result is not what its final state gives.
  ResultWitness ResultProof() const {
    return ResultWitness{.bundle = kTinyBundle, .start_state = start_blob_, .state = flats_[4]};
  }

  // The witness of step `step` (1-based): the state after step - 1 and that step's batch.
  StepWitness Witness(uint64_t step) const {
    StepWitness w{.bundle = kTinyBundle, .state = flats_.at(step - 1), .examples = {}};
    for (int64_t i : engine::BatchIndices(spec_.seed, stream_, 200, spec_.batch_size,
                                          static_cast<int64_t>(step) - 1)) {
      StepWitnessExample e{.index = static_cast<uint64_t>(i), .x = {}, .y = train_.y[i],
                           .proof = tree_->Prove(i)};
      e.x.assign(train_.x.data() + i * 6, train_.x.data() + (i + 1) * 6);
      w.examples.push_back(std::move(e));
    }
    return w;
  }
  Transaction RefereeStep(const KeyPair& sender, uint32_t index, const StepWitness& w) {
    return Q(sender, RefereeStepTx{.task_id = task_id_, .index = index,
                                   .witness = {EncodeStepWitness(w)}});
  }

  std::string bundle_ = kTinyBundle;
  engine::TaskSpec spec_;
  engine::ClassificationData train_;
  std::unique_ptr<engine::Trainer> trainer_;
  std::unique_ptr<engine::DataTree> tree_;        // a classification task's
  std::unique_ptr<engine::TokenPageTree> pages_;  // a token task's
  std::vector<float> global_;
  uint64_t stream_ = 0;
  std::vector<Hash256> states_;
  std::vector<std::vector<float>> flats_;
  Bytes start_blob_;  // round 0's global state blob (initial weights, zero momentum)
};

class LedgerRefereeTest : public RealTrainingTest, public ::testing::WithParamInterface<bool> {};

TEST_P(LedgerRefereeTest, TheLedgerExecutesTheDisputedStepAndRulesForTheHonestParty) {
  const bool solver_lies = GetParam();
  Start();
  const int u = UnitOf(s1_), other = UnitOf(s2_);
  ASSERT_GE(u, 0);
  TrainUnit(static_cast<uint32_t>(u));
  auto lie = [&](uint64_t s) { return Hasher("lie").UpdateU64(s).Finish(); };
  // A lazy solver commits made-up states after step 0; a lying verifier claims segment 1 (from
  // the true state after step 2) ends elsewhere.
  auto solver_states = [&](uint64_t s) { return solver_lies && s > 0 ? lie(s) : states_[s]; };
  auto verifier_states = [&](uint64_t s) { return !solver_lies && s > 2 ? lie(s) : states_[s]; };
  const std::vector<Hash256> leaves = {solver_states(0), solver_states(2), solver_states(4)};
  const uint32_t segment = solver_lies ? 0 : 1;
  std::vector<Transaction> commits = {CommitTx(u, leaves), CommitTx(other, Leaves(other, false))};
  pending_secrets_.clear();
  StepOk(commits);
  Step();
  Sealed claim{Verdict::kVerdictMismatch, Blake2b("salt referee"),
               ClaimOf(leaves, segment, verifier_states(2 * segment + 2))};
  Sealed ok = Clean();
  StepOk({SealTx(v1_, u, claim), SealTx(v1_, other, ok)});
  StepUntil(u, CheckStage::kCheckRevealVerdicts);
  const RevealSecretTx secret{.task_id = task_id_, .index = static_cast<uint32_t>(u),
                              .node_id = s1_.public_key(),
                              .secret = Secret(s1_, Unit(u).secret_index),
                              .start_leaf = states_[0]};
  StepOk({RevealTx(v1_, u, claim), RevealTx(v1_, other, ok), N(s1_, secret), SecretTx(other)});
  StepUntil(u, CheckStage::kCheckDisputed);
  PlayDispute(u, solver_states, verifier_states);
  ASSERT_EQ(Check(u).dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  const protocol::RefereeTask task = Check(u).dispute()->referee_task();
  ASSERT_TRUE(task.whole_step);
  EXPECT_EQ(task.step, solver_lies ? 1u : 3u);  // the first step whose states differ
  EXPECT_EQ(task.input, states_[task.step - 1]);

  // The genesis referee's word no longer decides a step the ledger can execute.
  std::vector<Receipt> r = Step({Q(referee_, RuleDisputeTx{.task_id = task_id_,
                                                           .index = static_cast<uint32_t>(u),
                                                           .output = states_[task.step]})});
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition) << r[0].reason;
  EXPECT_NE(r[0].reason.find("RefereeStep"), std::string::npos) << r[0].reason;
  // Witnesses that do not check out are refused, each naming what is wrong; the game waits.
  const StepWitness good = Witness(task.step);
  auto refused = [&](const StepWitness& w, const std::string& why) {
    std::vector<Receipt> rr = Step({RefereeStep(gina_, u, w)});
    EXPECT_FALSE(rr[0].ok) << why;
    EXPECT_NE(rr[0].reason.find(why), std::string::npos) << rr[0].reason;
  };
  StepWitness w = good;
  w.bundle += "# another task\n";
  refused(w, "spec_hash");
  w = good;
  w.state[3] += 1e-3f;
  refused(w, "the witness state hashes to");
  w = Witness(task.step == 1 ? 2 : 1);  // a true state, but not the agreed one
  refused(w, "the witness state hashes to");
  w = good;
  w.examples[1].x[0] += 1.0f;  // not the data the submitter committed to
  refused(w, "is not proven against the task's data_root");
  w = good;
  std::swap(w.examples[0], w.examples[1]);  // the right examples in the wrong order
  refused(w, "the batch draws index");
  w = good;
  w.examples.pop_back();
  refused(w, "examples, a batch of this task has 5");
  r = Step({Q(gina_, RefereeStepTx{.task_id = task_id_, .index = static_cast<uint32_t>(u),
                                   .witness = {Bytes{1, 2, 3}}})});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("step witness: truncated"), std::string::npos) << r[0].reason;
  ASSERT_TRUE(HasCheck(u));
  ASSERT_EQ(Check(u).dispute()->stage(), protocol::DisputeStage::kDisputeReferee);

  // Anyone may post the right witness (here the submitter); the ledger computes the step itself.
  const Transaction ruling = RefereeStep(gina_, u, good);
  const uint32_t round = Unit(u).round;
  StepOk({ruling});
  const uint64_t ruled_at = chain_->Height();
  r = Step({RefereeStep(gina_, u, good)});  // nothing left to rule
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition) << r[0].reason;
  StepUntilDone(u, 3);
  // The task keeps the ruling, whatever became of the unit's check (fraud re-runs the round): the
  // refused witnesses left none.
  DisputeRuling want = RulingBy(ruling, ruled_at);
  want.index = static_cast<uint32_t>(u);
  want.round = round;
  want.step = task.step;
  want.defender = s1_.public_key();
  want.challenger = v1_.public_key();
  want.witness_bytes = EncodeStepWitness(good).size();
  want.defender_honest = !solver_lies;
  want.challenger_honest = solver_lies;
  want.reason =
      "referee recomputed step " + std::to_string(task.step) +
      (solver_lies ? ": the defender's output is wrong" : ": the challenger's output is wrong");
  ExpectRulings(Task(), {want});
  EXPECT_EQ(TaskToJson(Task())["verification"]["rulings"][0]["for"],
            solver_lies ? "challenger" : "defender");
  if (solver_lies) {
    EXPECT_FALSE(HasCheck(u));  // fraud: the round re-runs
    EXPECT_TRUE(Rerunning());
    EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
    EXPECT_EQ(Node(v1_).reputation.slashes, 0u);
  } else {
    EXPECT_EQ(Check(u).result(), CheckResult::kCheckClean) << Check(u).reason();
    EXPECT_EQ(Node(v1_).reputation.slashes, 1u);  // the lying verifier
    EXPECT_EQ(Node(s1_).reputation.slashes, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(EachSideLies, LedgerRefereeTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "SolverLies" : "VerifierLies"; });

// A solver that trains honestly (every leaf true) but commits another result: a verifier shows
// the ledger the result is not the delta of the committed final state; fraud at once.
TEST_F(RealTrainingTest, AResultThatIsNotTheDeltaOfTheFinalStateIsProvenFraud) {
  Start();
  const int u = UnitOf(s1_), other = UnitOf(s2_);
  ASSERT_GE(u, 0);
  TrainUnit(static_cast<uint32_t>(u));
  const Hash256 true_result = TrueResult();
  // v1 commits to its result proof (CommitProof) as the unit commits: the bounty is the earliest
  // committer's, and the proof comes a block later.
  StepOk({CommitTx(u, TrueLeaves(), Blake2b("a garbage delta")),
          CommitTx(other, Leaves(other, false)),
          N(v1_, CommitOf(ProveResultTx{.task_id = task_id_,
                                        .index = static_cast<uint32_t>(u),
                                        .node_id = v1_.public_key(),
                                        .witness = {EncodeResultWitness(ResultProof())}},
                          v1_.public_key()))});
  pending_secrets_.clear();
  auto prove = [&](const KeyPair& by, uint32_t index, const ResultWitness& w) {
    return N(by, ProveResultTx{.task_id = task_id_, .index = index, .node_id = by.public_key(),
                               .witness = {EncodeResultWitness(w)}});
  };
  auto refused = [&](Transaction tx, const std::string& why) {
    std::vector<Receipt> r = Step({std::move(tx)});
    EXPECT_FALSE(r[0].ok) << why;
    EXPECT_NE(r[0].reason.find(why), std::string::npos) << r[0].reason;
  };
  ResultWitness w = ResultProof();
  w.start_state = protocol::EncodeGlobalState(flats_[4], flats_[4]);  // not round 0's start
  refused(prove(v1_, u, w), "round 0 started from");
  w = ResultProof();
  w.state = flats_[3];  // a true state, but not the one the last leaf commits to
  refused(prove(v1_, u, w), "the unit's last committed leaf");
  w = ResultProof();
  w.bundle += "\n";
  refused(prove(v1_, u, w), "spec_hash");
  refused(prove(s1_, u, ResultProof()), "cannot disprove its own unit");
  // The node must be the sender's.
  refused(Q(gina_, ProveResultTx{.task_id = task_id_, .index = static_cast<uint32_t>(u),
                                 .node_id = v1_.public_key(),
                                 .witness = {EncodeResultWitness(ResultProof())}}),
          "");
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);
  const Amount carol_before = Balance(carol_);
  StepOk({prove(v1_, u, ResultProof())});
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
  EXPECT_GT(Balance(carol_), carol_before);  // the prover's owner: a jackpot share
  EXPECT_TRUE(Rerunning());
  EXPECT_EQ(Task().verification.fraud, 1u);
  // The re-run: the honest solver commits the true result, which cannot be "disproved".
  Steps(1);
  ASSERT_EQ(Unit(u).assignee, s2_.public_key());
  TrainUnit(static_cast<uint32_t>(u));
  StepOk({CommitTx(u, TrueLeaves(), true_result), CommitTx(other, Leaves(other, false))});
  pending_secrets_.clear();
  refused(prove(v1_, u, ResultProof()), "nothing to prove");
  EXPECT_EQ(Node(s2_).reputation.slashes, 0u);
}

// ---- Fraud proofs after the fact (ProveFraudTx).
//
// s1 trains its unit honestly to step 2, then perturbs one weight and trains on: a consistent
// commitment whose segment 1 is poisoned (the noisy adversary). Its check replays nothing (the
// verifier calls it clean, as a one-segment check drawn on segment 0 would), the round is final,
// the task finishes and s1 is paid. Then anyone re-executes segment 1 on chain.
class FraudProofTest : public RealTrainingTest {
 protected:
  using RealTrainingTest::RealTrainingTest;
  // s1 commits its unit poisoned (PoisonUnit), s2 its own honestly; the round is aggregated and
  // both units settle clean (u_ and other_ name them).
  void SettlePoisonedUnitClean() {
    u_ = UnitOf(s1_);
    other_ = UnitOf(s2_);
    ASSERT_GE(u_, 0);
    ASSERT_GE(other_, 0);
    PoisonUnit(static_cast<uint32_t>(u_));
    StepOk({CommitTx(u_, poisoned_, Blake2b("poisoned delta")),
            CommitTx(other_, Leaves(other_, false))});
    pending_secrets_.clear();
    Aggregate();
    SettleClean({u_, other_});
    ASSERT_EQ(Check(u_).result(), CheckResult::kCheckClean) << Check(u_).reason();
  }

  // Runs the task to its end with s1's poisoned unit paid.
  void RunPoisonedTask() {
    Start();
    ASSERT_NO_FATAL_FAILURE(SettlePoisonedUnitClean());
    // While the round is open, the dispute path applies.
    Receipt early = Step({Prove(dave_, 1, SegmentProof(1))})[0];
    EXPECT_EQ(early.code, StatusCode::kFailedPrecondition) << early.reason;
    EXPECT_NE(early.reason.find("ChallengeUnit"), std::string::npos) << early.reason;
    FinishTask();
    ASSERT_EQ(Unit(u_).status, WorkUnitStatus::kVerified);
    ASSERT_GT(Unit(u_).paid, 0u);
  }

  // RunPoisonedTask, then blocks until the next is past the task's audit window: a proof there
  // marks the fraud on the record instead of reopening the task.
  void RunPoisonedTaskPastItsAuditWindow() {
    ASSERT_NO_FATAL_FAILURE(RunPoisonedTask());
    const uint64_t window_end = AuditWindowEnd(Task(), genesis_.params.audit_window_blocks);
    while (chain_->Height() + 1 <= window_end) Step();
  }

  // The chain's books after the proven fraud `f`, against `before`: nothing minted, the slash
  // split into the jackpot and the treasury, `paid_from_jackpot` (the bounty) out of the jackpot.
  void ExpectSlashBooks(const Totals& before, const ProvenFraud& f, Amount paid_from_jackpot) {
    const Totals after = chain_->GetTotals();
    EXPECT_TRUE(after.Check().ok());
    EXPECT_EQ(after.minted, before.minted);
    const Amount to_jackpot = BasisPoints(f.slashed, genesis_.params.slash_jackpot_bps);
    EXPECT_EQ(after.jackpot, before.jackpot + to_jackpot - paid_from_jackpot);
    EXPECT_EQ(after.treasury, before.treasury + f.slashed - to_jackpot);
  }

  // Trains unit `index` honestly (TrainUnit, whose states the witnesses take), then the
  // poisoned trajectory s1 commits: the true state after step 2, one weight moved, two more
  // steps (poisoned_: its leaves).
  void PoisonUnit(uint32_t index) {
    TrainUnit(index);
    const double lr_scale = protocol::InnerLrScale(2, 0.5, Unit(index).round);
    ASSERT_TRUE(trainer_->StartUnit(stream_, global_, lr_scale).ok());
    trainer_->Step();
    trainer_->Step();
    trainer_->state().model->params()[0].value.data()[0] += 0.25f;
    trainer_->Step();
    poisoned_step3_ = engine::StateHash(trainer_->state());
    trainer_->Step();
    poisoned_ = {states_[0], states_[2], engine::StateHash(trainer_->state())};
    ASSERT_NE(poisoned_[2], states_[4]);
  }

  // The witness of segment `segment` (H = 4, k = 2): the true start (segment 0: the round's
  // start blob; segment 1: the state after step 2, which s1's leaf 1 commits to) and the batches
  // of its two steps.
  // A token task's: each step's token pages in place of its examples.
  SegmentWitness SegmentProof(uint32_t segment) const {
    SegmentWitness w{.bundle = bundle_};
    if (segment == 0) {
      w.start_state = start_blob_;
    } else {
      w.state = flats_.at(2 * segment);
    }
    for (uint64_t step = 2 * segment + 1; step <= 2 * segment + 2; ++step) {
      if (pages_) {
        for (TileWitnessPage& p :
             ProvenPages(*pages_, StepBatchPages(spec_, stream_, step - 1, pages_->num_tokens()))) {
          w.pages.push_back(std::move(p));
        }
        continue;
      }
      for (StepWitnessExample& e : Witness(step).examples) w.examples.push_back(std::move(e));
    }
    return w;
  }
  ProveFraudTx FraudProof(uint32_t segment, const SegmentWitness& w,
                          std::optional<uint32_t> index = std::nullopt) const {
    return ProveFraudTx{.task_id = task_id_,
                        .index = index.value_or(static_cast<uint32_t>(u_)),
                        .segment = segment,
                        .witness = {EncodeSegmentWitness(w)}};
  }
  Transaction Prove(const KeyPair& sender, uint32_t segment, const SegmentWitness& w,
                    std::optional<uint32_t> index = std::nullopt) {
    return Q(sender, FraudProof(segment, w, index));
  }
  // `prover`'s commitment to the proof of `segment` from `w` (Prove's), sent by itself.
  Transaction CommitToProve(const KeyPair& prover, uint32_t segment, const SegmentWitness& w) {
    return Q(prover, CommitOf(FraudProof(segment, w), prover.public_key()));
  }
  // The ProveMerits of `node` (its owner sends it: N).
  ProveMeritsTx Merits(const KeyPair& node, uint32_t segment, const SegmentWitness& w) const {
    return ProveMeritsTx{.task_id = task_id_,
                         .index = static_cast<uint32_t>(u_),
                         .node_id = node.public_key(),
                         .segment = segment,
                         .witness = {EncodeSegmentWitness(w)}};
  }
  void Refused(Transaction tx, const std::string& why) {
    const TaskRecord before = Task();
    std::vector<Receipt> r = Step({std::move(tx)});
    EXPECT_FALSE(r[0].ok) << why;
    EXPECT_NE(r[0].reason.find(why), std::string::npos) << r[0].reason;
    EXPECT_EQ(Task(), before);
  }

  int u_ = -1, other_ = -1;
  std::vector<Hash256> poisoned_;
  Hash256 poisoned_step3_;  // the poisoned trajectory's state after step 3
};

// After the task's audit window the model is final: the proof slashes and claws back, the task
// stays finished (ReopenTest has the proofs that take the task back).
TEST_F(FraudProofTest, ASegmentThatDoesNotReplayToItsLeafIsProvenAfterTheFact) {
  RunPoisonedTask();
  const TaskRecord finished = Task();
  const uint64_t window_end = AuditWindowEnd(finished, genesis_.params.audit_window_blocks);
  EXPECT_EQ(window_end, finished.closed_height + genesis_.params.audit_window_blocks);
  EXPECT_EQ(TaskToJson(finished, genesis_.params.audit_window_blocks)["audit_window_end"],
            window_end);
  while (chain_->Height() + 1 <= window_end) Step();  // the proof's block is past the window
  const Amount paid = Unit(u_).paid;
  const Amount stake_before = Node(s1_).stake;
  const Amount gina_before = Balance(gina_), dave_before = Balance(dave_);

  // Honest segment 0 (from the true start) ends at the committed leaf 1: nothing to prove.
  Refused(Prove(dave_, 0, SegmentProof(0)), "replays to its committed end");
  // Witnesses that do not check out, each refused naming what is wrong.
  SegmentWitness w = SegmentProof(1);
  w.state = flats_[3];  // a true state, not the one leaf 1 commits to
  Refused(Prove(dave_, 1, w), "the unit's committed leaf 1");
  w = SegmentProof(1);
  w.state[0] += 1e-3f;
  Refused(Prove(dave_, 1, w), "the unit's committed leaf 1");
  w = SegmentProof(1);
  w.start_state = start_blob_;
  Refused(Prove(dave_, 1, w), "leave start_state empty");
  w = SegmentProof(0);
  w.start_state = protocol::EncodeGlobalState(flats_[4], flats_[4]);
  Refused(Prove(dave_, 0, w), "round 0 started from");
  w = SegmentProof(1);
  w.examples[7].x[0] += 1.0f;  // step 4's batch (5 examples a step), not the task's data
  Refused(Prove(dave_, 1, w), "step 4: example 2 (index");
  w = SegmentProof(1);
  std::swap(w.examples[0], w.examples[5]);  // steps 3 and 4 swapped
  Refused(Prove(dave_, 1, w), "the batch draws index");
  w = SegmentProof(1);
  w.examples.pop_back();
  Refused(Prove(dave_, 1, w), "2 steps of batch 5 take 10");
  w = SegmentProof(1);
  w.bundle += "\n";
  Refused(Prove(dave_, 1, w), "spec_hash");
  Refused(Prove(dave_, 2, SegmentProof(1)), "the unit has 2 segments");
  Refused(Prove(dave_, 1, SegmentProof(1), /*index=*/99), "out of range");
  Refused(Q(dave_, ProveFraudTx{.task_id = task_id_,
                                .index = static_cast<uint32_t>(u_),
                                .segment = 1,
                                .witness = {Bytes{1, 2, 3}}}),
          "segment witness");
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);

  // The true witness of segment 1: the ledger's replay ends at states_[4], not the leaf. Its
  // prover commits to it a block before (CommitProof): the bounty is the earliest committer's.
  StepOk({CommitToProve(dave_, 1, SegmentProof(1))});
  StepOk({Prove(dave_, 1, SegmentProof(1))});
  const NodeRecord s1 = Node(s1_);
  EXPECT_EQ(s1.status, NodeStatus::kJailed);
  EXPECT_EQ(s1.reputation.slashes, 1u);
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_EQ(f.round, 0u);
  EXPECT_EQ(f.index, static_cast<uint32_t>(u_));
  EXPECT_EQ(f.segment, 1u);
  EXPECT_EQ(f.solver, s1_.public_key());
  EXPECT_EQ(f.prover, dave_.public_key());
  // Paid back to the submitter, then slashed like a lost dispute (10 unit costs, the stake
  // covers it); the prover's bounty comes from the jackpot, at most what was slashed.
  EXPECT_EQ(f.clawed_back, paid);
  EXPECT_EQ(f.slashed, protocol::SlashAmount(UnitCost(t, Unit(u_).price), kSlashMultiple));
  EXPECT_EQ(s1.stake, stake_before - paid - f.slashed);
  EXPECT_EQ(Balance(gina_), gina_before + paid);
  EXPECT_GT(f.bounty, 0u);
  EXPECT_LE(f.bounty, f.slashed);
  EXPECT_EQ(Balance(dave_), dave_before + f.bounty);
  EXPECT_EQ(t.verification.clawed_back, paid);
  EXPECT_EQ(t.budget, t.escrow + t.spent + t.refunded);
  // The model stays: nothing is rewound or reopened.
  EXPECT_EQ(t.status, TaskStatus::kFinished);
  EXPECT_EQ(t.final_state, finished.final_state);
  EXPECT_EQ(t.closed_height, finished.closed_height);
  EXPECT_EQ(t.round_results, finished.round_results);
  EXPECT_EQ(t.rounds_settled, 1u);
  EXPECT_FALSE(f.rewound);
  EXPECT_EQ(t.verification.reopened, 0u);
  EXPECT_EQ(t.verification.rounds_rewound, 0u);
  EXPECT_EQ(Unit(other_).status, WorkUnitStatus::kVerified);
  ExpectEarningsAddUpToTheTask();
  const nlohmann::json j = TaskToJson(t);
  EXPECT_EQ(j["verification"]["fraud_rounds"], nlohmann::json::array({0}));
  EXPECT_EQ(j["verification"]["proven_frauds"][0]["segment"], 1);
  // A unit is proven once.
  Refused(Prove(erin_, 1, SegmentProof(1)), "already");
}

// Self-reporting: a cheater that proves its own fraud first (from its owner's account, its own
// key or another node of its owner's) would be paid the bounty its own slash funds, so cheating
// and then reporting itself before anyone else would cost it little, and no honest prover would be
// paid for finding it. Such a prover gets nothing: the slash stays in the jackpot and the treasury,
// and every token is accounted for (the claw-back to the submitter, the rest where it was).
TEST_F(FraudProofTest, ACheaterProvingItsOwnFraudGetsNoneOfItsSlashBack) {
  ASSERT_NO_FATAL_FAILURE(RunPoisonedTaskPastItsAuditWindow());
  // The slash itself puts its jackpot share in the pool before a bounty is paid from it: until
  // 2026-12-06 that share went straight back to the cheater's owner.
  const Totals before = chain_->GetTotals();
  ASSERT_TRUE(before.Check().ok());
  const Amount alice_before = Balance(alice_), gina_before = Balance(gina_);
  StepOk({Prove(alice_, 1, SegmentProof(1))});  // s1's owner
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_EQ(f.prover, alice_.public_key());
  EXPECT_EQ(f.slashed, protocol::SlashAmount(UnitCost(t, Unit(u_).price), kSlashMultiple));
  EXPECT_EQ(f.bounty, 0u);
  EXPECT_EQ(Balance(alice_), alice_before);
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
  // The whole chain's books: nothing minted; the stake taken went to the submitter (the claw-back)
  // and into the pools (the slash), and none of it came back out.
  ExpectSlashBooks(before, f, 0);
  const Totals after = chain_->GetTotals();
  EXPECT_EQ(before.staked + before.unbonding,
            after.staked + after.unbonding + f.slashed + f.clawed_back);
  EXPECT_EQ(after.balances, before.balances + f.clawed_back);
  EXPECT_EQ(Balance(gina_), gina_before + f.clawed_back);
  ExpectEarningsAddUpToTheTask();
}

// ---- Commit, then prove (CommitProofTx; docs/verification.md, "Commit, then prove").
//
// A ProveFraud is public once sent, and a copier may send the same witness under its own key
// first. The bounty goes to the earliest committer to the witness whose commitment is at least a
// block older than the proof: dave commits first; erin, the copier, commits a block later (after
// dave's proof would have been public) and gets its copy in ahead of dave's proof. The slash
// happens on erin's proof, the bounty is dave's, and dave's own proof is refused (proven already).
// Until the rule, the bounty went to whoever sent the proof first: erin.
TEST_F(FraudProofTest, ACopierWhoSendsTheWitnessFirstButCommittedLaterGetsNoBounty) {
  ASSERT_NO_FATAL_FAILURE(RunPoisonedTaskPastItsAuditWindow());
  const Totals before = chain_->GetTotals();
  const Amount dave_before = Balance(dave_), erin_before = Balance(erin_);
  StepOk({CommitToProve(dave_, 1, SegmentProof(1))});
  StepOk({CommitToProve(erin_, 1, SegmentProof(1))});
  const std::vector<Receipt> r =
      Step({Prove(erin_, 1, SegmentProof(1)), Prove(dave_, 1, SegmentProof(1))});
  ASSERT_EQ(r.size(), 2u);
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  EXPECT_FALSE(r[1].ok);
  EXPECT_NE(r[1].reason.find("proven fraudulent at height"), std::string::npos) << r[1].reason;
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_EQ(f.prover, erin_.public_key());  // who sent the proof that ruled
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
  EXPECT_GT(f.bounty, 0u);
  EXPECT_EQ(Balance(dave_), dave_before + f.bounty);  // the earliest committer
  EXPECT_EQ(Balance(erin_), erin_before);             // the copier: nothing
  ExpectSlashBooks(before, f, f.bounty);
  ExpectEarningsAddUpToTheTask();
}

// A commitment in the proof's own block is not a block older than it, so it counts nothing: a
// copier that sees a proof in the mempool could otherwise commit and send its copy in one block.
// With no other commitment the proof still rules (the solver slashed and jailed, its pay clawed
// back) and its bounty stays in the jackpot: every token accounted for.
TEST_F(FraudProofTest, ACommitmentInTheProofsOwnBlockCountsNothingAndTheBountyStaysInTheJackpot) {
  ASSERT_NO_FATAL_FAILURE(RunPoisonedTaskPastItsAuditWindow());
  const Totals before = chain_->GetTotals();
  const Amount erin_before = Balance(erin_), gina_before = Balance(gina_);
  const std::vector<Receipt> r =
      Step({CommitToProve(erin_, 1, SegmentProof(1)), Prove(erin_, 1, SegmentProof(1))});
  ASSERT_EQ(r.size(), 2u);
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  ASSERT_TRUE(r[1].ok) << r[1].reason;
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_EQ(f.prover, erin_.public_key());
  EXPECT_EQ(f.slashed, protocol::SlashAmount(UnitCost(t, Unit(u_).price), kSlashMultiple));
  EXPECT_EQ(f.bounty, 0u);
  EXPECT_EQ(Balance(erin_), erin_before);
  EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
  EXPECT_EQ(Balance(gina_), gina_before + f.clawed_back);
  ExpectSlashBooks(before, f, 0);
  const Totals after = chain_->GetTotals();
  EXPECT_EQ(after.balances, before.balances + f.clawed_back);
  ExpectEarningsAddUpToTheTask();
}

// A commitment counts for kProofCommitmentBlocks blocks after its own, then is dropped (EndBlock):
// the same commitment again while it is kept is a replay and refused; a proof after it expired
// is paid nothing (the bounty stays in the jackpot), and the expired commitment's deposit went to
// the jackpot too.
TEST_F(FraudProofTest, AReplayedCommitmentIsRefusedAndAnExpiredOneCountsNothing) {
  ASSERT_NO_FATAL_FAILURE(RunPoisonedTaskPastItsAuditWindow());
  const Amount dave_before = Balance(dave_);
  const Amount deposit = genesis_.params.proof_commit_deposit;
  ASSERT_GT(deposit, 0u);
  StepOk({CommitToProve(dave_, 1, SegmentProof(1))});
  const uint64_t committed_at = chain_->Height();
  const Receipt replay = Step({CommitToProve(dave_, 1, SegmentProof(1))})[0];
  EXPECT_EQ(replay.code, StatusCode::kAlreadyExists) << replay.reason;
  EXPECT_NE(replay.reason.find("was made at height " + std::to_string(committed_at)),
            std::string::npos)
      << replay.reason;
  while (chain_->Height() < committed_at + kProofCommitmentBlocks) Step();
  StepOk({Prove(dave_, 1, SegmentProof(1))});  // one block past the last that counted it
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  EXPECT_EQ(t.verification.proven_frauds[0].bounty, 0u);
  EXPECT_EQ(Balance(dave_), dave_before - deposit);  // forfeited when it expired
  EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
}

// The attack the deposit and the eviction answer (docs/verification.md, "Bounded storage"): 256
// funded accounts keep 16 junk commitments each, the kMaxProofCommitments the chain keeps. Until
// 2026-12-06 every other CommitProof was then refused (ResourceExhausted), so an honest prover's
// proof ruled with its bounty paid to nobody. Now dave's commitment evicts the oldest junk one
// (its deposit to the jackpot), his proof a block later pays him the bounty and gives his deposit
// back; the junk left expires kProofCommitmentBlocks after its block, every deposit of it
// forfeited to the jackpot. The totals hold after every block (the fixture), and each move is
// checked here to the token: the attackers' balances, the escrow (the kept deposits), the
// jackpot.
TEST_F(FraudProofTest, JunkCommitmentsFillingTheTableCannotLockAnHonestProverOut) {
  ASSERT_NO_FATAL_FAILURE(RunPoisonedTaskPastItsAuditWindow());
  const Amount deposit = genesis_.params.proof_commit_deposit;
  ASSERT_GT(deposit, 0u);
  constexpr uint32_t kAttackers = kMaxProofCommitments / kMaxProofCommitmentsPerProver;
  ASSERT_EQ(kAttackers, 256u);
  const Amount each = kMaxProofCommitmentsPerProver * deposit;  // what one attacker holds
  std::vector<KeyPair> attackers;
  std::vector<Transaction> funding;
  for (uint32_t i = 0; i < kAttackers; ++i) {
    KeySeed seed;  // TestKey has 256 keys; these are others
    seed.bytes.fill(0xa7);
    for (int b = 0; b < 4; ++b) seed.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
    attackers.push_back(KeyPair::FromSeed(seed));
    funding.push_back(Q(frank_, TransferTx{.to = attackers.back().public_key(), .amount = each}));
  }
  StepOk(std::move(funding));
  auto attackers_balance = [&] {
    Amount sum = 0;
    for (const KeyPair& a : attackers) sum += Balance(a);
    return sum;
  };
  ASSERT_EQ(attackers_balance(), kAttackers * each);
  const Totals clean = chain_->GetTotals();
  std::vector<Transaction> junk;
  for (const KeyPair& a : attackers) {
    for (uint32_t j = 0; j < kMaxProofCommitmentsPerProver; ++j) {
      const Hash256 c = Hasher("junk").Update(a.public_key().span()).UpdateU64(j).Finish();
      junk.push_back(Q(a, CommitProofTx{.commitment = c, .prover = a.public_key()}));
    }
  }
  StepOk(std::move(junk));
  const uint64_t junk_height = chain_->Height();
  const Totals full = chain_->GetTotals();
  EXPECT_EQ(attackers_balance(), 0u);
  EXPECT_EQ(full.escrow, clean.escrow + kMaxProofCommitments * deposit);
  EXPECT_EQ(full.jackpot, clean.jackpot);

  // The honest prover commits into the full table, and proves a block later.
  const Amount dave_before = Balance(dave_);
  const Receipt committed = Step({CommitToProve(dave_, 1, SegmentProof(1))})[0];
  ASSERT_TRUE(committed.ok) << committed.reason;  // until 2026-12-06: "the chain keeps 4096"
  EXPECT_EQ(Balance(dave_), dave_before - deposit);
  const Totals evicted = chain_->GetTotals();
  EXPECT_EQ(evicted.escrow, full.escrow);              // one deposit in, one out
  EXPECT_EQ(evicted.jackpot, full.jackpot + deposit);  // the evicted junk's
  StepOk({Prove(dave_, 1, SegmentProof(1))});
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
  EXPECT_GT(f.bounty, 0u);
  EXPECT_EQ(Balance(dave_), dave_before + f.bounty);  // the bounty, and the deposit back
  const Totals proven = chain_->GetTotals();
  EXPECT_EQ(proven.escrow, full.escrow - deposit);  // dave's deposit left the escrow
  ExpectSlashBooks(evicted, f, f.bounty);

  // The junk expires at the end of block junk_height + kProofCommitmentBlocks: every deposit
  // left (4,095: one was evicted) goes to the jackpot, none back to the attackers.
  while (chain_->Height() < junk_height + kProofCommitmentBlocks - 1) Step();
  EXPECT_EQ(chain_->GetTotals().escrow, proven.escrow);
  Step();
  const Totals expired = chain_->GetTotals();
  EXPECT_EQ(expired.escrow, clean.escrow);
  EXPECT_EQ(expired.jackpot, proven.jackpot + (kMaxProofCommitments - 1) * deposit);
  EXPECT_EQ(attackers_balance(), 0u);
  EXPECT_EQ(expired.minted, clean.minted);
}

// The ProveResult path: v2 copies v1's result proof and sends it first without ever committing;
// v1 committed a block before, so v1's owner gets the bounty and v2's owner nothing.
TEST_F(RealTrainingTest, AResultProofsBountyIsTheEarliestCommittersNotTheFirstSenders) {
  Start(/*verifiers=*/2);
  const int u = UnitOf(s1_), other = UnitOf(s2_);
  ASSERT_GE(u, 0);
  TrainUnit(static_cast<uint32_t>(u));
  StepOk({CommitTx(u, TrueLeaves(), Blake2b("a garbage delta")),
          CommitTx(other, Leaves(other, false))});
  pending_secrets_.clear();
  auto proof = [&](const KeyPair& by) {
    return ProveResultTx{.task_id = task_id_,
                         .index = static_cast<uint32_t>(u),
                         .node_id = by.public_key(),
                         .witness = {EncodeResultWitness(ResultProof())}};
  };
  // Measured before the commitment: its deposit, paid by v1's owner, comes back with the proof.
  const Amount carol_before = Balance(carol_), dave_before = Balance(dave_);
  StepOk({N(v1_, CommitOf(proof(v1_), v1_.public_key()))});
  EXPECT_EQ(Balance(carol_), carol_before - genesis_.params.proof_commit_deposit);
  const std::vector<Receipt> r = Step({N(v2_, proof(v2_)), N(v1_, proof(v1_))});
  ASSERT_EQ(r.size(), 2u);
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  EXPECT_FALSE(r[1].ok);  // the unit is being re-run already
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  const Amount slashed = Node(s1_).earnings.slashed, bounty = Node(v1_).earnings.jackpot;
  EXPECT_GT(bounty, 0u);
  EXPECT_LE(bounty, slashed);
  EXPECT_EQ(Balance(carol_), carol_before + bounty);
  EXPECT_EQ(Node(v2_).earnings.jackpot, 0u);
  EXPECT_EQ(Balance(dave_), dave_before);
  ExpectEarningsAddUpToTheTask();
}

// CommitProof's own refusals, each naming what is wrong: an all-zero commitment, a prover that is
// neither the sender nor a node of the sender's, a replay, a prover over its bound, and a sender
// that cannot pay the deposit.
TEST_F(VerificationTest, ACommitProofIsRefusedWhenMalformedReplayedOrOverItsBound) {
  Start(/*verifiers=*/2);
  auto commit = [&](const KeyPair& by, const Hash256& c, const PublicKey& prover) {
    return Q(by, CommitProofTx{.commitment = c, .prover = prover});
  };
  auto refused = [&](Transaction tx, StatusCode code, const std::string& why) {
    const Receipt r = Step({std::move(tx)})[0];
    EXPECT_FALSE(r.ok) << why;
    EXPECT_EQ(r.code, code) << r.reason;
    EXPECT_NE(r.reason.find(why), std::string::npos) << r.reason;
  };
  const PublicKey dave = dave_.public_key();
  refused(commit(dave_, Hash256{}, dave), StatusCode::kInvalidArgument, "all zeros");
  refused(commit(dave_, Blake2b("c"), erin_.public_key()), StatusCode::kNotFound,
          "is not registered");
  refused(commit(dave_, Blake2b("c"), v1_.public_key()), StatusCode::kPermissionDenied,
          "the sender must be node");
  // dave's own key, and its node v2 (N: dave signs).
  StepOk({commit(dave_, Blake2b("c"), dave),
          N(v2_, CommitProofTx{.commitment = Blake2b("n"), .prover = v2_.public_key()})});
  refused(commit(dave_, Blake2b("c"), dave), StatusCode::kAlreadyExists, "already");
  std::vector<Transaction> more;
  for (uint32_t i = 1; i < kMaxProofCommitmentsPerProver; ++i) {
    more.push_back(commit(dave_, Blake2b("c" + std::to_string(i)), dave));
  }
  StepOk(std::move(more));
  refused(commit(dave_, Blake2b("one too many"), dave), StatusCode::kResourceExhausted,
          "the most one key may");
  // The bound is the prover's: dave's node still commits.
  StepOk({N(v2_, CommitProofTx{.commitment = Blake2b("n2"), .prover = v2_.public_key()})});
  // A sender that cannot pay the deposit (genesis params.proof_commit_deposit).
  const Amount deposit = genesis_.params.proof_commit_deposit;
  ASSERT_GT(deposit, 1u);
  const KeyPair poor = TestKey(99);
  StepOk({Q(dave_, TransferTx{.to = poor.public_key(), .amount = deposit - 1})});
  refused(
      commit(poor, Blake2b("poor"), poor.public_key()), StatusCode::kFailedPrecondition,
      "holds a deposit of " + std::to_string(deposit) + " (genesis params.proof_commit_deposit)");
  EXPECT_EQ(Balance(poor), deposit - 1);
}

// TakeProofCommitter and ExpireProofCommits on a bare state: the earliest commitment to the
// witness at least a block older than the proof and not expired is the bounty's (ties: the
// proof's own prover); for a node's proof only a registered node's commitment counts; the
// witness's commitments are spent by the proof; another witness's stay. And the state hash of a
// chain with no commitment kept is what it was before the table existed.
TEST(ProofCommitTest, TheBountyIsTheEarliestCommitmentABlockOlderAndNotExpired) {
  const Hash256 wid = Blake2b("witness"), other = Blake2b("another witness");
  const PublicKey a = TestKey(1).public_key(), b = TestKey(2).public_key(),
                  c = TestKey(3).public_key();
  auto put = [](LedgerState& s, const Hash256& w, const PublicKey& p, uint64_t h) {
    const Hash256 k = ProofCommitment(w, p);
    s.proof_commits.Put(k, ProofCommit{.commitment = k, .prover = p, .height = h});
  };
  {
    LedgerState s;
    put(s, wid, a, 10);
    put(s, wid, b, 9);
    put(s, other, c, 5);
    EXPECT_EQ(TakeProofCommitter(s, wid, a, 11, false), b);
    EXPECT_EQ(s.proof_commits.rows().size(), 1u);  // only the other witness's is left
    EXPECT_EQ(TakeProofCommitter(s, wid, a, 12, false), std::nullopt);
  }
  for (uint64_t h : {10, 9}) {  // the proof's own block, and before the commitment
    LedgerState s;
    put(s, wid, a, 10);
    EXPECT_EQ(TakeProofCommitter(s, wid, a, h, false), std::nullopt) << h;
  }
  {
    LedgerState s;
    put(s, wid, a, 10);
    EXPECT_EQ(TakeProofCommitter(s, wid, b, 10 + kProofCommitmentBlocks, false), a);
    put(s, wid, a, 10);
    EXPECT_EQ(TakeProofCommitter(s, wid, b, 11 + kProofCommitmentBlocks, false), std::nullopt);
  }
  for (const PublicKey& sender : {a, b}) {  // a tie goes to the proof's own prover
    LedgerState s;
    put(s, wid, a, 10);
    put(s, wid, b, 10);
    EXPECT_EQ(TakeProofCommitter(s, wid, sender, 11, false), sender);
  }
  {
    LedgerState s;
    put(s, wid, a, 10);
    EXPECT_EQ(TakeProofCommitter(s, wid, a, 11, /*nodes_only=*/true), std::nullopt);
    put(s, wid, a, 10);
    s.nodes.Put(a, NodeRecord{.id = a, .owner = c});
    EXPECT_EQ(TakeProofCommitter(s, wid, a, 11, /*nodes_only=*/true), a);
  }
  {
    LedgerState s = LedgerState::FromGenesis(Genesis{});
    const Hash256 empty = s.Hash();
    put(s, wid, a, 10);
    EXPECT_NE(s.Hash(), empty);
    ExpireProofCommits(s, 9 + kProofCommitmentBlocks);  // a proof at 10 + K may still count it
    EXPECT_EQ(s.proof_commits.rows().size(), 1u);
    ExpireProofCommits(s, 10 + kProofCommitmentBlocks);
    EXPECT_TRUE(s.proof_commits.rows().empty());
    EXPECT_EQ(s.Hash(), empty);
  }
}

// Which commitment a new CommitProof evicts from a full table (ProofCommitToEvict): none below
// kMaxProofCommitments; else the oldest kept, whoever keeps it and however many it keeps, so
// pushing a given commitment out takes evicting every older one first. In particular a prover
// keeping two new commitments (a verifier proving two units at once) is not pushed out by
// single-commitment accounts for two deposits, which the first rule (the oldest of the prover
// keeping the most) allowed.
TEST(ProofCommitTest, AFullTableEvictsTheOldestCommitmentWhoeverKeepsIt) {
  auto key = [](uint32_t i, uint32_t j) { return Hasher("c").UpdateU64(i).UpdateU64(j).Finish(); };
  auto put = [](LedgerState& s, const Hash256& k, const PublicKey& p, uint64_t h) {
    s.proof_commits.Put(k, ProofCommit{.commitment = k, .prover = p, .height = h});
  };
  auto prover = [](uint32_t i) {  // the table's keys only: no signature is made here
    PublicKey p;
    for (int b = 0; b < 4; ++b) p.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
    return p;
  };
  const PublicKey verifier = prover(0);
  {
    // The verifier keeps the two newest commitments; 4,094 accounts one each, all older.
    LedgerState s;
    put(s, key(0, 0), verifier, 100);
    put(s, key(0, 1), verifier, 101);
    for (uint32_t i = 1; s.proof_commits.rows().size() < kMaxProofCommitments - 1; ++i) {
      put(s, key(i, 0), prover(i), 1 + i % 50);
    }
    EXPECT_EQ(ProofCommitToEvict(s), std::nullopt);  // one slot left
    put(s, key(5000, 0), prover(5000), 1);
    ASSERT_EQ(s.proof_commits.rows().size(), kMaxProofCommitments);
    // Evict one at a time, as new commitments would: every older one goes before the
    // verifier's, and its height-100 one before its height-101 one.
    std::vector<uint64_t> heights;
    for (size_t n = 0; n < kMaxProofCommitments; ++n) {
      std::optional<Hash256> evicted = ProofCommitToEvict(s);
      if (!evicted) {
        put(s, key(6000 + n, 0), prover(6000 + n), 102);  // keep the table full
        evicted = ProofCommitToEvict(s);
      }
      ASSERT_TRUE(evicted.has_value());
      heights.push_back(s.proof_commits.Find(*evicted)->height);
      if (*evicted == key(0, 0)) break;
      ASSERT_NE(*evicted, key(0, 1));
      s.proof_commits.Erase(*evicted);
    }
    ASSERT_EQ(heights.back(), 100u);
    EXPECT_EQ(heights.size(), kMaxProofCommitments - 1) << "evictions before the verifier's";
    EXPECT_TRUE(std::is_sorted(heights.begin(), heights.end()));
  }
  {
    // One block's commitments: the first in key order.
    LedgerState s;
    for (uint32_t i = 0; i < kMaxProofCommitments; ++i) put(s, key(i, 0), prover(i), 4);
    EXPECT_EQ(ProofCommitToEvict(s), s.proof_commits.rows().begin()->first);
  }
}

// A commitment's deposit moves with it, every token accounted for in Totals::escrow: a proof
// that spends it pays it back to the account that sent the CommitProof (the payer, not the
// prover: a node's owner may send for it), an expiry forfeits it to the jackpot; a commitment kept
// without a deposit (one stored before deposits) moves nothing.
TEST(ProofCommitTest, ADepositGoesBackWithTheProofAndToTheJackpotWhenItExpires) {
  const Hash256 wid = Blake2b("witness");
  const PublicKey node = TestKey(1).public_key(), owner = TestKey(2).public_key(),
                  old = TestKey(3).public_key();
  LedgerState s = LedgerState::FromGenesis(Genesis{});
  const Totals start = s.ComputeTotals();
  auto put = [&](const Hash256& w, const PublicKey& p, const PublicKey& payer, Amount deposit) {
    const Hash256 k = ProofCommitment(w, p);
    s.proof_commits.Put(
        k, ProofCommit{
               .commitment = k, .prover = p, .height = 10, .payer = payer, .deposit = deposit});
  };
  put(wid, node, owner, 100);
  put(wid, old, old, 0);
  put(Blake2b("junk"), owner, owner, 70);
  EXPECT_EQ(s.ComputeTotals().escrow, start.escrow + 170);
  EXPECT_EQ(TakeProofCommitter(s, wid, node, 11, /*nodes_only=*/false), node);
  EXPECT_EQ(s.accounts.Find(owner)->balance, 100u);  // back to the payer
  EXPECT_EQ(s.accounts.Find(node), nullptr);
  EXPECT_EQ(s.accounts.Find(old), nullptr);  // no deposit, nothing back
  EXPECT_EQ(s.ComputeTotals().escrow, start.escrow + 70);
  ExpireProofCommits(s, 10 + kProofCommitmentBlocks);
  EXPECT_TRUE(s.proof_commits.rows().empty());
  EXPECT_EQ(s.accounts.Find(owner)->balance, 100u);
  EXPECT_EQ(s.g().jackpot, start.jackpot + 70);
  EXPECT_EQ(s.ComputeTotals().escrow, start.escrow);
}

// Who the ledger links to a cheater (and pays no reward for proving it): the cheater's node key,
// its owner and the owner's other nodes; not another owner's node, nor an account it cannot link.
TEST(LinkedToCheaterTest, TheCheaterItsOwnerAndTheOwnersOtherNodesAreLinked) {
  LedgerState s;
  const PublicKey cheater = TestKey(1).public_key(), owner = TestKey(2).public_key(),
                  sibling = TestKey(3).public_key(), other = TestKey(4).public_key(),
                  stranger = TestKey(5).public_key();
  s.nodes.Put(cheater, NodeRecord{.id = cheater, .owner = owner});
  s.nodes.Put(sibling, NodeRecord{.id = sibling, .owner = owner});
  s.nodes.Put(other, NodeRecord{.id = other, .owner = stranger});
  EXPECT_TRUE(LinkedToCheater(s, cheater, cheater));
  EXPECT_TRUE(LinkedToCheater(s, cheater, owner));
  EXPECT_TRUE(LinkedToCheater(s, cheater, sibling));
  EXPECT_FALSE(LinkedToCheater(s, cheater, other));
  EXPECT_FALSE(LinkedToCheater(s, cheater, stranger));
}

// A token task (a GPT on text, its data root over its token pages) is proven as a classification
// task is, each step's batch by the pages it reads (StepBatchPages), each proven against the data
// root as a RefereeStageStep's batch is.
class TokenFraudProofTest : public FraudProofTest {
 protected:
  TokenFraudProofTest() : FraudProofTest(kTinyGptBundle) {}
};

TEST_F(TokenFraudProofTest, AGptUnitIsProvenFromItsStepsTokenPagesAfterTheFact) {
  ASSERT_TRUE(trainer_->data().tokens);
  RunPoisonedTask();
  const TaskRecord finished = Task();
  ASSERT_EQ(finished.params.data_page_tokens, engine::kTokenPageTokens);
  const uint64_t window_end = AuditWindowEnd(finished, genesis_.params.audit_window_blocks);
  while (chain_->Height() + 1 <= window_end) Step();  // the model stays (FraudProofTest's case)
  const Amount paid = Unit(u_).paid;
  const Amount stake_before = Node(s1_).stake;

  // The honest segment 0 replays to its committed leaf: nothing to prove.
  Refused(Prove(dave_, 0, SegmentProof(0)), "replays to its committed end");
  // Witnesses whose batches do not check out, each refused naming what is wrong.
  const SegmentWitness good = SegmentProof(1);
  ASSERT_TRUE(good.examples.empty());
  ASSERT_GE(good.pages.size(), 2u);
  SegmentWitness w = good;
  w.pages[1].tokens[0] ^= 1;  // not the task's data
  Refused(Prove(dave_, 1, w), "is not proven against the task's data root");
  w = good;
  w.pages.pop_back();
  Refused(Prove(dave_, 1, w), "the batches of the segment's 2 steps read");
  w = good;
  std::reverse(w.pages.begin(), w.pages.end());  // steps 3 and 4 out of order
  Refused(Prove(dave_, 1, w), "the step's batch read page");
  w = good;
  w.examples.push_back(StepWitnessExample{.index = 0, .x = {1.0f}, .y = 0, .proof = {}});
  Refused(Prove(dave_, 1, w), "a token task's batches are proven by their token pages");
  w = good;
  w.state[0] += 1e-3f;
  Refused(Prove(dave_, 1, w), "the unit's committed leaf 1");
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);

  // The true witness: the ledger replays steps 3 and 4 on the proven pages to states_[4].
  const Bytes wire = EncodeSegmentWitness(good);
  std::printf("tiny GPT segment witness (2 steps): %zu bytes, %zu token pages\n", wire.size(),
              good.pages.size());
  StepOk({Prove(dave_, 1, good)});
  const NodeRecord s1 = Node(s1_);
  EXPECT_EQ(s1.status, NodeStatus::kJailed);
  EXPECT_EQ(s1.reputation.slashes, 1u);
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_EQ(f.index, static_cast<uint32_t>(u_));
  EXPECT_EQ(f.segment, 1u);
  EXPECT_EQ(f.solver, s1_.public_key());
  EXPECT_EQ(f.clawed_back, paid);
  EXPECT_EQ(f.slashed, protocol::SlashAmount(UnitCost(t, Unit(u_).price), kSlashMultiple));
  EXPECT_EQ(s1.stake, stake_before - paid - f.slashed);
  EXPECT_EQ(t.status, TaskStatus::kFinished);
  EXPECT_EQ(t.final_state, finished.final_state);
  ExpectEarningsAddUpToTheTask();
  Refused(Prove(erin_, 1, good), "already");
}

// Fraud proofs that take the task back (docs/verification.md, "Fraud proofs after the fact"): a
// task of two rounds. Rounds in flight: round 1 trains while round 0 settles, so its
// assignments must outlive the blocks the test spends on round 0's checks.
class ReopenTest : public FraudProofTest {
 protected:
  ReopenTest() {
    rounds_ = 2;
    genesis_.params.min_deadline_blocks = 40;
    // The slash's treasury share and the claw-back fund the redo of both rounds in full (at
    // 10 x, the last aggregation of the redo would find the escrow empty).
    genesis_.params.slash_multiple = 20;
  }
  // s1's unit `p` (poisoned after step 2) and s2's unit `h` (honest) of the current round are
  // committed, aggregated and checked clean.
  void CommitPoisonedAndHonest(int p, int h) {
    PoisonUnit(static_cast<uint32_t>(p));
    StepOk({CommitTx(p, poisoned_, Blake2b("poisoned delta")), CommitTx(h, Leaves(h, false))});
    pending_secrets_.clear();
    Aggregate();
    SettleClean({p, h});
    ASSERT_EQ(Check(p).result(), CheckResult::kCheckClean) << Check(p).reason();
  }
  // What a rewind to round 0 leaves: the task open in round 0 from the initial weights, no
  // aggregate, nothing final, no unit of s1's paid or kept.
  void ExpectBackAtRoundZero(const std::vector<int>& units) {
    const TaskRecord t = Task();
    EXPECT_EQ(t.status, TaskStatus::kOpen);
    EXPECT_EQ(Machine().round(), 0u);
    EXPECT_EQ(Machine().round_weights(), initial_state_);
    EXPECT_TRUE(t.round_results.empty());
    EXPECT_EQ(t.rounds_settled, 0u);
    EXPECT_TRUE(t.final_state.IsZero());
    EXPECT_EQ(t.closed_height, 0u);
    for (int u : units) {
      EXPECT_NE(Unit(u).status, WorkUnitStatus::kVerified) << u;
      EXPECT_EQ(Unit(u).paid, 0u) << u;
      EXPECT_NE(Unit(u).assignee, s1_.public_key()) << u;
    }
    EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
  }
  // The redo: both rounds again (s2 alone: s1 is jailed), the task finishes, only honest work
  // paid; s2 keeps what it was paid before the rewind besides the redo's pay.
  void RedoAndFinish(Amount s2_paid_before_rewind) {
    RunHonestRound();
    ASSERT_EQ(Machine().round(), 1u);
    RunHonestRound();
    FinishTask();
    ExpectOnlyTheHonestSolversWorkPaid();
    Amount units = 0;
    for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) units += u.paid;
    EXPECT_EQ(Node(s2_).earnings.units, s2_paid_before_rewind + units);
    const TaskRecord t = Task();
    EXPECT_FALSE(t.final_state.IsZero());
    EXPECT_EQ(t.rounds_settled, 2u);
    EXPECT_EQ(t.budget, t.escrow + t.spent + t.refunded);
    ExpectEarningsAddUpToTheTask();
  }
};

// Within the audit window after the task finished: s1's round-1 unit is proven; the task is
// reopened and goes back to round 0 (s1's clean-looking round-0 unit is tainted too), what s1
// was paid for both units comes back into the escrow with the slash's share, and the redo runs
// without s1 and finishes the task again, with a new audit window.
TEST_F(ReopenTest, AProofWithinTheAuditWindowReopensTheFinishedTaskAndRedoesItWithoutTheCheater) {
  Start();
  const int p0 = UnitOf(s1_), h0 = UnitOf(s2_);
  ASSERT_GE(p0, 0);
  ASSERT_GE(h0, 0);
  CommitAll({{p0, false}, {h0, false}});
  Aggregate();
  SettleClean({p0, h0});
  const auto [p1, h1] = NextUnitsOfBothSolvers();
  ASSERT_GE(p1, 2);
  ASSERT_GE(h1, 2);
  u_ = p1;
  CommitPoisonedAndHonest(p1, h1);
  FinishTask();
  const TaskRecord finished = Task();
  ASSERT_GT(finished.closed_height, 0u);
  ASSERT_FALSE(finished.final_state.IsZero());
  const uint64_t window_end = AuditWindowEnd(finished, genesis_.params.audit_window_blocks);
  ASSERT_EQ(window_end, finished.closed_height + genesis_.params.audit_window_blocks);
  const Amount paid_p0 = Unit(p0).paid, paid_p1 = Unit(p1).paid;
  ASSERT_EQ(paid_p0, kTestUnitCost);
  ASSERT_EQ(paid_p1, kTestUnitCost);
  const Amount s1_stake = Node(s1_).stake, gina_before = Balance(gina_);
  const Amount s2_paid_before_rewind = Node(s2_).earnings.units;
  ASSERT_EQ(s2_paid_before_rewind, 2 * kTestUnitCost);  // h0, h1

  // The last block of the window.
  while (chain_->Height() + 1 < window_end) Step();
  StepOk({Prove(dave_, 1, SegmentProof(1))});
  ASSERT_EQ(chain_->Height(), window_end);
  ExpectBackAtRoundZero({p0, h0, p1, h1});
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_TRUE(f.rewound);
  EXPECT_EQ(f.rewound_to, 0u);
  EXPECT_EQ(f.round, 1u);
  EXPECT_EQ(f.clawed_back, paid_p0 + paid_p1);  // every tainted unit, not only the proven one
  EXPECT_EQ(f.slashed, protocol::SlashAmount(kTestUnitCost, 20));
  EXPECT_EQ(Node(s1_).stake, s1_stake - paid_p0 - paid_p1 - f.slashed);
  EXPECT_EQ(Node(s1_).earnings.clawed_back, paid_p0 + paid_p1);
  EXPECT_EQ(t.verification.reopened, 1u);
  EXPECT_EQ(t.verification.rounds_rewound, 2u);
  EXPECT_EQ(t.verification.rounds_dropped, 0u);
  EXPECT_EQ(t.verification.clawed_back, paid_p0 + paid_p1);
  // The redo's funds: the claw-back and the slash's treasury share, nothing from the submitter.
  EXPECT_GT(t.verification.redo_escrow, 0u);
  EXPECT_EQ(t.escrow, paid_p0 + paid_p1 + t.verification.redo_escrow);
  EXPECT_EQ(Balance(gina_), gina_before);
  const nlohmann::json j = TaskToJson(t, genesis_.params.audit_window_blocks);
  EXPECT_EQ(j["status"], "open");
  EXPECT_EQ(j["closed_height"], 0);
  EXPECT_EQ(j["audit_window_end"], 0);
  EXPECT_EQ(j["verification"]["reopened"], 1);
  EXPECT_EQ(j["verification"]["proven_frauds"][0]["rewound"], true);
  EXPECT_EQ(j["verification"]["proven_frauds"][0]["rewound_to"], 0);
  // The proven unit is running again (the task moves on, so not Refused's unchanged task).
  const Receipt again = Step({Prove(erin_, 1, SegmentProof(1))})[0];
  EXPECT_FALSE(again.ok);
  EXPECT_NE(again.reason.find("is not final yet"), std::string::npos) << again.reason;
  EXPECT_EQ(Task().verification.proven_frauds.size(), 1u);

  RedoAndFinish(s2_paid_before_rewind);
  EXPECT_GT(Task().closed_height, finished.closed_height);  // a new audit window
  EXPECT_EQ(Task().verification.reopened, 1u);
}

// While the task is open, a proof of a unit in a final round rewinds the task the same way:
// round 0 (final, s1's poisoned unit in it) and round 1 (training on top of it) run again.
TEST_F(ReopenTest, AProofWhileTheTaskIsOpenRewindsItsFinalRounds) {
  Start();
  u_ = UnitOf(s1_);
  other_ = UnitOf(s2_);
  ASSERT_GE(u_, 0);
  ASSERT_GE(other_, 0);
  CommitPoisonedAndHonest(u_, other_);
  for (int i = 0; i < 40 && Task().rounds_settled == 0; ++i) Step();
  ASSERT_EQ(Task().rounds_settled, 1u);
  ASSERT_EQ(Machine().round(), 1u);
  const Amount paid = Unit(u_).paid;
  ASSERT_EQ(paid, kTestUnitCost);
  const Amount s2_paid_before_rewind = Node(s2_).earnings.units;
  const Amount escrow_before = Task().escrow;

  StepOk({Prove(dave_, 1, SegmentProof(1))});
  ExpectBackAtRoundZero({u_, other_, 2, 3});
  const TaskRecord t = Task();
  const ProvenFraud& f = t.verification.proven_frauds.at(0);
  EXPECT_TRUE(f.rewound);
  EXPECT_EQ(f.rewound_to, 0u);
  EXPECT_EQ(f.clawed_back, paid);
  EXPECT_EQ(t.verification.reopened, 0u);        // never closed
  EXPECT_EQ(t.verification.rounds_rewound, 1u);  // round 0 was final
  EXPECT_EQ(t.verification.rounds_dropped, 1u);  // round 1 was training
  EXPECT_EQ(t.escrow, escrow_before + paid + t.verification.redo_escrow);

  RedoAndFinish(s2_paid_before_rewind);
}

// Stake that is unbonding is still slashable; stake withdrawn is gone, and with it the proof.
TEST_F(FraudProofTest, UnbondingStakeIsSlashedAndWithdrawnStakeIsOutOfReach) {
  RunPoisonedTask();
  StepOk({N(s1_, LeaveNodeTx{.node_id = s1_.public_key()})});
  ASSERT_EQ(Node(s1_).stake, 0u);
  const Amount unbonding_before = chain_->GetAccount(alice_.public_key())->unbonding.at(0).amount;
  StepOk({Prove(dave_, 1, SegmentProof(1))});
  const ProvenFraud f = Task().verification.proven_frauds.at(0);
  EXPECT_GT(f.slashed, 0u);
  EXPECT_GT(f.clawed_back, 0u);
  const Account alice = *chain_->GetAccount(alice_.public_key());
  ASSERT_EQ(alice.unbonding.size(), 1u);
  EXPECT_EQ(alice.unbonding[0].amount, unbonding_before - f.slashed - f.clawed_back);
}

TEST_F(FraudProofTest, AProofAfterTheSolverWithdrewEverythingIsRefused) {
  RunPoisonedTask();
  StepOk({N(s1_, LeaveNodeTx{.node_id = s1_.public_key()})});
  Steps(static_cast<int>(genesis_.params.unbonding_delay_blocks) + 1);
  StepOk({Q(alice_, WithdrawTx{})});
  Refused(Prove(dave_, 1, SegmentProof(1)), "has no stake bonded any more");
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);
}

// The task record keeps its proofs through the encoding the state hash and the database use.
// A lazy solver caught by a whistleblower falls silent on purpose, so that the verifier that
// approved its unit without replaying keeps its stake. In the merits window the whistleblower
// sends the disputed segment's witness (what ProveFraud carries); the ledger replays it, and the
// rubber stamp is slashed with the solver. The bounty is what the solver's slash took.
TEST_F(FraudProofTest, ALazySolverFallingSilentInAWhistleblowersDisputeLosesItsStampOnTheMerits) {
  Start();
  ASSERT_NO_FATAL_FAILURE(SettlePoisonedUnitClean());
  const uint32_t ui = static_cast<uint32_t>(u_);
  auto merits = [&](const KeyPair& node, uint32_t segment, const SegmentWitness& w) {
    return N(node, ProveMeritsTx{.task_id = task_id_,
                                 .index = ui,
                                 .node_id = node.public_key(),
                                 .segment = segment,
                                 .witness = {EncodeSegmentWitness(w)}});
  };
  // Before any dispute there are no merits to show.
  Receipt early = Step({merits(wb_, 1, SegmentProof(1))})[0];
  EXPECT_EQ(early.code, StatusCode::kFailedPrecondition) << early.reason;
  // The whistleblower commits to its merits as it challenges (CommitProof: the merits window is
  // one block here, and the bounty is the earliest committer's).
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = ui,
                                 .node_id = wb_.public_key(),
                                 .claim = ClaimOf(poisoned_, 1, states_[4])}),
          N(wb_, CommitOf(Merits(wb_, 1, SegmentProof(1)), wb_.public_key()))});
  PlayDispute(ui, nullptr, [&](uint64_t s) { return states_.at(s); });
  ASSERT_TRUE(HasCheck(ui));
  ASSERT_TRUE(Check(ui).awaits_merits()) << Check(ui).reason();
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);  // nothing settled yet
  EXPECT_EQ(Node(v1_).reputation.slashes, 0u);
  SegmentWitness damaged = SegmentProof(1);
  damaged.state[0] += 1e-3f;
  const Amount erin_before = Balance(erin_);
  // In one block (the window is dispute_response_blocks long): refusals, each changing nothing,
  // then the merits.
  std::vector<Receipt> r = Step({merits(agg_, 1, SegmentProof(1)),  // not a checker
                                 merits(wb_, 0, SegmentProof(0)),   // not the disputed segment
                                 merits(wb_, 1, damaged),           // does not check out
                                 merits(wb_, 1, SegmentProof(1))});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].code, StatusCode::kPermissionDenied) << r[0].reason;
  EXPECT_NE(r[1].reason.find("not the disputed one"), std::string::npos) << r[1].reason;
  EXPECT_NE(r[2].reason.find("the unit's committed leaf 1"), std::string::npos) << r[2].reason;
  ASSERT_TRUE(r[3].ok) << r[3].reason;
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(v1_).reputation.slashes, 1u);  // the rubber stamp
  EXPECT_EQ(Node(wb_).reputation.slashes, 0u);
  const Amount slashed = Node(s1_).earnings.slashed;
  EXPECT_GT(slashed, 0u);
  EXPECT_EQ(Node(wb_).earnings.jackpot, slashed);  // the whole bounty: shown on the merits
  // The bounty, and the deposit of the commitment the merits spent (paid before erin_before).
  EXPECT_EQ(Balance(erin_) - erin_before, slashed + genesis_.params.proof_commit_deposit);
  ExpectEarningsAddUpToTheTask();
  EXPECT_TRUE(Rerunning());
}

// The merits say clean: a whistleblower challenges a segment the solver computed honestly (s1's
// segment 0) with a made-up replay, and the solver falls silent. Its segment's witness replays to
// the committed end, so ProveMerits is refused (a whistleblower's node sends none: node/
// step_witness.h BuildSegmentWitnessOf finds nothing to show); the window closes into the loss by
// silence alone, as documented for an honest solver that crashed: it is slashed, the verifier
// that called the unit clean keeps its stake, the whistleblower gets the jackpot's share.
TEST_F(FraudProofTest, AnHonestSegmentsMeritsAreNotShownAndItsVerifierKeepsItsStake) {
  Start();
  ASSERT_NO_FATAL_FAILURE(SettlePoisonedUnitClean());
  const uint32_t ui = static_cast<uint32_t>(u_);
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = ui,
                                 .node_id = wb_.public_key(),
                                 .claim = ClaimOf(poisoned_, 0, Blake2b("a made-up replay"))})});
  PlayDispute(ui, nullptr, [&](uint64_t s) { return states_.at(s); });
  ASSERT_TRUE(HasCheck(ui));
  ASSERT_TRUE(Check(ui).awaits_merits()) << Check(ui).reason();
  const ProveMeritsTx clean{.task_id = task_id_,
                            .index = ui,
                            .node_id = wb_.public_key(),
                            .segment = 0,
                            .witness = {EncodeSegmentWitness(SegmentProof(0))}};
  const Receipt r = Step({N(wb_, clean)})[0];
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("replays to its committed end"), std::string::npos) << r.reason;
  for (int i = 0; i < 20 && HasCheck(ui) && Check(ui).stage() != CheckStage::kCheckSettled; ++i) {
    Step();
  }
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(v1_).reputation.slashes, 0u);
  EXPECT_EQ(Node(wb_).reputation.slashes, 0u);
  const Amount slashed = Node(s1_).earnings.slashed;
  EXPECT_EQ(Node(wb_).earnings.jackpot, BasisPoints(slashed, genesis_.params.slash_jackpot_bps));
  ExpectEarningsAddUpToTheTask();
}

// One rule says where a unit's merits can be shown (ProveMerits) and so where the merits window
// opens: an exact-mode task with a data root (over examples or token pages) whose unit state fits
// a segment witness; not a pipeline task, a tolerance-mode one, one without a data root, or one
// whose state may be over kMaxStepWitnessState (AStageSilentInAWhistleblowersDisputeLosesWithout-
// AMeritsWindow shows a pipeline task's silent stage settling at once; UnitCheckTest.ASilent-
// SolverWhoseMeritsCannotBeShownLosesAtOnce the check's side).
TEST(ProveMeritsRefusalTest, TheMeritsAreShownOnlyWhereTheLedgerReplaysASegmentWitness) {
  const TaskParams ok = TestTaskParams();
  EXPECT_EQ(ProveMeritsRefusal(ok), nullptr);
  TaskParams tokens = ok;
  tokens.data_page_tokens = static_cast<uint32_t>(engine::kTokenPageTokens);
  EXPECT_EQ(ProveMeritsRefusal(tokens), nullptr);
  auto refused = [](const TaskParams& p, const std::string& why) {
    const char* got = ProveMeritsRefusal(p);
    ASSERT_NE(got, nullptr) << why;
    EXPECT_NE(std::string(got).find(why), std::string::npos) << got;
  };
  TaskParams tolerance = ok;
  tolerance.tolerance_rel_l2_ppm = 50;
  refused(tolerance, "tolerance mode");
  TaskParams cosine = ok;
  cosine.tolerance_cosine_gap_ppb = 50;
  refused(cosine, "tolerance mode");
  TaskParams no_root = ok;
  no_root.data_root = Hash256{};
  refused(no_root, "without a data root");
  TaskParams pipeline = ok;
  pipeline.stages = 3;
  refused(pipeline, "a pipeline task");
  TaskParams large = ok;
  large.model_bytes = kMaxStepWitnessState / 3 + 4;
  refused(large, "may not fit a transaction");
  large.model_bytes = kMaxStepWitnessState / 3;
  EXPECT_EQ(ProveMeritsRefusal(large), nullptr);
  // ProveFraud's own rule stays what it was: a large model is still proven where its witness fits.
  large.model_bytes = kMaxStepWitnessState;
  EXPECT_EQ(SegmentReplayRefusal(large), nullptr);
}

// The same lazy solver, silent on purpose, shows its own merits first from a second
// whistleblower node of its owner's: paid nothing (LinkedToCheater; until 2026-12-06 it got the
// jackpot's share of its slash), so its fraud costs its owner all its slash took, which stays in
// the pools. (A node under a key the ledger cannot link to it gets the jackpot's share, as any
// prover but the whistleblower that challenged: AVerifierShowsTheMeritsTheWhistleblowerKeptBack.)
TEST_F(FraudProofTest, ASilentSolverShowingItsOwnMeritsFromASecondNodeGetsNothingBack) {
  const KeyPair second = TestKey(27);
  owner_[second.public_key()] = &alice_;  // s1's owner
  Start();
  StepOk({N(second, Reg(second, kRoleWhistleblower))});
  ASSERT_NO_FATAL_FAILURE(SettlePoisonedUnitClean());
  const uint32_t ui = static_cast<uint32_t>(u_);
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = ui,
                                 .node_id = wb_.public_key(),
                                 .claim = ClaimOf(poisoned_, 1, states_[4])})});
  PlayDispute(ui, nullptr, [&](uint64_t s) { return states_.at(s); });
  ASSERT_TRUE(Check(ui).awaits_merits()) << Check(ui).reason();
  const Amount alice_before = Balance(alice_), erin_before = Balance(erin_);
  const Totals before = chain_->GetTotals();
  StepOk({N(second, ProveMeritsTx{.task_id = task_id_,
                                  .index = ui,
                                  .node_id = second.public_key(),
                                  .segment = 1,
                                  .witness = {EncodeSegmentWitness(SegmentProof(1))}})});
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(v1_).reputation.slashes, 1u);  // the rubber stamp, as on the whistleblower's proof
  const Amount slashed = Node(s1_).earnings.slashed;
  ASSERT_GT(slashed, 0u);
  EXPECT_EQ(Node(second).earnings.jackpot, 0u);
  EXPECT_EQ(Balance(alice_), alice_before);
  EXPECT_EQ(Balance(erin_), erin_before);  // front-run: the whistleblower that challenged, unpaid
  EXPECT_EQ(Task().verification.jackpot_paid, 0u);
  // Both slashes (the solver's and the stamp's) went into the pools, and nothing came out.
  const Totals after = chain_->GetTotals();
  EXPECT_TRUE(after.Check().ok());
  EXPECT_EQ(after.minted, before.minted);
  EXPECT_EQ(
      after.jackpot + after.treasury + after.escrow,
      before.jackpot + before.treasury + before.escrow + slashed + Node(v1_).earnings.slashed);
  ExpectEarningsAddUpToTheTask();
}

// Any verifier may show the merits, not only the whistleblower that challenged: here the
// whistleblower (crashed, or the solver's accomplice) keeps them back, and a verifier that was not
// drawn for the unit shows them. The rubber stamp is slashed with the solver; the prover, not the
// challenger, is paid the jackpot's share of the solver's slash (OnMeritsShown).
TEST_F(FraudProofTest, AVerifierShowsTheMeritsTheWhistleblowerKeptBack) {
  Start(/*verifiers=*/2);
  ASSERT_NO_FATAL_FAILURE(SettlePoisonedUnitClean());
  const uint32_t ui = static_cast<uint32_t>(u_);
  const KeyPair& stamp = VerifierOf(ui);
  const KeyPair& prover = &stamp == &v1_ ? v2_ : v1_;
  // The verifier commits to the merits it will show (CommitProof) before the one-block window.
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = ui,
                                 .node_id = wb_.public_key(),
                                 .claim = ClaimOf(poisoned_, 1, states_[4])}),
          N(prover, CommitOf(Merits(prover, 1, SegmentProof(1)), prover.public_key()))});
  PlayDispute(ui, nullptr, [&](uint64_t s) { return states_.at(s); });
  ASSERT_TRUE(Check(ui).awaits_merits()) << Check(ui).reason();
  const Amount prover_before = Balance(*owner_.at(prover.public_key()));
  const Amount erin_before = Balance(erin_);
  // In one block (the window is dispute_response_blocks long): a node with neither checking role
  // is refused, the verifier's merits are shown.
  auto merits = [&](const KeyPair& node) {
    return N(node, ProveMeritsTx{.task_id = task_id_,
                                 .index = ui,
                                 .node_id = node.public_key(),
                                 .segment = 1,
                                 .witness = {EncodeSegmentWitness(SegmentProof(1))}});
  };
  const std::vector<Receipt> r = Step({merits(s2_), merits(prover)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].code, StatusCode::kPermissionDenied) << r[0].reason;
  ASSERT_TRUE(r[1].ok) << r[1].reason;
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(stamp).reputation.slashes, 1u);
  EXPECT_EQ(Node(prover).reputation.slashes, 0u);
  const Amount share = BasisPoints(Node(s1_).earnings.slashed, genesis_.params.slash_jackpot_bps);
  ASSERT_GT(share, 0u);
  EXPECT_EQ(Node(prover).earnings.jackpot, share);
  // The share, and the deposit of the commitment the merits spent (paid before prover_before).
  EXPECT_EQ(Balance(*owner_.at(prover.public_key())),
            prover_before + share + genesis_.params.proof_commit_deposit);
  EXPECT_EQ(Balance(erin_), erin_before);
  ExpectEarningsAddUpToTheTask();
  EXPECT_TRUE(Rerunning());
}

// A late dispute (LateChallenge; docs/verification.md, "Over 8 MiB: a late dispute"): the game a
// fraud proof whose witness does not fit plays after the fact, here after the audit window (the
// model stays) on s1's poisoned unit, each side lying or silent in turn. Segment 1 is the poisoned
// one (a true challenge); segment 0 is honest (the challenger lies about it).
enum class LateCase { kSolverLies, kChallengerLies, kSolverSilent, kChallengerSilent };

class LateGameTest : public FraudProofTest, public ::testing::WithParamInterface<LateCase> {
 protected:
  Transaction Late(const KeyPair& sender, uint32_t segment, const Hash256& end, Amount bond) {
    return Q(sender, LateChallengeTx{.task_id = task_id_,
                                     .index = static_cast<uint32_t>(u_),
                                     .segment = segment,
                                     .end = end,
                                     .bond = bond,
                                     .bundle = {}});
  }
  protocol::DisputeGame LateGameOf() {
    return protocol::DisputeGame::Decode(Unit(u_).late.game).value();
  }
  Transaction Post(const KeyPair& signer, const PublicKey& party, uint64_t position,
                   const Hash256& hash) {
    return Q(signer, DisputePostTx{.task_id = task_id_,
                                   .index = static_cast<uint32_t>(u_),
                                   .node_id = party,
                                   .position = position,
                                   .hash = hash});
  }
  // Plays the late game's steps phase: each side's hash at a position, or silence (no function):
  // then the turn's deadline passes.
  void PlayLate(std::function<Hash256(uint64_t)> solver,
                std::function<Hash256(uint64_t)> challenger) {
    for (int turn = 0; turn < 20 && Unit(u_).late.open(); ++turn) {
      const protocol::DisputeGame g = LateGameOf();
      if (g.stage() != protocol::DisputeStage::kDisputeSteps) return;
      const uint64_t pos = g.query().position;
      std::vector<Transaction> txs;
      if (solver) txs.push_back(Post(alice_, s1_.public_key(), pos, solver(pos)));
      if (challenger) txs.push_back(Post(dave_, dave_.public_key(), pos, challenger(pos)));
      StepOk(txs);
      if (!solver || !challenger) {  // past the turn's deadline (a bounded count of blocks)
        const uint64_t past = g.query().deadline_height + 2;
        if (chain_->Height() < past) Steps(static_cast<int>(past - chain_->Height()));
      }
    }
  }
};

TEST_P(LateGameTest, TheLateGameRulesForTheHonestSideAndSilenceLoses) {
  const LateCase c = GetParam();
  const bool true_challenge = c == LateCase::kSolverLies || c == LateCase::kSolverSilent;
  RunPoisonedTask();
  const TaskRecord finished = Task();
  while (chain_->Height() + 1 <= AuditWindowEnd(finished, genesis_.params.audit_window_blocks)) {
    Step();
  }
  const Amount cost = UnitCost(finished, Unit(u_).price);
  const Amount alice_before = Balance(alice_), dave_before = Balance(dave_);
  const Amount stake_before = Node(s1_).stake;
  auto lie = [](uint64_t s) { return Hasher("late lie").UpdateU64(s).Finish(); };
  // A true challenge: segment 1 reaches states_[4], not s1's leaf 2. A false one: segment 0
  // "reaches" a made-up state, not s1's (true) leaf 1.
  const uint32_t segment = true_challenge ? 1 : 0;
  const Hash256 end = true_challenge ? states_[4] : lie(2);

  // The transaction's terms, each refused alone, changing nothing.
  ExpectEachRefused({
      {Late(dave_, segment, end, cost - 1), "bond must be at least " + std::to_string(cost)},
      {Late(dave_, 1, poisoned_[2], cost), "other than its committed leaf"},
      {Late(dave_, 2, end, cost), "segment 2 is out of range"},
      {Q(dave_, LateChallengeTx{.task_id = task_id_, .index = 99, .segment = 0, .end = end,
                                .bond = cost, .bundle = {}}),
       "out of range"},
  });
  EXPECT_FALSE(Unit(u_).late.open());
  EXPECT_EQ(Balance(dave_), dave_before);

  StepOk({Late(dave_, segment, end, cost)});
  EXPECT_EQ(Balance(dave_), dave_before - cost);  // the bond is held on the unit
  ASSERT_TRUE(Unit(u_).late.open());
  EXPECT_EQ(Task().verification.late_games, std::vector<uint32_t>{static_cast<uint32_t>(u_)});
  const protocol::DisputeGame opened = LateGameOf();
  EXPECT_EQ(opened.config().defender, s1_.public_key());
  EXPECT_EQ(opened.config().challenger, dave_.public_key());
  EXPECT_EQ(opened.config().agreed, poisoned_[segment]);
  EXPECT_EQ(opened.config().defender_claim, poisoned_[segment + 1]);
  EXPECT_EQ(opened.config().response_blocks, LateResponseBlocks(genesis_, Task()));
  EXPECT_EQ(WorkUnitToJson(Unit(u_))["late"]["game"]["stage"], "steps");
  ExpectEachRefused({
      {Late(erin_, segment, end, cost), "is open already"},
      {Post(erin_, erin_.public_key(), opened.query().position, end), "not a party"},
      {Post(erin_, dave_.public_key(), opened.query().position, end), "signs its own moves"},
  });

  // s1's states: its poisoned trajectory. The challenger's: the true ones, except a lie about
  // segment 0's end.
  auto solver_states = [&](uint64_t s) { return s == 3 ? poisoned_step3_ : states_[s]; };
  auto challenger_states = [&](uint64_t s) { return true_challenge || s < 1 ? states_[s] : lie(s); };
  PlayLate(c == LateCase::kSolverSilent ? nullptr : std::function<Hash256(uint64_t)>(solver_states),
           c == LateCase::kChallengerSilent
               ? nullptr
               : std::function<Hash256(uint64_t)>(challenger_states));
  if (c == LateCase::kSolverLies || c == LateCase::kChallengerLies) {
    ASSERT_TRUE(Unit(u_).late.open());
    const protocol::DisputeGame g = LateGameOf();
    ASSERT_EQ(g.stage(), protocol::DisputeStage::kDisputeReferee);
    const uint64_t step = g.referee_task().step;
    EXPECT_EQ(step, true_challenge ? 3u : 1u);
    // The genesis key does not rule it; the ledger executes the step from its witness.
    std::vector<Receipt> r = Step({Q(referee_, RuleDisputeTx{.task_id = task_id_,
                                                             .index = static_cast<uint32_t>(u_),
                                                             .output = states_[step]})});
    EXPECT_FALSE(r[0].ok);
    const Transaction ruling = RefereeStep(gina_, static_cast<uint32_t>(u_), Witness(step));
    StepOk({ruling});
    ASSERT_FALSE(Task().verification.rulings.empty());
    const DisputeRuling ruled = Task().verification.rulings.back();
    EXPECT_EQ(ruled.tx_id, TxId(ruling));
    EXPECT_EQ(ruled.challenger, dave_.public_key());
    EXPECT_EQ(ruled.defender_honest, !true_challenge);
    // The other party's witness, a block late: the game is closed, and the refusal says so.
    std::vector<Receipt> again =
        Step({RefereeStep(erin_, static_cast<uint32_t>(u_), Witness(step))});
    EXPECT_FALSE(again[0].ok);
    EXPECT_NE(again[0].reason.find("has no late game waiting for the referee"), std::string::npos)
        << again[0].reason;
  }
  Step();
  // The game is over, its bond paid out, nothing left on the unit.
  EXPECT_FALSE(Unit(u_).late.open());
  EXPECT_TRUE(Task().verification.late_games.empty());
  const TaskRecord t = Task();
  if (true_challenge) {
    // ProveFraud's effects: slashed, jailed, what the unit was paid clawed back; the bond back
    // and the bounty to the challenger.
    ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
    const ProvenFraud& f = t.verification.proven_frauds[0];
    EXPECT_EQ(f.index, static_cast<uint32_t>(u_));
    EXPECT_EQ(f.segment, 1u);
    EXPECT_EQ(f.solver, s1_.public_key());
    EXPECT_EQ(f.prover, dave_.public_key());
    EXPECT_EQ(f.slashed, protocol::SlashAmount(cost, kSlashMultiple));
    EXPECT_GT(f.bounty, 0u);
    EXPECT_EQ(Node(s1_).status, NodeStatus::kJailed);
    EXPECT_EQ(Node(s1_).stake, stake_before - f.clawed_back - f.slashed);
    EXPECT_EQ(Balance(dave_), dave_before + f.bounty);
    EXPECT_EQ(t.status, TaskStatus::kFinished);  // after the audit window: the model stays
    // Proven once: no second game.
    std::vector<Receipt> again = Step({Late(erin_, 1, states_[4], cost)});
    EXPECT_NE(again[0].reason.find("already"), std::string::npos) << again[0].reason;
  } else {
    // The honest solver keeps its stake and is paid its re-run from the bond (the rest of it
    // goes to the jackpot); the challenger loses its bond.
    EXPECT_TRUE(t.verification.proven_frauds.empty());
    EXPECT_EQ(Node(s1_).stake, stake_before);
    EXPECT_EQ(Node(s1_).reputation.slashes, 0u);
    EXPECT_EQ(Balance(alice_), alice_before + cost);
    EXPECT_EQ(Balance(dave_), dave_before - cost);
  }
}

INSTANTIATE_TEST_SUITE_P(EachSide, LateGameTest,
                         ::testing::Values(LateCase::kSolverLies, LateCase::kChallengerLies,
                                           LateCase::kSolverSilent, LateCase::kChallengerSilent),
                         [](const auto& info) {
                           switch (info.param) {
                             case LateCase::kSolverLies: return "SolverLies";
                             case LateCase::kChallengerLies: return "ChallengerLies";
                             case LateCase::kSolverSilent: return "SolverSilent";
                             case LateCase::kChallengerSilent: return "ChallengerSilent";
                           }
                           return "";
                         });

// A late game holds its defender's unbonding stake as a live check does (OpenCheckHold): s1 left
// after its task finished, and its owner's Withdraw of the matured entry comes in the block a late
// game on its poisoned unit opens: refused, naming the game. s1 falls silent and loses: the slash
// reaches the entry, and the rest is withdrawn once the game is over.
TEST_F(LateGameTest, AnOpenLateGameHoldsItsDefendersUnbondingStake) {
  RunPoisonedTask();
  StepOk({N(s1_, LeaveNodeTx{.node_id = s1_.public_key()})});
  Steps(static_cast<int>(genesis_.params.unbonding_delay_blocks) + 1);  // matured
  const TaskRecord finished = Task();  // past its audit window too: the model stays
  while (chain_->Height() + 1 <= AuditWindowEnd(finished, genesis_.params.audit_window_blocks)) {
    Step();
  }
  const Amount cost = UnitCost(Task(), Unit(u_).price);
  const Amount entry = chain_->GetAccount(alice_.public_key())->unbonding.at(0).amount;
  const Amount alice_before = Balance(alice_);
  std::vector<Receipt> r = Step({Late(dave_, 1, states_[4], cost), Q(alice_, WithdrawTx{})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  EXPECT_FALSE(r[1].ok);
  EXPECT_NE(r[1].reason.find("late dispute"), std::string::npos) << r[1].reason;
  EXPECT_NE(r[1].reason.find("unit " + std::to_string(u_)), std::string::npos) << r[1].reason;
  PlayLate(nullptr, [&](uint64_t s) { return states_[s]; });
  Step();
  ASSERT_FALSE(Unit(u_).late.open());
  ASSERT_EQ(Task().verification.proven_frauds.size(), 1u);
  const ProvenFraud f = Task().verification.proven_frauds[0];
  EXPECT_GT(f.slashed, 0u);
  const Amount left = entry - f.slashed - f.clawed_back;
  ASSERT_EQ(chain_->GetAccount(alice_.public_key())->unbonding.at(0).amount, left);
  StepOk({Q(alice_, WithdrawTx{})});
  EXPECT_EQ(Balance(alice_), alice_before + left);
  EXPECT_TRUE(chain_->GetTotals().Check().ok());
}

// A late game's challenger is an account that posts its bond from its balance when it opens the
// game (ExecuteLateChallenge debits it; the unit holds it), so its stake is no part of what it can
// lose and nothing of it is held. Here erin challenges s1's honest segment 0 late with a made-up
// end, and her whistleblower node leaves and is withdrawn whole in the same block; s1 answers, erin
// falls silent and loses the bond in full: the unit's cost to s1's owner, the rest to the jackpot.
TEST_F(LateGameTest, ALosingLateChallengerPaysItsWholeBondThoughItsNodeLeftAndWithdrew) {
  RunPoisonedTask();
  StepOk({N(wb_, LeaveNodeTx{.node_id = wb_.public_key()})});
  Steps(static_cast<int>(genesis_.params.unbonding_delay_blocks) + 1);  // matured
  const TaskRecord finished = Task();                                   // past its audit window too
  while (chain_->Height() + 1 <= AuditWindowEnd(finished, genesis_.params.audit_window_blocks)) {
    Step();
  }
  const Amount cost = UnitCost(Task(), Unit(u_).price);
  const Amount bond = 3 * cost;
  const Amount alice_before = Balance(alice_), erin_before = Balance(erin_);
  const Totals before = chain_->GetTotals();
  const Hash256 lie = Hasher("late lie").UpdateU64(2).Finish();
  std::vector<Receipt> r = Step({Late(erin_, 0, lie, bond), Q(erin_, WithdrawTx{})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  ASSERT_TRUE(r[1].ok) << r[1].reason;
  EXPECT_EQ(Balance(erin_), erin_before - bond + kStake);
  EXPECT_TRUE(chain_->GetAccount(erin_.public_key())->unbonding.empty());
  PlayLate([&](uint64_t s) { return s == 3 ? poisoned_step3_ : states_[s]; }, nullptr);
  Step();
  ASSERT_FALSE(Unit(u_).late.open());
  EXPECT_TRUE(Task().verification.proven_frauds.empty());
  EXPECT_EQ(Balance(erin_), erin_before - bond + kStake);  // the bond, lost in full
  EXPECT_EQ(Balance(alice_), alice_before + cost);
  const Totals after = chain_->GetTotals();
  EXPECT_TRUE(after.Check().ok()) << after.Check().ToString();
  EXPECT_EQ(after.minted, before.minted);
  EXPECT_EQ(after.jackpot, before.jackpot + bond - cost);
}

// A unit taken back while its late game runs (here proven by a ProveFraud that fits) leaves the
// game nothing to decide: it closes and the challenger gets its bond back.
TEST_F(FraudProofTest, ALateGameWhoseUnitIsProvenMeanwhileReturnsItsBond) {
  RunPoisonedTask();
  const Amount cost = UnitCost(Task(), Unit(u_).price);
  const Amount erin_before = Balance(erin_);
  StepOk({Q(erin_, LateChallengeTx{.task_id = task_id_, .index = static_cast<uint32_t>(u_),
                                   .segment = 1, .end = states_[4], .bond = cost, .bundle = {}})});
  ASSERT_TRUE(Unit(u_).late.open());
  StepOk({Prove(dave_, 1, SegmentProof(1))});
  Step();
  EXPECT_FALSE(Unit(u_).late.open());
  EXPECT_TRUE(Task().verification.late_games.empty());
  EXPECT_EQ(Balance(erin_), erin_before);
}

// A unit's late game and a task's list of them are optional tails: present only while a game is
// open, so every other record encodes as before.
TEST(LateGameRecordTest, TheTailsRoundTripAndAreAbsentWhenNoGameIsOpen) {
  WorkUnit u;
  u.task_id = Blake2b("task");
  u.index = 3;
  u.leaves = {Blake2b("a"), Blake2b("b")};
  Encoder plain;
  EncodeWorkUnit(plain, u);
  WorkUnit late = u;
  late.late = LateGame{.challenger = TestKey(2).public_key(), .segment = 1, .bond = 70,
                       .game = Bytes{1, 2, 3}};
  Encoder e;
  EncodeWorkUnit(e, late);
  const Bytes enc = e.Take();
  EXPECT_GT(enc.size(), plain.Take().size());
  Decoder d(enc, "unit");
  WorkUnit back;
  ASSERT_TRUE(DecodeWorkUnit(d, &back).ok());
  ASSERT_TRUE(d.Finish().ok());
  EXPECT_EQ(back, late);

  TaskRecord t;
  t.id = Blake2b("task");
  Encoder te0;
  EncodeTask(te0, t);
  const size_t without = te0.Take().size();
  t.verification.late_games = {3, 5};
  Encoder te;
  EncodeTask(te, t);
  const Bytes tenc = te.Take();
  EXPECT_EQ(tenc.size(), without + 8 + 8 + 4 + 4 + 2 * 4);  // the tail, no rulings, the list
  Decoder td(tenc, "task");
  TaskRecord tback;
  ASSERT_TRUE(DecodeTask(td, &tback).ok());
  ASSERT_TRUE(td.Finish().ok());
  EXPECT_EQ(tback, t);
}

TEST(ProvenFraudTest, TheTaskRecordKeepsItsProofsThroughItsEncoding) {
  TaskRecord t;
  t.id = Blake2b("task");
  t.verification.clawed_back = 7;
  for (uint32_t i : {3u, 9u}) {
    t.verification.proven_frauds.push_back(ProvenFraud{.round = i / 4,
                                                       .index = i,
                                                       .segment = 1,
                                                       .solver = TestKey(1).public_key(),
                                                       .prover = TestKey(2).public_key(),
                                                       .height = 40 + i,
                                                       .slashed = 190,
                                                       .clawed_back = 19,
                                                       .bounty = 95});
  }
  Encoder e;
  EncodeTask(e, t);
  const Bytes enc = e.Take();
  Decoder d(enc, "task");
  TaskRecord back;
  ASSERT_TRUE(DecodeTask(d, &back).ok());
  ASSERT_TRUE(d.Finish().ok());
  EXPECT_EQ(back, t);
  for (size_t cut : {enc.size() - 1, enc.size() - 40}) {
    Decoder short_d(ByteSpan(enc).first(cut), "task");
    TaskRecord partial;
    EXPECT_FALSE(DecodeTask(short_d, &partial).ok() && short_d.Finish().ok()) << cut;
  }
  const nlohmann::json j = TaskToJson(t);
  EXPECT_EQ(j["verification"]["fraud_rounds"], nlohmann::json::array({0, 2}));
  EXPECT_EQ(j["verification"]["proven_frauds"][1]["index"], 9);
  EXPECT_EQ(j["verification"]["proven_frauds"][1]["prover"], TestKey(2).public_key().ToHex());

  // The tail a closed (or reopened) task adds; a task that never closed has none, so its record
  // encodes as it did before the tail existed.
  TaskRecord closed = t;
  closed.closed_height = 77;
  closed.verification.reopened = 1;
  closed.verification.proven_frauds[1].rewound = true;
  closed.verification.proven_frauds[1].rewound_to = 1;
  Encoder ce;
  EncodeTask(ce, closed);
  const Bytes cenc = ce.Take();
  EXPECT_EQ(cenc.size(), enc.size() + 16);
  Decoder cd(cenc, "task");
  TaskRecord cback;
  ASSERT_TRUE(DecodeTask(cd, &cback).ok());
  ASSERT_TRUE(cd.Finish().ok());
  EXPECT_EQ(cback, closed);
  Bytes zero_tail = enc;  // a tail of zeros is not how any record is written
  zero_tail.resize(enc.size() + 16, 0);
  Decoder zd(zero_tail, "task");
  TaskRecord zback;
  EXPECT_EQ(DecodeTask(zd, &zback).code(), StatusCode::kDataLoss);
  const nlohmann::json cj = TaskToJson(closed, 10);
  EXPECT_EQ(cj["closed_height"], 77);
  EXPECT_EQ(cj["audit_window_end"], 0);  // status open: a proof rewinds it anyway
  EXPECT_EQ(cj["verification"]["reopened"], 1);
  EXPECT_EQ(cj["verification"]["proven_frauds"][1]["rewound_to"], 1);
  closed.status = TaskStatus::kFinished;
  EXPECT_EQ(TaskToJson(closed, 10)["audit_window_end"], 87);
  EXPECT_EQ(AuditWindowEnd(closed, 10), 87u);
  closed.status = TaskStatus::kCancelled;
  EXPECT_EQ(AuditWindowEnd(closed, 10), 0u);
}

// The task record keeps its rulings through its encoding: after the tail (written with zeros for
// a task that never closed), so a task that never had a ruling encodes as it did before rulings
// were kept. A ruling whose transaction rules nothing, or an empty list written, is refused.
TEST(DisputeRulingTest, TheTaskRecordKeepsItsRulingsThroughItsEncoding) {
  TaskRecord t;
  t.id = Blake2b("task");
  Encoder e;
  EncodeTask(e, t);
  const Bytes plain = e.Take();
  for (const TxType tx : {TxType::kRefereeStep, TxType::kRuleDispute}) {
    t.verification.rulings.push_back(DisputeRuling{.tx = static_cast<uint16_t>(tx),
                                                   .tx_id = Blake2b("tx"),
                                                   .sender = TestKey(1).public_key(),
                                                   .height = 12,
                                                   .index = 3,
                                                   .round = 1,
                                                   .step = 2,
                                                   .defender = TestKey(2).public_key(),
                                                   .challenger = TestKey(3).public_key(),
                                                   .witness_bytes = 900,
                                                   .defender_honest = false,
                                                   .challenger_honest = true,
                                                   .reason = "referee recomputed step 2"});
  }
  for (const uint64_t closed_height : {uint64_t{0}, uint64_t{40}}) {
    TaskRecord r = t;
    r.closed_height = closed_height;
    Encoder re;
    EncodeTask(re, r);
    const Bytes enc = re.Take();
    EXPECT_GT(enc.size(), plain.size() + 16);
    Decoder d(enc, "task");
    TaskRecord back;
    ASSERT_TRUE(DecodeTask(d, &back).ok());
    ASSERT_TRUE(d.Finish().ok());
    EXPECT_EQ(back, r);
    for (size_t cut : {enc.size() - 1, plain.size() + 16 + 2}) {
      Decoder short_d(ByteSpan(enc).first(cut), "task");
      TaskRecord partial;
      EXPECT_FALSE(DecodeTask(short_d, &partial).ok() && short_d.Finish().ok()) << cut;
    }
  }
  Bytes empty_list = plain;  // a zero tail followed by a count of no rulings
  empty_list.resize(plain.size() + 16 + 4, 0);
  Decoder ed(empty_list, "task");
  TaskRecord eback;
  EXPECT_EQ(DecodeTask(ed, &eback).code(), StatusCode::kDataLoss);
  TaskRecord not_ruling = t;
  not_ruling.verification.rulings[0].tx = static_cast<uint16_t>(TxType::kDisputePost);
  Encoder ne;
  EncodeTask(ne, not_ruling);
  const Bytes nenc = ne.Take();
  Decoder nd(nenc, "task");
  TaskRecord nback;
  EXPECT_EQ(DecodeTask(nd, &nback).code(), StatusCode::kDataLoss);
  const nlohmann::json j = TaskToJson(t)["verification"]["rulings"];
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["tx"], "RefereeStep");
  EXPECT_EQ(j[1]["tx"], "RuleDispute");
  EXPECT_EQ(j[0]["for"], "challenger");
  EXPECT_EQ(j[0]["sender"], TestKey(1).public_key().ToHex());
  EXPECT_FALSE(j[0].contains("stage")) << "a task without stages";
}

// A witness encoding decodes back to `w` and refuses damage: cut short, trailing bytes, more
// than kMaxWitnessBytes.
template <typename W, typename Decode>
void ExpectWitnessRoundTripsAndRefusesDamage(const W& w, const Bytes& enc, Decode decode) {
  Result<W> back = decode(enc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, w);
  for (size_t cut : {size_t{0}, size_t{10}, enc.size() - 1}) {
    EXPECT_FALSE(decode(ByteSpan(enc).first(cut)).ok()) << cut;
  }
  Bytes longer = enc;
  longer.push_back(0);
  EXPECT_FALSE(decode(longer).ok());
  EXPECT_EQ(decode(Bytes(kMaxWitnessBytes + 1, 0)).status().code(), StatusCode::kInvalidArgument);
}

// A transaction carrying a witness past kMaxTxBytes goes through the binary and JSON forms.
void ExpectLargeTxRoundTrips(const TxPayload& payload) {
  Transaction tx = BuildSignedTx(TestKey(1), "c", 0, payload);
  const Bytes wire = EncodeTx(tx);
  EXPECT_GT(wire.size(), kMaxTxBytes);
  Result<Transaction> decoded = DecodeTx(wire);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, tx);
  Result<Transaction> from_json = TxFromJson(TxToJson(tx));
  ASSERT_TRUE(from_json.ok()) << from_json.status().ToString();
  EXPECT_EQ(*from_json, tx);
}

TEST(SegmentWitnessTest, EncodingRoundTripsAndRefusesDamage) {
  SegmentWitness w{
      .bundle = "[task]\n", .start_state = {9, 8, 7}, .state = {1.5f, -2.0f}, .examples = {}};
  w.examples.push_back(StepWitnessExample{
      .index = 7,
      .x = {0.25f, 0.5f},
      .y = 2,
      .proof = MerkleProof{.index = 7, .leaf_count = 9, .siblings = {Blake2b("a")}}});
  ExpectWitnessRoundTripsAndRefusesDamage(w, EncodeSegmentWitness(w), DecodeSegmentWitness);
  // A token task's: its pages after the examples (v2); a witness without pages keeps v1's bytes.
  SegmentWitness tokens = w;
  tokens.examples.clear();
  tokens.pages.push_back(TileWitnessPage{
      .page = 3,
      .tokens = {5, 6, 7},
      .proof = MerkleProof{.index = 3, .leaf_count = 4, .siblings = {Blake2b("p")}}});
  ExpectWitnessRoundTripsAndRefusesDamage(tokens, EncodeSegmentWitness(tokens),
                                          DecodeSegmentWitness);
  Bytes v2 = EncodeSegmentWitness(tokens);
  EXPECT_NE(std::string(v2.begin(), v2.end()).find("meshlearn.segment_witness.v2"),
            std::string::npos);
  Bytes v1 = EncodeSegmentWitness(w);
  EXPECT_NE(std::string(v1.begin(), v1.end()).find("meshlearn.segment_witness.v1"),
            std::string::npos);
  // A v2 witness with no pages is not canonical: refused.
  Encoder e;
  e.PutString("meshlearn.segment_witness.v2").PutString(w.bundle).PutBytes(w.start_state);
  e.PutU32(0).PutU32(0).PutU32(0);  // state, examples, pages: none
  Result<SegmentWitness> empty = DecodeSegmentWitness(e.Take());
  EXPECT_FALSE(empty.ok());
  // A step witness is not a segment witness.
  Result<SegmentWitness> other = DecodeSegmentWitness(EncodeStepWitness({}));
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("meshlearn.segment_witness.v1"), std::string::npos);
  SegmentWitness big = w;
  big.state.assign(100'000, 0.5f);
  ExpectLargeTxRoundTrips(ProveFraudTx{.task_id = Blake2b("t"),
                                       .index = 3,
                                       .segment = 1,
                                       .witness = {EncodeSegmentWitness(big)}});
}

TEST(StepWitnessTest, EncodingRoundTripsAndRefusesDamage) {
  StepWitness w{.bundle = "[task]\n", .state = {1.5f, -2.0f, 0.0f}, .examples = {}};
  w.examples.push_back(StepWitnessExample{
      .index = 7, .x = {0.25f, 0.5f}, .y = 2,
      .proof = MerkleProof{.index = 7, .leaf_count = 9, .siblings = {Blake2b("a"), Blake2b("b")}}});
  ExpectWitnessRoundTripsAndRefusesDamage(w, EncodeStepWitness(w), DecodeStepWitness);
  // As a transaction: a witness may go past kMaxTxBytes.
  StepWitness big = w;
  big.state.assign(100'000, 0.5f);
  ExpectLargeTxRoundTrips(RefereeStepTx{.task_id = Blake2b("t"), .index = 3,
                                        .witness = {EncodeStepWitness(big)}});
}

class ForcedErrorTest : public VerificationTest {
 protected:
  ForcedErrorTest() {
    genesis_.params.forced_error_per_million = 1'000'000;  // every unit is a forced error
    genesis_.params.verifiers_per_unit = 2;
  }
};

TEST_F(ForcedErrorTest, AForcedErrorCatchesTheRubberStamp) {
  Start(/*verifiers=*/2);
  const int u = UnitOf(s1_), other = UnitOf(s2_);
  // The solver knows its draw: it commits the forced form (true start, forced leaves).
  std::vector<Transaction> txs;
  for (int index : {u, other}) {
    const WorkUnit w = Unit(index);
    const KeyPair& solver = Key(w.assignee);
    const uint64_t i = Node(solver).secrets_committed + 1 + pending_secrets_[w.assignee];
    protocol::UnitId id{task_id_, w.round, w.shard};
    ASSERT_TRUE(protocol::IsForcedError(Secret(solver, i), w.assignment_beacon, id, 1'000'000));
    const std::vector<Hash256> forced = {TrueState(index, 0),
                                         protocol::ForcedLeaf(Secret(solver, i), id, 1),
                                         protocol::ForcedLeaf(Secret(solver, i), id, 2)};
    ASSERT_EQ(MerkleRoot(forced),
              protocol::ForcedCommitment(Secret(solver, i), id, TrueState(index, 0), 3));
    txs.push_back(CommitTx(index, forced));
  }
  pending_secrets_.clear();
  StepOk(txs);
  Step();
  const UnitCheck c = Check(u);
  ASSERT_EQ(c.verifiers().size(), 2u);
  const KeyPair& honest = Key(c.verifiers()[0]);
  const KeyPair& stamp = Key(c.verifiers()[1]);
  // The honest verifier's replay of segment 0 ends at the true state, not the forced leaf.
  const WorkUnit w = Unit(u);
  protocol::UnitId id{task_id_, w.round, w.shard};
  std::vector<Hash256> forced_leaves = {TrueState(u, 0),
                                        protocol::ForcedLeaf(Secret(s1_, w.secret_index), id, 1),
                                        protocol::ForcedLeaf(Secret(s1_, w.secret_index), id, 2)};
  Sealed catch_it{Verdict::kVerdictMismatch, Blake2b("h"), ClaimOf(forced_leaves, 0, TrueState(u, 2))};
  Sealed stamp_it = Clean();
  StepOk({SealTx(honest, u, catch_it), SealTx(stamp, u, stamp_it)});
  StepUntil(u, CheckStage::kCheckRevealVerdicts);
  const Amount honest_before = Balance(*owner_.at(honest.public_key()));
  StepOk({RevealTx(honest, u, catch_it), RevealTx(stamp, u, stamp_it), SecretTx(u)});
  StepUntilDone(u);
  StepUntil(other, CheckStage::kCheckRevealVerdicts);  // its verifiers stayed silent
  StepOk({SecretTx(other)});
  EXPECT_FALSE(HasCheck(u));  // settled as a forced error: the round re-runs
  EXPECT_GT(Balance(*owner_.at(honest.public_key())), honest_before);  // jackpot share
  EXPECT_GT(Node(honest).earnings.jackpot, 0u);
  EXPECT_EQ(Node(honest).earnings.jackpot_wins, 1u);
  EXPECT_EQ(Node(stamp).earnings.jackpot, 0u);
  EXPECT_GT(Node(stamp).earnings.slashed, 0u);
  ExpectEarningsAddUpToTheTask();
  EXPECT_EQ(Node(stamp).reputation.slashes, 1u);
  EXPECT_EQ(Node(honest).reputation.slashes, 0u);
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);  // the solver did what it was told
  EXPECT_TRUE(Rerunning());  // the unit is re-run
}

TEST_F(VerificationTest, AWhistleblowerCatchesALazySolverThatStaysSilent) {
  Start();
  const int lazy = UnitOf(s1_), honest = UnitOf(s2_);
  CommitAll({{lazy, true}, {honest, false}});
  Aggregate();
  Sealed stamp1 = Clean(), stamp2 = Clean();
  StepOk({SealTx(v1_, lazy, stamp1), SealTx(v1_, honest, stamp2)});
  StepUntil(lazy, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, lazy, stamp1), RevealTx(v1_, honest, stamp2), SecretTx(lazy),
          SecretTx(honest)});
  StepUntilDone(lazy);
  ASSERT_EQ(Check(lazy).result(), CheckResult::kCheckClean);
  ASSERT_NE(Machine().phase(), RoundPhase::kRoundPhaseFinal);  // the window is still open
  // A challenge by a node without the role, or of the honest unit's wrong claim, is refused.
  MismatchClaimField claim = ClaimOf(Leaves(lazy, true), 0, TrueState(lazy, 2));
  std::vector<Receipt> r = Step({N(v1_, ChallengeUnitTx{.task_id = task_id_, .index = static_cast<uint32_t>(lazy),
                                                         .node_id = v1_.public_key(), .claim = claim})});
  EXPECT_EQ(r[0].code, StatusCode::kPermissionDenied) << r[0].reason;
  const Amount wb_before = Balance(erin_);
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_, .index = static_cast<uint32_t>(lazy),
                                 .node_id = wb_.public_key(), .claim = claim})});
  EXPECT_EQ(Check(lazy).stage(), CheckStage::kCheckDisputed);
  // The lazy solver cannot defend its states and stays silent. It loses alone: its silence shows
  // nothing about its work, so the rubber stamp is slashed only when a ruling shows the work
  // wrong (UnitCheckTest.WhistleblowerChallengesACleanVerdict; here the ledger would rule from a
  // step witness, which this fixture's made-up states have none of).
  // Nobody can show the merits of that claim (FraudProofTest's
  // ALazySolverFallingSilentInAWhistleblowersDisputeLosesItsStampOnTheMerits can): the merits
  // window closes into a loss by silence alone.
  PlayDispute(lazy, nullptr, [&](uint64_t s) { return TrueState(lazy, s); });
  ASSERT_TRUE(HasCheck(lazy));
  ASSERT_TRUE(Check(lazy).awaits_merits()) << Check(lazy).reason();
  StepUntilDone(lazy);
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(v1_).reputation.slashes, 0u);
  EXPECT_EQ(Node(wb_).reputation.slashes, 0u);
  EXPECT_GT(Balance(erin_), wb_before);  // rewarded from the jackpot
  EXPECT_EQ(Node(wb_).earnings.jackpot, Balance(erin_) - wb_before);
  ExpectEarningsAddUpToTheTask();
  EXPECT_TRUE(Rerunning());
}

// Chaos seed 561: a whistleblower challenges honest work settled clean with a made-up replay,
// and the solver (crashed, or in league with it) never answers. The solver loses by the rules,
// but its silence shows nothing about its work: the verifier that called it clean keeps its
// stake.
TEST_F(VerificationTest, ASolverSilentInAWhistleblowersDisputeCostsItsVerifierNothing) {
  Start();
  const int a = UnitOf(s1_), b = UnitOf(s2_);
  SettleBothClean(a, b);
  ASSERT_EQ(Check(a).result(), CheckResult::kCheckClean);
  MismatchClaimField lie = ClaimOf(Leaves(a, false), 0, Blake2b("a replay that never happened"));
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_, .index = static_cast<uint32_t>(a),
                                 .node_id = wb_.public_key(), .claim = lie})});
  ASSERT_EQ(Check(a).stage(), CheckStage::kCheckDisputed);
  StepUntilDone(a);  // nobody posts: the solver misses its turn
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(v1_).reputation.slashes, 0u);
  EXPECT_EQ(Node(v1_).earnings.slashed, 0u);
  ExpectEarningsAddUpToTheTask();
}

// A whistleblower that wins by the solver's silence alone is paid only what the solver's slash
// put into the jackpot, not a whole slash from a pool other slashes filled: else a solver and a
// whistleblower in league would move jackpot money to the whistleblower at the cost of the
// solver's slash (docs/verification.md, "Whistleblowers' incentives").
TEST_F(VerificationTest, AWinBySilenceAlonePaysOnlyWhatTheSolversSlashPutInTheJackpot) {
  Start();
  const int a = UnitOf(s1_), b = UnitOf(s2_);
  CommitAll({{a, false}, {b, false}});
  Aggregate();
  // v1 approves a and claims a made-up mismatch in b, then abandons that dispute: its slash
  // fills the jackpot.
  Sealed ok = Clean();
  Sealed lie = Mismatch(b, 0, /*solver_lazy=*/false, Blake2b("made up"));
  StepOk({SealTx(v1_, a, ok), SealTx(v1_, b, lie)});
  StepUntil(a, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, a, ok), RevealTx(v1_, b, lie), SecretTx(a), SecretTx(b)});
  StepUntil(b, CheckStage::kCheckDisputed);
  PlayDispute(
      b, [&](uint64_t s) { return TrueState(b, s); }, nullptr);
  StepUntilDone(b);
  ASSERT_EQ(Node(v1_).reputation.slashes, 1u);
  ASSERT_EQ(Check(a).result(), CheckResult::kCheckClean);
  // A whistleblower (in league with s1, say) challenges a with a made-up replay; s1 never
  // answers, and nobody can show the merits of the claim.
  const Amount erin_before = Balance(erin_);
  MismatchClaimField made_up = ClaimOf(Leaves(a, false), 1, Blake2b("a replay that never was"));
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = static_cast<uint32_t>(a),
                                 .node_id = wb_.public_key(),
                                 .claim = made_up})});
  PlayDispute(a, nullptr, [&](uint64_t s) { return Hasher("wb").UpdateU64(s).Finish(); });
  ASSERT_TRUE(HasCheck(a));
  ASSERT_TRUE(Check(a).awaits_merits()) << Check(a).reason();
  StepUntilDone(a);
  EXPECT_TRUE(Rerunning());  // fraud: the round runs again
  EXPECT_EQ(Node(s1_).reputation.slashes, 1u);
  const Amount slashed = Node(s1_).earnings.slashed;
  ASSERT_GT(slashed, 0u);
  EXPECT_EQ(Node(v1_).reputation.slashes, 1u);  // not again: nothing was shown about a
  const Amount share = BasisPoints(slashed, genesis_.params.slash_jackpot_bps);
  EXPECT_LT(share, slashed);
  EXPECT_EQ(Node(wb_).earnings.jackpot, share);
  EXPECT_EQ(Balance(erin_) - erin_before, share);
  ExpectEarningsAddUpToTheTask();
}

// A verifier that wins a dispute against the solver is rewarded from the jackpot, which every
// slash fills. Until 2026-12-06 the reward was one whole slash whatever the solver's slash took: a
// solver whose stake was spent lost the dispute to a verifier in league with it, and the pair took
// out of the jackpot what a rubber stamp's slash had put in. The reward is now what this event's
// slash of the solver took, as a whistleblower's bounty is: the ledger never pays a win more than
// the loser's slash brought in. Here the solver's stake is spent by the slash of its other unit,
// ruled in the same block (until 2026-12-06 this test spent it by unstaking and withdrawing after
// the assignment, which the stake hold now refuses: StakeHoldTest).
class CappedRewardTest : public VerificationTest {
 protected:
  CappedRewardTest() { genesis_.params.verifiers_per_unit = 2; }
};

TEST_F(CappedRewardTest, AVerifiersDisputeWinIsNeverMoreThanTheSolversSlashTook) {
  // s1 solves both units alone (no s2), staked for one slash and `left` more: a solver is given a
  // unit while its stake covers that unit's slash, whatever else it holds.
  const Amount slash = kSlashMultiple * kTestUnitCost;
  const Amount left = genesis_.params.min_stake_solver;
  ASSERT_LT(left, slash);
  RegisterNodeTx s1 = Reg(s1_, kRoleSolver);
  s1.stake = slash + left;
  StepOk({N(s1_, s1), N(agg_, Reg(agg_, kRoleAggregator)), N(v1_, Reg(v1_, kRoleVerifier)),
          N(v2_, Reg(v2_, kRoleVerifier))});
  StepOk({SubmitTask()});
  std::vector<uint32_t> units;
  for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) {
    if (u.assignee == s1_.public_key() && u.status == WorkUnitStatus::kAssigned) {
      units.push_back(u.index);
    }
  }
  ASSERT_EQ(units.size(), 2u);
  CommitAll({{units[0], true}, {units[1], true}});
  Aggregate();
  // v1 catches both lazy units, v2 stamps both clean.
  std::vector<Sealed> caught, stamp;
  std::vector<Transaction> txs;
  for (uint32_t u : units) {
    ASSERT_EQ(Check(u).verifiers().size(), 2u);
    caught.push_back(Mismatch(u, 0, /*solver_lazy=*/true, TrueState(u, 2)));
    stamp.push_back(Clean());
    txs.push_back(SealTx(v1_, u, caught.back()));
    txs.push_back(SealTx(v2_, u, stamp.back()));
  }
  StepOk(txs);
  StepUntil(units[0], CheckStage::kCheckRevealVerdicts);
  txs.clear();
  for (size_t i = 0; i < units.size(); ++i) {
    txs.push_back(RevealTx(v1_, units[i], caught[i]));
    txs.push_back(RevealTx(v2_, units[i], stamp[i]));
    txs.push_back(SecretTx(units[i]));
  }
  StepOk(txs);
  StepUntil(units[0], CheckStage::kCheckDisputed);
  ASSERT_EQ(Check(units[1]).stage(), CheckStage::kCheckDisputed);
  const Totals before = chain_->GetTotals();
  const Amount carol_before = Balance(carol_);
  // s1 is silent in both games, ruled in one block: the first unit's slash takes a whole slash,
  // the second's what is left.
  PlayDisputes(units, nullptr, [](uint32_t u, uint64_t s) { return TrueState(u, s); });
  ASSERT_TRUE(Rerunning());
  EXPECT_EQ(Node(s1_).earnings.slashed, slash + left);  // all it had
  EXPECT_EQ(Node(v2_).earnings.slashed, 2 * slash);     // the stamps: whole slashes, into the pools
  // v1's wins: a whole slash for the first unit; for the second what the solver's slash took,
  // `left`, not a slash, though the jackpot held more (the stamps' slashes).
  const uint32_t bps = genesis_.params.slash_jackpot_bps;
  const Amount pool_at_second_win =
      before.jackpot + BasisPoints(slash, bps) * 3 + BasisPoints(left, bps) - slash;
  EXPECT_GT(pool_at_second_win, left);
  EXPECT_EQ(Node(v1_).earnings.jackpot, slash + left);
  EXPECT_EQ(Task().verification.jackpot_paid, slash + left);
  EXPECT_GE(Balance(carol_), carol_before + slash + left);  // and its replays' pay, net of the cut
  const Totals after = chain_->GetTotals();
  EXPECT_TRUE(after.Check().ok());
  EXPECT_EQ(after.minted, before.minted);
  ExpectEarningsAddUpToTheTask();
}

// A verifier of the solver's owner is never drawn to check it (LinkedToCheater: one operator on
// both sides approves its own work without a replay). Here v1 is alice's, as s1 is: with full
// assurance s1's unit waits for an unlinked verifier rather than take v1 (which checks s2's
// unit), and the next beacon after dave's v2 registers draws v2.
TEST_F(VerificationTest, AVerifierOfTheSolversOwnerIsNeverDrawnToCheckIt) {
  owner_[v1_.public_key()] = &alice_;
  assurance_ = 1;
  Start(/*verifiers=*/1);
  const int mine = UnitOf(s1_), other = UnitOf(s2_);
  ASSERT_GE(mine, 0);
  ASSERT_GE(other, 0);
  ASSERT_EQ(Node(v1_).owner, Node(s1_).owner);
  CommitAll({{mine, false}, {other, false}});
  Step();  // the beacon
  EXPECT_EQ(Check(other).verifiers(), std::vector<protocol::NodeId>{v1_.public_key()});
  EXPECT_EQ(Check(mine).stage(), CheckStage::kCheckAwaitingBeacon);
  EXPECT_TRUE(Check(mine).verifiers().empty());
  StepOk({N(v2_, Reg(v2_, kRoleVerifier))});
  Step();
  ASSERT_EQ(Check(mine).stage(), CheckStage::kCheckCommitVerdicts);
  EXPECT_EQ(Check(mine).verifiers(), std::vector<protocol::NodeId>{v2_.public_key()});
}

// Economic assurance: where the only verifier is linked to the solver, the unit settles
// unchecked, as on a chain with no verifier.
TEST_F(VerificationTest, EconomicAssuranceWithOnlyTheSolversOwnVerifierSettlesUnchecked) {
  owner_[v1_.public_key()] = &alice_;
  Start(/*verifiers=*/1);
  const int mine = UnitOf(s1_), other = UnitOf(s2_);
  CommitAll({{mine, false}, {other, false}});
  Step();  // the beacon
  EXPECT_TRUE(Check(mine).verifiers().empty());
  EXPECT_EQ(Check(other).verifiers(), std::vector<protocol::NodeId>{v1_.public_key()});
}

// A solver's stake stays slashable until its checks are over: s1 commits a lazy unit and leaves
// (LeaveNode: all its stake unbonds), and its owner's Withdraw of the matured entry is refused
// while the unit is under check, naming the unit and a height to retry. The dispute rules fraud:
// the slash takes the unbonding entry (TakeBondedStake). Once the check is gone (the round
// re-runs without s1), the rest is withdrawn. Every token stays accounted for.
class StakeHoldTest : public VerificationTest {
 protected:
  StakeHoldTest() {
    genesis_.params.unbonding_delay_blocks = 1;  // matured the next block
    genesis_.params.audit_window_blocks = 1;
  }
  std::vector<Unbonding> UnbondingOf(const KeyPair& k) {
    return chain_->GetAccount(k.public_key())->unbonding;
  }
  // v1 reveals its clean verdicts `a` and `b` on units u1 and u2 (sealed already), both checks
  // settle clean; alice's Withdraw is refused while round 0 is not final (a whistleblower may
  // still challenge) and pays out `part` once the task is finished.
  void RevealCleanThenWithdrawOnceFinal(int u1, int u2, const Sealed& a, const Sealed& b,
                                        Amount part) {
    StepUntil(u1, CheckStage::kCheckRevealVerdicts);
    StepOk({RevealTx(v1_, u1, a), RevealTx(v1_, u2, b), SecretTx(u1), SecretTx(u2)});
    StepUntilDone(u1);
    StepUntilDone(u2);
    for (int u : {u1, u2}) ASSERT_EQ(Check(u).result(), CheckResult::kCheckClean) << u;
    ASSERT_TRUE(Machine().Unfinal(0));
    std::vector<Receipt> r = Step({Q(alice_, WithdrawTx{})});
    ASSERT_FALSE(r[0].ok) << "withdrawn while a whistleblower may still challenge the unit";
    EXPECT_NE(r[0].reason.find("whistleblower"), std::string::npos) << r[0].reason;
    FinishTask();
    const Amount before = Balance(alice_);
    StepOk({Q(alice_, WithdrawTx{})});
    EXPECT_EQ(Balance(alice_), before + part);
  }
};

TEST_F(StakeHoldTest, ASolverThatLeavesCannotWithdrawUntilItsCheckIsOverAndIsSlashedByIt) {
  Start();
  const int lazy = UnitOf(s1_), honest = UnitOf(s2_);
  ASSERT_GE(lazy, 0);
  ASSERT_GE(honest, 0);
  const Totals start = chain_->GetTotals();
  CommitAll({{lazy, true}, {honest, false}});
  StepOk({N(s1_, LeaveNodeTx{.node_id = s1_.public_key()})});  // and the beacon
  ASSERT_EQ(Node(s1_).stake, 0u);
  ASSERT_EQ(UnbondingOf(alice_).size(), 1u);
  const uint64_t matured = UnbondingOf(alice_)[0].release_height;
  const Amount alice_before = Balance(alice_);
  // v1 catches the lazy unit; s1 (gone, but still its unit's defender) loses the dispute. In
  // the verdicts' block the entry has matured, and alice's Withdraw is refused.
  Sealed caught = Mismatch(lazy, 0, /*solver_lazy=*/true, TrueState(lazy, 2));
  Sealed ok = Clean();
  std::vector<Receipt> r =
      Step({SealTx(v1_, lazy, caught), SealTx(v1_, honest, ok), Q(alice_, WithdrawTx{})});
  ASSERT_TRUE(r[0].ok && r[1].ok) << r[0].reason << r[1].reason;
  ASSERT_LE(matured, chain_->Height());
  EXPECT_FALSE(r[2].ok);
  EXPECT_EQ(r[2].code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r[2].reason.find("unit " + std::to_string(lazy) + " of task"), std::string::npos)
      << r[2].reason;
  EXPECT_NE(r[2].reason.find("retry at height"), std::string::npos) << r[2].reason;
  EXPECT_EQ(UnbondingOf(alice_).size(), 1u);
  StepUntil(lazy, CheckStage::kCheckRevealVerdicts);
  StepOk(
      {RevealTx(v1_, lazy, caught), RevealTx(v1_, honest, ok), SecretTx(lazy), SecretTx(honest)});
  StepUntil(lazy, CheckStage::kCheckDisputed);
  r = Step({Q(alice_, WithdrawTx{})});
  EXPECT_FALSE(r[0].ok) << "withdrawn while its unit is disputed";
  EXPECT_NE(r[0].reason.find("disputed"), std::string::npos) << r[0].reason;
  PlayDispute(lazy, nullptr, [&](uint64_t s) { return TrueState(lazy, s); });
  ASSERT_TRUE(Rerunning());
  const Amount slash = kSlashMultiple * kTestUnitCost;
  EXPECT_EQ(Node(s1_).earnings.slashed, slash);  // a whole slash, from the unbonding entry
  ASSERT_EQ(UnbondingOf(alice_).size(), 1u);
  EXPECT_EQ(UnbondingOf(alice_)[0].amount, kStake - slash);
  // The check went with the round's re-run: nothing holds the rest.
  StepOk({Q(alice_, WithdrawTx{})});
  EXPECT_EQ(Balance(alice_), alice_before + kStake - slash);
  EXPECT_TRUE(UnbondingOf(alice_).empty());
  const Totals end = chain_->GetTotals();
  EXPECT_TRUE(end.Check().ok()) << end.Check().ToString();
  EXPECT_EQ(end.minted, start.minted);
}

// An Unstake's entry is held the same way, and past the check's settlement: while the round is
// not final a whistleblower may still challenge the unit (ChallengeUnit), and a slash then must
// reach the entry. Once the round is final (here the task finishes), the entry is released.
TEST_F(StakeHoldTest, AnUnstakedEntryIsHeldUntilItsUnitsRoundIsFinal) {
  Start();
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  CommitAll({{u1, false}, {u2, false}});
  Aggregate();  // and the beacon
  const Amount part = kStake - genesis_.params.min_stake_solver;
  Sealed a = Clean(), b = Clean();
  StepOk({N(s1_, UnstakeTx{.node_id = s1_.public_key(), .amount = part}), SealTx(v1_, u1, a),
          SealTx(v1_, u2, b)});
  std::vector<Receipt> r = Step({Q(alice_, WithdrawTx{})});  // matured
  ASSERT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("unit " + std::to_string(u1)), std::string::npos) << r[0].reason;
  ASSERT_NO_FATAL_FAILURE(RevealCleanThenWithdrawOnceFinal(u1, u2, a, b, part));
  EXPECT_TRUE(chain_->GetTotals().Check().ok());
}

// An entry unbonded after a unit was assigned is held from the assignment on, before the unit is
// committed (where its deadline is longer than the unbonding delay: here one block against four)
// and after (the entry matured before the commit): the unit was assigned against that stake, and
// its slash must still reach it. Once the check has settled and the round is final, it is released.
TEST_F(StakeHoldTest, AnEntryUnstakedAfterTheAssignmentIsHeldUntilTheUnitsCheckIsOver) {
  Start();
  const int u1 = UnitOf(s1_), u2 = UnitOf(s2_);
  ASSERT_GE(u1, 0);
  ASSERT_GE(u2, 0);
  const Totals start = chain_->GetTotals();
  const Amount part = kStake - genesis_.params.min_stake_solver;
  StepOk({N(s1_, UnstakeTx{.node_id = s1_.public_key(), .amount = part})});
  std::vector<Receipt> r = Step({Q(alice_, WithdrawTx{})});
  ASSERT_EQ(UnbondingOf(alice_).size(), 1u);
  ASSERT_LE(UnbondingOf(alice_)[0].release_height, chain_->Height());  // matured
  ASSERT_EQ(Unit(u1).status, WorkUnitStatus::kAssigned);               // not committed yet
  EXPECT_FALSE(r[0].ok) << "withdrawn before the unit it was assigned against is committed";
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r[0].reason.find("was assigned unit " + std::to_string(u1) + " of task"),
            std::string::npos)
      << r[0].reason;
  EXPECT_NE(r[0].reason.find("retry at height"), std::string::npos) << r[0].reason;
  CommitAll({{u1, false}, {u2, false}});
  Aggregate();  // and the beacon
  Sealed a = Clean(), b = Clean();
  r = Step({SealTx(v1_, u1, a), SealTx(v1_, u2, b), Q(alice_, WithdrawTx{})});
  ASSERT_TRUE(r[0].ok && r[1].ok) << r[0].reason << r[1].reason;
  EXPECT_FALSE(r[2].ok) << "withdrawn while the unit is checked";
  EXPECT_NE(r[2].reason.find("solved unit " + std::to_string(u1) + " of task"), std::string::npos)
      << r[2].reason;
  ASSERT_NO_FATAL_FAILURE(RevealCleanThenWithdrawOnceFinal(u1, u2, a, b, part));
  EXPECT_TRUE(UnbondingOf(alice_).empty());
  const Totals end = chain_->GetTotals();
  EXPECT_TRUE(end.Check().ok()) << end.Check().ToString();
  EXPECT_EQ(end.minted, start.minted);
}

// A verifier's stake stays slashable while a check it was drawn to can still slash it (a rubber
// stamp, or a false mismatch, is slashed when a dispute, a whistleblower or ProveMerits proves it,
// until the round is final). v2, drawn to check s1's lazy unit with v1, unstakes down to its
// role's minimum; the matured entry is refused, naming the unit; v2 stamps the unit clean, v1
// catches it, and the ruling slashes v2 a whole slash, which reaches the entry. Once the check is
// gone (the round re-runs), the rest is withdrawn. Every token stays accounted for.
class VerifierStakeHoldTest : public StakeHoldTest {
 protected:
  VerifierStakeHoldTest() { genesis_.params.verifiers_per_unit = 2; }
};

TEST_F(VerifierStakeHoldTest, ADrawnVerifierCannotWithdrawUntilTheCheckIsOverAndIsSlashedByIt) {
  Start(/*verifiers=*/2);
  const int lazy = UnitOf(s1_), honest = UnitOf(s2_);
  ASSERT_GE(lazy, 0);
  ASSERT_GE(honest, 0);
  const Totals start = chain_->GetTotals();
  CommitAll({{lazy, true}, {honest, false}});
  Aggregate();  // and the beacon: both verifiers drawn to both units
  ASSERT_EQ(Check(lazy).verifiers().size(), 2u);
  const Amount part = kStake - genesis_.params.min_stake_verifier;
  StepOk({N(v2_, UnstakeTx{.node_id = v2_.public_key(), .amount = part})});
  ASSERT_EQ(UnbondingOf(dave_).size(), 1u);
  const uint64_t matured = UnbondingOf(dave_)[0].release_height;
  Sealed caught = Mismatch(lazy, 0, /*solver_lazy=*/true, TrueState(lazy, 2));
  Sealed stamp = Clean(), ok1 = Clean(), ok2 = Clean();
  std::vector<Receipt> r =
      Step({SealTx(v1_, lazy, caught), SealTx(v2_, lazy, stamp), SealTx(v1_, honest, ok1),
            SealTx(v2_, honest, ok2), Q(dave_, WithdrawTx{})});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r[i].ok) << r[i].reason;
  ASSERT_LE(matured, chain_->Height());
  EXPECT_FALSE(r[4].ok) << "a drawn verifier's unbonding stake withdrawn while it is checking";
  EXPECT_EQ(r[4].code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r[4].reason.find("was drawn to verify unit "), std::string::npos) << r[4].reason;
  EXPECT_NE(r[4].reason.find("retry at height"), std::string::npos) << r[4].reason;
  EXPECT_EQ(UnbondingOf(dave_).size(), 1u);
  StepUntil(lazy, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, lazy, caught), RevealTx(v2_, lazy, stamp), RevealTx(v1_, honest, ok1),
          RevealTx(v2_, honest, ok2), SecretTx(lazy), SecretTx(honest)});
  StepUntil(lazy, CheckStage::kCheckDisputed);
  r = Step({Q(dave_, WithdrawTx{})});
  EXPECT_FALSE(r[0].ok) << "withdrawn while the unit it stamped is disputed";
  PlayDispute(lazy, nullptr, [&](uint64_t s) { return TrueState(lazy, s); });
  ASSERT_TRUE(Rerunning());
  const Amount slash = kSlashMultiple * kTestUnitCost;
  ASSERT_GT(slash, genesis_.params.min_stake_verifier);  // more than the stake left bonded
  EXPECT_EQ(Node(v2_).earnings.slashed, slash);  // a whole slash, from the unbonding entry too
  EXPECT_EQ(Node(v2_).stake + UnbondingOf(dave_)[0].amount, kStake - slash);
  // The check went with the round's re-run: nothing holds the rest.
  const Amount dave_before = Balance(dave_), rest = UnbondingOf(dave_)[0].amount;
  StepOk({Q(dave_, WithdrawTx{})});
  EXPECT_EQ(Balance(dave_), dave_before + rest);
  EXPECT_TRUE(UnbondingOf(dave_).empty());
  const Totals end = chain_->GetTotals();
  EXPECT_TRUE(end.Check().ok()) << end.Check().ToString();
  EXPECT_EQ(end.minted, start.minted);
}

// A whistleblower's stake is its challenge's bond (ChallengeUnit): losing the dispute, by a ruling
// or by missing its turn, slashes it (UnitCheck), and the slash takes its unbonding entries too.
// So the entries that matured after the challenge are held while the dispute runs. Here wb
// challenges a clean unit with a made-up replay and unstakes down to its role's minimum in the
// same block; erin's Withdraw gets the entry of her other node (one pass over the state for both
// nodes) and keeps wb's, then is refused naming the unit. The solver answers, wb falls silent and
// is slashed a whole slash, which reaches the entry. The dispute over, the rest is withdrawn,
// though the round is not final yet: nothing of the challenge can slash wb any more.
TEST_F(StakeHoldTest, AWhistleblowerCannotWithdrawWhileItsChallengeRunsAndIsSlashedWhenItLoses) {
  const KeyPair other = TestKey(28);
  owner_[other.public_key()] = &erin_;  // a second node of the whistleblower's owner
  Start();
  StepOk({N(other, Reg(other, kRoleWhistleblower))});
  const int a = UnitOf(s1_), b = UnitOf(s2_);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  const uint32_t ua = static_cast<uint32_t>(a);
  const Totals start = chain_->GetTotals();
  SettleBothClean(a, b);
  ASSERT_EQ(Check(a).result(), CheckResult::kCheckClean);
  const Amount part = kStake - genesis_.params.min_stake_whistleblower;
  StepOk({N(other, UnstakeTx{.node_id = other.public_key(), .amount = part})});
  const MismatchClaimField lie =
      ClaimOf(Leaves(a, false), 0, Blake2b("a replay that never happened"));
  StepOk({N(wb_,
            ChallengeUnitTx{
                .task_id = task_id_, .index = ua, .node_id = wb_.public_key(), .claim = lie}),
          N(wb_, UnstakeTx{.node_id = wb_.public_key(), .amount = part})});
  ASSERT_EQ(Check(a).stage(), CheckStage::kCheckDisputed);
  // Both entries matured: the other node's is released, wb's stays.
  const Amount erin_before = Balance(erin_);
  StepOk({Q(erin_, WithdrawTx{})});
  EXPECT_EQ(Balance(erin_), erin_before + part);
  ASSERT_EQ(UnbondingOf(erin_).size(), 1u) << "withdrawn while its challenge runs";
  ASSERT_EQ(UnbondingOf(erin_)[0].node_id, wb_.public_key());
  ASSERT_LE(UnbondingOf(erin_)[0].release_height, chain_->Height());
  // The solver answers its first turn; erin's Withdraw, with only wb's entry left, is refused.
  const protocol::DisputeGame game = *Check(a).dispute();
  ASSERT_EQ(game.config().challenger, wb_.public_key());
  const uint64_t pos = game.query().position;
  std::vector<Receipt> r = Step({N(s1_, DisputePostTx{.task_id = task_id_,
                                                      .index = ua,
                                                      .node_id = s1_.public_key(),
                                                      .position = pos,
                                                      .hash = TrueState(a, pos)}),
                                 Q(erin_, WithdrawTx{})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  EXPECT_FALSE(r[1].ok) << "withdrawn while its challenge runs";
  EXPECT_EQ(r[1].code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r[1].reason.find("challenged unit " + std::to_string(a) + " of task"),
            std::string::npos)
      << r[1].reason;
  EXPECT_NE(r[1].reason.find("retry at height"), std::string::npos) << r[1].reason;
  // wb misses its turn: it loses, slashed a whole slash, reaching the entry.
  StepUntilDone(ua);
  ASSERT_EQ(Check(a).stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(Check(a).result(), CheckResult::kCheckClean);
  const Amount slash = kSlashMultiple * kTestUnitCost;
  ASSERT_GT(slash, genesis_.params.min_stake_whistleblower);  // more than it left bonded
  EXPECT_EQ(Node(wb_).reputation.slashes, 1u);
  EXPECT_EQ(Node(wb_).earnings.slashed, slash);
  ASSERT_EQ(UnbondingOf(erin_).size(), 1u);
  EXPECT_EQ(Node(wb_).stake + UnbondingOf(erin_)[0].amount, kStake - slash);
  ASSERT_TRUE(Machine().Unfinal(0));
  const Amount before = Balance(erin_), rest = UnbondingOf(erin_)[0].amount;
  StepOk({Q(erin_, WithdrawTx{})});
  EXPECT_EQ(Balance(erin_), before + rest);
  EXPECT_TRUE(UnbondingOf(erin_).empty());
  const Totals end = chain_->GetTotals();
  EXPECT_TRUE(end.Check().ok()) << end.Check().ToString();
  EXPECT_EQ(end.minted, start.minted);
}

TEST_F(VerificationTest, ASolverThatNeverRevealsLosesTheUnitWithoutASlash) {
  Start();
  const int silent = UnitOf(s1_), honest = UnitOf(s2_);
  CommitAll({{silent, false}, {honest, false}});
  Step();
  Sealed a = Clean(), b = Clean();
  StepOk({SealTx(v1_, silent, a), SealTx(v1_, honest, b)});
  StepUntil(silent, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, silent, a), RevealTx(v1_, honest, b), SecretTx(honest)});  // s1 crashed
  for (int i = 0; i < 6 && HasCheck(silent); ++i) Step();
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);
  EXPECT_EQ(Node(s1_).stake, kStake);
  EXPECT_GE(Node(s1_).reputation.failures, 1u);
  // Only the abandoned unit re-runs; the honest unit keeps its commit and its clean check.
  EXPECT_FALSE(HasCheck(silent));
  EXPECT_NE(Unit(silent).status, WorkUnitStatus::kCommitted);
  EXPECT_EQ(Unit(honest).status, WorkUnitStatus::kCommitted);
  ASSERT_TRUE(HasCheck(honest));
  EXPECT_EQ(Check(honest).result(), CheckResult::kCheckClean);
  EXPECT_EQ(Machine().CommittedUnits().size(), 1u);
  EXPECT_EQ(Task().verification.abandoned, 1u);
  if (Unit(silent).status == WorkUnitStatus::kPending) Steps(1);
  EXPECT_EQ(Unit(silent).assignee, s2_.public_key());  // re-run without it
  CommitAll({{silent, false}});
  Step();
  Sealed c = Clean();
  StepOk({SealTx(v1_, silent, c)});
  StepUntil(silent, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, silent, c), SecretTx(silent)});
  StepUntilDone(silent);
  EXPECT_EQ(Check(silent).result(), CheckResult::kCheckClean);
  EXPECT_EQ(Check(honest).result(), CheckResult::kCheckClean);  // never re-run
  EXPECT_EQ(Node(s2_).secrets_committed, 2u);  // one commit per unit
  EXPECT_EQ(Machine().CommittedUnits().size(), 2u);
}

TEST_F(VerificationTest, BadVerificationTransactionsAreRefused) {
  // Bad transactions share blocks with good ones: each fails alone and changes nothing.
  Start();
  const int u = UnitOf(s1_), other = UnitOf(s2_);
  const uint32_t ui = static_cast<uint32_t>(u);
  auto verdict_commit = [&](const KeyPair& signer, const KeyPair& node, uint32_t index) {
    return Q(signer, CommitVerdictTx{.task_id = task_id_, .index = index,
                                     .node_id = node.public_key(), .commitment = Blake2b("x")});
  };
  // A commit must carry the node's next secret index; before its commit a unit has no check.
  CommitUnitTx bad = std::get<CommitUnitTx>(CommitTx(u, Leaves(u, false)).payload);
  pending_secrets_.clear();
  queued_.clear();
  bad.secret_index = 5;
  // ... and its leaves, all of them, under the commitment.
  CommitUnitTx no_leaves = std::get<CommitUnitTx>(CommitTx(u, Leaves(u, false)).payload);
  pending_secrets_.clear();
  queued_.clear();
  CommitUnitTx other_leaves = no_leaves;
  no_leaves.leaves.clear();
  other_leaves.leaves = Leaves(u, true);
  std::vector<Receipt> r = Step({N(s1_, bad), N(s1_, no_leaves), N(s1_, other_leaves),
                                 verdict_commit(carol_, v1_, ui)});
  EXPECT_EQ(r[0].code, StatusCode::kInvalidArgument) << r[0].reason;
  EXPECT_EQ(r[1].code, StatusCode::kInvalidArgument) << r[1].reason;
  EXPECT_EQ(r[2].code, StatusCode::kInvalidArgument) << r[2].reason;
  EXPECT_EQ(r[3].code, StatusCode::kFailedPrecondition) << r[3].reason;
  CommitAll({{u, false}, {other, false}});
  // The commit's own block: no beacon yet, so no verdict; the secret only in the reveal window.
  r = Step({verdict_commit(carol_, v1_, ui), SecretTx(u)});
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition) << r[0].reason;
  EXPECT_EQ(r[1].code, StatusCode::kFailedPrecondition) << r[1].reason;
  ASSERT_EQ(Check(u).stage(), CheckStage::kCheckCommitVerdicts);
  // Commit window: only a drawn verifier, signed by itself or its owner, in range, once.
  Sealed early = Clean(), later = Clean();
  r = Step({verdict_commit(dave_, v2_, ui),    // v2 is not registered
            verdict_commit(bob_, s2_, ui),     // not a drawn verifier
            verdict_commit(gina_, v1_, ui),    // someone else's node
            verdict_commit(carol_, v1_, 99),   // out of range
            SealTx(v1_, u, early), SealTx(v1_, other, later), SealTx(v1_, u, early)});
  EXPECT_EQ(r[0].code, StatusCode::kNotFound) << r[0].reason;
  EXPECT_EQ(r[1].code, StatusCode::kPermissionDenied) << r[1].reason;
  EXPECT_EQ(r[2].code, StatusCode::kPermissionDenied) << r[2].reason;
  EXPECT_EQ(r[3].code, StatusCode::kInvalidArgument) << r[3].reason;
  EXPECT_TRUE(r[4].ok) << r[4].reason;
  EXPECT_TRUE(r[5].ok) << r[5].reason;
  EXPECT_EQ(r[6].code, StatusCode::kAlreadyExists) << r[6].reason;
  // Every drawn verifier committed: the commit window closed with that block.
  r = Step({SealTx(v1_, u, early)});
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition) << r[0].reason;
  StepUntil(u, CheckStage::kCheckRevealVerdicts);
  // Reveal window: an unknown verdict, a wrong salt, a secret from the wrong node or chain
  // element, a dispute move without a dispute, a ruling without one, a challenge of a unit that
  // has not settled; then the honest reveals, in the same block.
  Sealed wrong_salt = early;
  wrong_salt.salt = Blake2b("other salt");
  RevealVerdictTx unknown = std::get<RevealVerdictTx>(RevealTx(v1_, u, early).payload);
  queued_.clear();
  unknown.verdict = 7;
  r = Step({Q(carol_, unknown), RevealTx(v1_, u, wrong_salt),
            N(s2_, RevealSecretTx{.task_id = task_id_, .index = ui, .node_id = s2_.public_key(),
                                  .secret = Secret(s2_, 1)}),
            N(s1_, RevealSecretTx{.task_id = task_id_, .index = ui, .node_id = s1_.public_key(),
                                  .secret = Secret(s1_, 2)}),
            N(s1_, DisputePostTx{.task_id = task_id_, .index = ui, .node_id = s1_.public_key(),
                                 .position = 1, .hash = Blake2b("h")}),
            Q(referee_, RuleDisputeTx{.task_id = task_id_, .index = ui, .output = Blake2b("o")}),
            N(wb_, ChallengeUnitTx{.task_id = task_id_, .index = ui, .node_id = wb_.public_key(),
                                   .claim = ClaimOf(Leaves(u, false), 0, Blake2b("r"))}),
            RevealTx(v1_, u, early), RevealTx(v1_, other, later), SecretTx(u), SecretTx(other)});
  EXPECT_EQ(r[0].code, StatusCode::kInvalidArgument) << r[0].reason;
  EXPECT_EQ(r[1].code, StatusCode::kPermissionDenied) << r[1].reason;
  EXPECT_EQ(r[2].code, StatusCode::kPermissionDenied) << r[2].reason;  // not its unit
  EXPECT_EQ(r[3].code, StatusCode::kPermissionDenied) << r[3].reason;  // not its secret
  EXPECT_EQ(r[4].code, StatusCode::kFailedPrecondition) << r[4].reason;
  EXPECT_EQ(r[5].code, StatusCode::kFailedPrecondition) << r[5].reason;
  EXPECT_EQ(r[6].code, StatusCode::kFailedPrecondition) << r[6].reason;
  for (size_t i = 7; i < r.size(); ++i) EXPECT_TRUE(r[i].ok) << r[i].reason;
  StepUntilDone(u);
  EXPECT_EQ(Check(u).result(), CheckResult::kCheckClean) << Check(u).reason();
}

TEST_F(VerificationTest, InToleranceModeTheRefereeJudgesTheWholeSegment) {
  data_root_ = Hash256{};  // tolerance mode takes a task without one: the referee replays it
  Start(/*verifiers=*/1, /*tolerance_ppm=*/50);
  const int u = UnitOf(s1_), other = UnitOf(s2_);
  CommitAll({{u, false}, {other, false}});
  Aggregate();
  // The verifier's replay on other hardware ends elsewhere and, it says, out of tolerance.
  Sealed claim = Mismatch(u, 1, false, Blake2b("replayed on another machine"));
  Sealed ok = Clean();
  StepOk({SealTx(v1_, u, claim), SealTx(v1_, other, ok)});
  StepUntil(u, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(v1_, u, claim), RevealTx(v1_, other, ok), SecretTx(u), SecretTx(other)});
  StepUntil(u, CheckStage::kCheckDisputed);
  // No bisection: the game is at the referee at once, over the whole segment (steps 2..4).
  const UnitCheck disputed = Check(u);
  const protocol::DisputeGame& g = *disputed.dispute();
  ASSERT_EQ(g.stage(), protocol::DisputeStage::kDisputeReferee);
  EXPECT_TRUE(g.referee_task().segment);
  EXPECT_EQ(g.referee_task().first_step, 2u);
  EXPECT_EQ(g.referee_task().step, 4u);
  const uint32_t ui = static_cast<uint32_t>(u);
  std::vector<Receipt> r =
      Step({Q(referee_, RuleDisputeTx{.task_id = task_id_, .index = ui, .output = Blake2b("o")})});
  EXPECT_EQ(r[0].code, StatusCode::kInvalidArgument) << r[0].reason;
  // Only the referee rules.
  const RuleDisputeTx rule{.task_id = task_id_, .index = ui, .tolerance_verdict = 1};
  r = Step({Q(gina_, rule)});
  EXPECT_EQ(r[0].code, StatusCode::kPermissionDenied) << r[0].reason;
  // The ledger executes no segment: no RefereeStep (the task's mode named before its missing
  // data root), and not a pipeline stage's unit: no stage step witness either.
  r = Step({Q(
      gina_, RefereeStepTx{.task_id = task_id_, .index = ui, .witness = {EncodeStepWitness({})}})});
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition) << r[0].reason;
  EXPECT_NE(r[0].reason.find("is not about one whole step (tolerance mode); the genesis referee "
                             "rules it (RuleDispute)"),
            std::string::npos)
      << r[0].reason;
  r = Step(
      {Q(gina_, RefereeStageStepTx{.task_id = task_id_, .index = ui, .witness = {Bytes(8, 1)}})});
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition) << r[0].reason;
  EXPECT_NE(r[0].reason.find("is not a pipeline stage's; send RefereeStep or RefereeTile"),
            std::string::npos)
      << r[0].reason;
  // The referee's replay finds the solver's committed state within tolerance: the solver wins.
  const Transaction ruling = Q(referee_, rule);
  const uint32_t round = Unit(u).round;
  StepOk({ruling});
  const uint64_t ruled_at = chain_->Height();
  r = Step({Q(referee_, rule)});  // nothing left to rule
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition) << r[0].reason;
  StepUntilDone(u, 3);
  EXPECT_EQ(Check(u).result(), CheckResult::kCheckClean) << Check(u).reason();
  EXPECT_EQ(Node(v1_).reputation.slashes, 1u);
  EXPECT_EQ(Node(s1_).reputation.slashes, 0u);
  // The task keeps the genesis key's ruling: no witness, the segment's last step, the defender
  // honest (the refused rulings above left none).
  const std::vector<DisputeRuling>& kept = Task().verification.rulings;
  ASSERT_EQ(kept.size(), 1u);
  DisputeRuling want = RulingBy(ruling, ruled_at);
  want.index = ui;
  want.round = round;
  want.step = 4;
  want.defender = s1_.public_key();
  want.challenger = v1_.public_key();
  want.defender_honest = true;
  want.reason = kept[0].reason;  // the game's own text, checked by the protocol's tests
  ExpectRulings(Task(), {want});
  EXPECT_EQ(TaskToJson(Task())["verification"]["rulings"][0]["for"], "defender");
}

TEST_F(VerificationTest, ASolverWhoseStakeCannotCoverTheSlashGetsNoUnits) {
  Start(/*verifiers=*/1, /*tolerance_ppm=*/0,
        /*s1_stake=*/kSlashMultiple * kTestUnitCost - 1);  // one token short of a slash
  for (const WorkUnit& u : chain_->ListWorkUnits(task_id_)) {
    if (u.status == WorkUnitStatus::kAssigned) {
      EXPECT_EQ(u.assignee, s2_.public_key());
    }
  }
  EXPECT_GE(UnitOf(s2_), 0);
  EXPECT_EQ(UnitOf(s1_), -1);
}

TEST_F(VerificationTest, ASolverMustRegisterASecretChain) {
  RegisterNodeTx reg = Reg(s1_, kRoleSolver);
  reg.secret_head = Hash256{};
  std::vector<Receipt> r = Step({N(s1_, reg)});
  EXPECT_EQ(r[0].code, StatusCode::kInvalidArgument);
  EXPECT_NE(r[0].reason.find("secret_head"), std::string::npos) << r[0].reason;
  // A verifier needs none.
  RegisterNodeTx v = Reg(v1_, kRoleVerifier);
  v.secret_head = Hash256{};
  StepOk({N(v1_, v)});
}

TEST_F(VerificationTest, VerificationParamsRoundTripThroughGenesisToml) {
  Genesis g = genesis_;
  g.params.verify_floor_permille = 77;
  g.params.slash_multiple = 3;
  auto back = ParseGenesis(GenesisToToml(g));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, g);
  EXPECT_NE(GenesisHash(*back), GenesisHash(genesis_));
  Genesis bad = g;
  bad.params.verify_floor_permille = 0;
  EXPECT_FALSE(ValidateGenesis(bad).ok());
  bad = g;
  bad.params.slash_multiple = 0;
  EXPECT_FALSE(ValidateGenesis(bad).ok());
  std::string toml = GenesisToToml(g);
  toml.replace(toml.find("slash_multiple"), 14, "slash_multipel");
  auto typo = ParseGenesis(toml);
  EXPECT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("slash_multipel"), std::string::npos)
      << typo.status().ToString();
}

}  // namespace
}  // namespace meshlearn::ledger

// Verification played by the nodes themselves, in one process (testing/sim_harness.h): solvers
// commit with their secrets and reveal them, verifiers replay and commit-reveal verdicts,
// whistleblowers re-check, parties of a dispute post their hashes, and the ledger slashes and
// pays. Every test also checks that no honest node is ever slashed, and, where the task
// finishes, that its final state is the honest reference's bit for bit (a cheater's work never
// reaches the model).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/net/sim_transport.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/secret_chain.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/node/unit_service.h"
#include "meshlearn/protocol/verification.h"
#include "testing/diloco_task.h"
#include "testing/sim_harness.h"
#include "testing/synthetic_task.h"
#include "testing/token_task.h"
#include "testing/verification_sim.h"

namespace meshlearn::node {
namespace {

TEST(SecretChainTest, ElementsAreTheProtocolsChain) {
  const Hash256 seed = SecretChainSeed(KeySeed{}, 1);
  EXPECT_NE(seed, SecretChainSeed(KeySeed{}, 2));  // every registration epoch has its own chain
  SecretChain chain(seed);
  EXPECT_EQ(chain.head(), protocol::SecretChainElement(seed, 0));
  for (uint64_t i : {uint64_t{1}, uint64_t{255}, uint64_t{256}, uint64_t{257}, uint64_t{4097},
                     protocol::kSecretChainLength - 1, protocol::kSecretChainLength}) {
    EXPECT_EQ(chain.Element(i), protocol::SecretChainElement(seed, i)) << i;
  }
  // Each element opens the one before it, as the ledger checks a reveal.
  EXPECT_TRUE(protocol::CheckSecretInChain(chain.Element(3), chain.head(), 3).ok());
}

// A shared chain is its seed's chain, the same object each time the seed is asked for while it
// is among the last kShared seeds, and built again after.
TEST(SecretChainTest, ASharedChainIsItsSeedsChain) {
  const Hash256 a = SecretChainSeed(KeySeed{}, 3);
  const Hash256 b = SecretChainSeed(KeySeed{}, 4);
  std::shared_ptr<const SecretChain> chain_a = SecretChain::Shared(a);
  std::shared_ptr<const SecretChain> chain_b = SecretChain::Shared(b);
  EXPECT_EQ(chain_a->head(), protocol::SecretChainElement(a, 0));
  EXPECT_EQ(chain_b->head(), protocol::SecretChainElement(b, 0));
  EXPECT_EQ(chain_a->Element(300), protocol::SecretChainElement(a, 300));
  EXPECT_EQ(SecretChain::Shared(a), chain_a);
  EXPECT_EQ(SecretChain::Shared(b), chain_b);
  for (uint64_t epoch = 100; epoch < 100 + SecretChain::kShared; ++epoch) {
    SecretChain::Shared(SecretChainSeed(KeySeed{}, epoch));
  }
  std::shared_ptr<const SecretChain> again = SecretChain::Shared(a);
  EXPECT_NE(again, chain_a);
  EXPECT_EQ(again->head(), chain_a->head());
}

TEST(UnitServiceTest, ServesTheManifestAndCheckpointSlices) {
  MemEnv env;
  std::string big(kMaxCheckpointSlice + 1000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(env.CreateDirs("/u").ok());
  ASSERT_TRUE(env.WriteFileAtomic("/u/ckpt-2.safetensors", big).ok());
  net::SimNetwork simnet(1, net::LinkParams{.latency_us = 100, .bandwidth_bytes_per_sec = 1e9});
  simnet.AddNode("solver");
  simnet.AddNode("verifier");
  net::Router router;
  UnitService service(&env);
  service.Register(&router);
  simnet.node("solver")->Serve(&router);
  net::Transport* t = simnet.node("verifier")->transport();
  const Hash256 task = Blake2b(AsBytes("task"));
  EXPECT_EQ(FetchUnitManifest(t, "solver", task, 3).status().code(), StatusCode::kNotFound);

  UnitManifest m{.task_id = task,
                 .index = 3,
                 .leaves = {Blake2b(AsBytes("a")), Blake2b(AsBytes("b"))},
                 .checkpoints = {{.step = 2, .size = big.size()}}};
  service.Publish(m, {"/u/ckpt-2.safetensors"});
  Result<UnitManifest> got = FetchUnitManifest(t, "solver", task, 3);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->leaves, m.leaves);
  ASSERT_EQ(got->checkpoints.size(), 1u);
  Result<Bytes> ckpt = FetchUnitCheckpoint(t, "solver", *got, 2);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ(AsStringView(*ckpt), big);
  EXPECT_EQ(FetchUnitCheckpoint(t, "solver", *got, 4).status().code(), StatusCode::kNotFound);
  service.Withdraw(task, 3);
  EXPECT_FALSE(service.Serves(task, 3));
  EXPECT_EQ(FetchUnitManifest(t, "solver", task, 3).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(DecodeUnitManifest(AsBytes("junk")).ok());
}

// ReplayToSteps gives the committed leaves, from the unit's start or from a checkpoint.
TEST(ReplayToStepsTest, GivesTheLeavesFromTheStartOrACheckpoint) {
  std::unique_ptr<engine::Trainer> trainer(SmallFashionTrainer("replay-steps", 5, 16, 16));
  ASSERT_NE(trainer, nullptr);
  std::vector<float> global = trainer->FlatParams();
  const UnitWork work{.stream = 9, .inner_steps = 5, .checkpoint_interval = 2};
  MemEnv env;
  UnitRunOptions opts;
  opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                           double) {
    return engine::SaveCheckpoint(&env, "/ckpt-" + std::to_string(step), st);
  };
  UnitExecutor ex(trainer.get());
  Result<UnitOutcome> out = ex.Run(global, work, opts);
  ASSERT_TRUE(out.ok()) << out.status().ToString();  // leaves at steps 0, 2, 4, 5
  const int64_t ends[] = {0, 2, 4, 5};
  Result<std::vector<Hash256>> all = ReplayToSteps(trainer.get(), global, work, 0, nullptr, ends);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, out->state_hashes);
  Result<engine::TrainState> at2 = engine::LoadCheckpoint(&env, "/ckpt-2");
  ASSERT_TRUE(at2.ok());
  const int64_t from2[] = {2, 3, 4};
  Result<std::vector<Hash256>> some = ReplayToSteps(trainer.get(), global, work, 2, &*at2, from2);
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ((*some)[0], out->state_hashes[1]);
  EXPECT_EQ((*some)[2], out->state_hashes[2]);
  const int64_t bad[] = {1};
  EXPECT_FALSE(ReplayToSteps(trainer.get(), global, work, 2, &*at2, bad).ok());
  EXPECT_FALSE(ReplayToSteps(trainer.get(), global, work, 2, nullptr, from2).ok());
}

using nlohmann::json;
using testing::CheckLog;
using testing::ExpectFinalModelIsHonest;
using testing::ExpectNeverSlashed;
using testing::kAllRoles;
using testing::Node;
using testing::SimHarness;
using testing::SimLog;
using testing::SimNodeOptions;
using testing::SimOptions;
using testing::Slashes;
using testing::Tally;
using testing::VerifyFixture;
using testing::VerifyingChain;

TEST(VerificationSimTest, HonestNetworkSettlesCleanAndPaysEveryone) {
  VerifyFixture f(31, /*rounds=*/2, /*units=*/3, /*H=*/4, /*k=*/2);
  SimHarness* simp = nullptr;
  CheckLog checks;
  SimOptions o{.seed = 31, .nodes = 4, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options.assign(4, SimNodeOptions{.roles = kAllRoles});
  o.tweak_genesis = VerifyingChain();
  o.on_block = [&](uint64_t) { checks.Scan(*simp); };
  SimHarness sim(o);
  simp = &sim;
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();

  json task = sim.Task(true);
  ASSERT_EQ(task["units"].size(), 6u);
  for (const json& u : task["units"]) {
    EXPECT_GT(u.value("paid", uint64_t{0}), 0u) << u.dump();
    ASSERT_TRUE(u["check"].is_object()) << u.dump();
    // New nodes are always checked: every unit was replayed by a verifier and found clean.
    EXPECT_EQ(u["check"].value("result", std::string()), "clean") << u.dump();
  }
  for (const auto& [solver, results] : checks.results) {
    for (const std::string& r : results) EXPECT_EQ(r, "clean") << solver;
  }
  uint64_t verdicts = 0, revealed = 0, secrets = 0, mismatches = 0;
  for (int i = 0; i < 4; ++i) {
    const AgentStats& s = sim.agent(i)->stats();
    verdicts += s.verdicts_committed;
    revealed += s.verdicts_revealed;
    secrets += s.secrets_revealed;
    mismatches += s.mismatches;
  }
  EXPECT_GE(verdicts, 6u);
  EXPECT_EQ(revealed, verdicts);
  EXPECT_GE(secrets, 6u);
  EXPECT_EQ(mismatches, 0u);
  ExpectNeverSlashed(sim, {0, 1, 2, 3});
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Node(sim, i)["reputation"].value("failures", uint64_t{1}), 0u) << i;
  }
  EXPECT_EQ(Tally(sim, "clean"), 6u);
  EXPECT_EQ(Tally(sim, "fraud") + Tally(sim, "abandoned") + Tally(sim, "disputes"), 0u);
  EXPECT_GT(Tally(sim, "verifiers_paid"), 0u);
  ExpectFinalModelIsHonest(sim, f);
  EXPECT_TRUE(sim.Totals().Check().ok());
}

// Nodes killed (kill -9) and restarted in the middle of verification: a solver right after its
// first commit still serves its leaves and checkpoints and reveals its secret (its chain comes
// back from its data dir), a verifier right after committing its verdict still reveals it (the
// verdict and its salt come back from <data_dir>/verify/). Nothing is missed, nothing is sent
// twice.
TEST(VerificationSimTest, RestartedSolverAndVerifierStillRevealEverything) {
  VerifyFixture f(81, /*rounds=*/2, /*units=*/2, /*H=*/4, /*k=*/2);
  SimHarness* simp = nullptr;
  bool solver_restarted = false, verifier_restarted = false;
  SimOptions o{.seed = 81, .nodes = 3, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options = {{.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleVerifier},
                    {.roles = ledger::kRoleVerifier}};
  o.tweak_genesis = VerifyingChain();
  o.on_block = [&](uint64_t) {
    SimHarness& sim = *simp;
    if (!solver_restarted && sim.agent(0)->stats().units_completed > 0) {
      solver_restarted = true;
      sim.Kill(0);
      EXPECT_TRUE(sim.Restart(0).ok());
    }
    for (int i = 1; i < 3 && !verifier_restarted; ++i) {
      if (sim.agent(i)->stats().verdicts_committed > 0) {
        verifier_restarted = true;
        sim.Kill(i);
        EXPECT_TRUE(sim.Restart(i).ok());
      }
    }
  };
  SimHarness sim(o);
  simp = &sim;
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  EXPECT_TRUE(solver_restarted);
  EXPECT_TRUE(verifier_restarted);
  const json final_task = sim.Task(true);
  for (const json& u : final_task["units"]) {
    EXPECT_EQ(u["check"].value("result", std::string()), "clean") << u.dump();
    EXPECT_GT(u.value("paid", uint64_t{0}), 0u) << u.dump();
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Node(sim, i)["reputation"].value("failures", uint64_t{1}), 0u) << i;
    EXPECT_EQ(sim.agent(i)->stats().tx_failed, 0u) << i;
  }
  ExpectNeverSlashed(sim, {0, 1, 2});
  ExpectFinalModelIsHonest(sim, f);
}

// A solver adversary among honest verifiers: each of its units is caught (fraud, after a dispute
// it defends with its own states; the honest challenger posts the narrowed step's witness and
// the ledger executes it: no referee service runs here), it is slashed and never paid, and the
// round re-runs without it, so the final model is the honest one.
class CheatingSolverTest : public ::testing::TestWithParam<Adversary> {};

TEST_P(CheatingSolverTest, IsCaughtSlashedAndNeverPaid) {
  const Adversary adv = GetParam();
  // Two solvers (the cheater and an honest one) share 4 units a round, so the cheater runs a
  // second unit before its first is caught (a slash jails it): "copy" then copies the honest
  // solver's committed delta and "stale" re-commits its first result. Two more nodes verify.
  VerifyFixture f(41, /*rounds=*/2, /*units=*/4, /*H=*/4, /*k=*/2);
  SimHarness* simp = nullptr;
  CheckLog checks;
  std::vector<std::string> logs;
  SimOptions o{.seed = 41, .nodes = 4, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options = {{.roles = kAllRoles},
                    {.roles = kAllRoles},
                    {.roles = ledger::kRoleVerifier},
                    {.roles = ledger::kRoleVerifier}};
  o.tweak_genesis = VerifyingChain();
  constexpr uint64_t kCheaterStake = 100'000;
  o.agent_options = [adv](int i, AgentOptions& a) {
    if (i == 0) {
      a.adversary = adv;
      a.stake = kCheaterStake;
    }
  };
  o.log_sink = [&](int i, const std::string& line) {
    if (i == 0) logs.push_back(line);
  };
  o.on_block = [&](uint64_t) { checks.Scan(*simp); };
  SimHarness sim(o);
  simp = &sim;
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(600);
  ASSERT_TRUE(run.ok()) << run.ToString();

  const std::string cheater = sim.node_key(0).public_key().ToHex();
  EXPECT_GE(checks.Count(cheater, "disputed"), 1u) << AdversaryName(adv);
  EXPECT_GE(Tally(sim, "fraud"), 1u) << AdversaryName(adv);
  EXPECT_EQ(Tally(sim, "abandoned"), 0u) << AdversaryName(adv);
  EXPECT_EQ(checks.Count(cheater, "clean"), 0u) << AdversaryName(adv);
  EXPECT_EQ(checks.Count(cheater, "unchecked"), 0u) << AdversaryName(adv);
  json node = Node(sim, 0);
  EXPECT_GT(node["reputation"].value("slashes", uint64_t{0}), 0u) << node.dump();
  EXPECT_LT(node.value("stake", uint64_t{0}), kCheaterStake) << node.dump();
  json task = sim.Task(true);
  for (const json& u : task["units"]) {
    EXPECT_NE(u.value("assignee", std::string()), cheater) << u.dump();
    EXPECT_GT(u.value("paid", uint64_t{0}), 0u) << u.dump();
  }
  EXPECT_GE(sim.agent(0)->stats().units_completed, 2u);
  if (adv == Adversary::kCopy) {
    bool copied = false;
    for (const std::string& l : logs)
      copied |= l.find("copying another solver") != std::string::npos;
    EXPECT_TRUE(copied);
  }
  ExpectNeverSlashed(sim, {1, 2, 3});
  Result<GlobalState> st = sim.FinalState();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(HashFloats(st->weights), HashFloats(LocalReference(&f.env, f.toml)))
      << AdversaryName(adv);
  EXPECT_TRUE(sim.Totals().Check().ok());
}

INSTANTIATE_TEST_SUITE_P(EveryMode, CheatingSolverTest,
                         ::testing::Values(Adversary::kLazy, Adversary::kNoisy,
                                           Adversary::kWrongData, Adversary::kCopy,
                                           Adversary::kStale, Adversary::kWrongExample),
                         [](const ::testing::TestParamInfo<Adversary>& p) {
                           return std::string(AdversaryName(p.param));
                         });

// The cast of the one-dispute tests: node 0 a solver and aggregator cheating as `adversary`
// (staked 100,000 so that a slash never unbonds it), node 1 every role, node 2 a verifier, on a
// verifying chain; the referee service runs when `referee`. `tile_disputes` false: mismatches
// carry no bundle, so disputes play whole steps.
// (`toml` with its data in `env`: any task.)
SimOptions CheaterAndTwoVerifiers(Env* env, const std::string& toml, uint64_t seed,
                                  Adversary adversary, bool referee, bool tile_disputes = true) {
  SimOptions o{.seed = seed, .nodes = 3, .task_toml = toml, .log = SimLog(), .env = env};
  o.node_options = {{.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = kAllRoles},
                    {.roles = ledger::kRoleVerifier}};
  o.tweak_genesis = VerifyingChain();
  o.referee = referee;
  o.agent_options = [adversary, tile_disputes](int i, AgentOptions& a) {
    a.tile_disputes = tile_disputes;
    if (i == 0) {
      a.adversary = adversary;
      a.stake = 100'000;
    }
  };
  return o;
}
SimOptions CheaterAndTwoVerifiers(VerifyFixture& f, uint64_t seed, Adversary adversary,
                                  bool referee, bool tile_disputes = true) {
  return CheaterAndTwoVerifiers(&f.env, f.toml, seed, adversary, referee, tile_disputes);
}

// With a checkpoint every step, a disputed segment is one step: the game goes straight to its
// operators, then to one tile (the verifier's mismatch carries the task bundle); the lazy solver
// claims its skipped update, so the first differing operator is an updated parameter. The
// referee service (node/referee.h, run by the harness after every block) and the honest verifier
// each post the tile's witness (RefereeTile); the ledger recomputes the tile and rules for the
// verifier. No key is trusted.
TEST(VerificationSimTest, AOneStepDisputeIsRuledByTheReferee) {
  VerifyFixture f(91, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/1);
  SimOptions o = CheaterAndTwoVerifiers(f, 91, Adversary::kLazy, /*referee=*/true);
  SimHarness sim(o);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  ASSERT_NE(sim.referee(), nullptr);
  ASSERT_FALSE(sim.referee()->rulings().empty());
  for (const RefereeRecord& r : sim.referee()->rulings()) {
    // Second to post in the same block as the challenger's own witness: already ruled.
    if (!r.ok) {
      EXPECT_NE(r.error.find("no dispute waiting for the referee"), std::string::npos) << r.error;
    }
    EXPECT_EQ(r.dispute.defender, sim.node_key(0).public_key());
    EXPECT_EQ(r.ruling.output, r.dispute.task.challenger_output) << r.ruling.reason;
    // The verifier's mismatch carried the task bundle: the game went on from the step to one
    // tile of one operator (the lazy solver's skipped update), and the ledger recomputed that
    // tile from the service's witness.
    EXPECT_EQ(r.tx_type, "RefereeTile") << r.ruling.reason;
    EXPECT_TRUE(r.ruling.ledger_executes);
    EXPECT_TRUE(r.dispute.task.tile);
    EXPECT_GT(r.ruling.witness_bytes, 0u);
    EXPECT_LE(r.ruling.witness_bytes, ledger::kMaxTileWitnessBytes);
    std::printf("[ tile     ] ruled by %s: %s\n", r.tx_type.c_str(), r.ruling.reason.c_str());
  }
  EXPECT_GE(Tally(sim, "disputes"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  ExpectNeverSlashed(sim, {1, 2});
  ExpectFinalModelIsHonest(sim, f);
}

// The same dispute with no referee service at all: the honest verifier's own agent traces the
// disputed step, plays the operators and the tiles, and posts the tile's witness (RefereeTile)
// itself; the ledger rules. Nobody but the two parties takes part.
TEST(VerificationSimTest, TheHonestPartyPostsTheTileWitnessItself) {
  VerifyFixture f(91, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/1);
  SimOptions o = CheaterAndTwoVerifiers(f, 91, Adversary::kLazy, /*referee=*/false);
  SimHarness sim(o);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  uint64_t witnesses = 0, largest = 0;
  for (int i = 1; i < 3; ++i) {
    witnesses += sim.agent(i)->stats().tile_witnesses;
    largest = std::max(largest, sim.agent(i)->stats().tile_witness_bytes);
  }
  EXPECT_GE(witnesses, 1u) << "an honest party posted RefereeTile";
  EXPECT_EQ(sim.agent(0)->stats().tile_witnesses, 0u) << "the cheater posts no witness";
  EXPECT_GT(largest, 0u);
  EXPECT_LE(largest, ledger::kMaxTileWitnessBytes);
  std::printf("[ tile     ] the verifier's own RefereeTile: %llu witness(es), largest %llu bytes\n",
              static_cast<unsigned long long>(witnesses), static_cast<unsigned long long>(largest));
  EXPECT_GE(Tally(sim, "disputes"), 1u);
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  ExpectNeverSlashed(sim, {1, 2});
  ExpectFinalModelIsHonest(sim, f);
}

// The token form of wrong_example (issue 16) in a live dispute: a GPT task (WriteTinyGptTask, its
// data root over the train stream's token pages) whose solver, node 0, reads step 2 of each unit
// with the batch's first token swapped (ForgeExample) and commits what it computed. The honest
// verifier's replay misses the unit's leaf; the dispute (the mismatch carries the bundle: a token
// task's always does) narrows to step 2, to the first operator whose output differs, `encoded`
// (the embedding lookup wte[token] + wpe[position], the operator that reads the tokens), and to
// the tile holding row 0, the swapped token's. The honest party posts the tile's witness and the
// ledger recomputes the tile from the tokens proven by their pages against the data root
// (RefereeTile, no key): the liar slashed, never paid, the final model the honest one.
TEST(VerificationSimTest, AForgedTokenIsCaughtAtTheEmbeddingTileOfItsRow) {
  MemEnv env;
  Result<std::string> toml = testing::WriteTinyGptTask(&env, "/data", 43, /*rounds=*/1,
                                                       /*units=*/2, /*H=*/4, /*k=*/2);
  ASSERT_TRUE(toml.ok()) << toml.status().ToString();
  SimOptions o = CheaterAndTwoVerifiers(&env, *toml, 43, Adversary::kWrongExample,
                                        /*referee=*/false);
  SimHarness* simp = nullptr;
  CheckLog checks;
  o.on_block = [&](uint64_t) { checks.Scan(*simp); };
  SimHarness sim(o);
  simp = &sim;
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(600);
  ASSERT_TRUE(run.ok()) << run.ToString();
  const std::string liar = sim.node_key(0).public_key().ToHex();
  const json task = sim.Task(true);
  ASSERT_EQ(task.value("status", std::string()), "finished");
  EXPECT_GE(checks.Count(liar, "disputed"), 1u);
  EXPECT_EQ(checks.Count(liar, "clean"), 0u);
  EXPECT_GT(task["params"].value("data_page_tokens", uint64_t{0}), 0u)
      << "not a token task with a data root over its pages";

  // The plan of a step of the task, as the ledger plans it.
  ASSERT_TRUE(env.WriteFileAtomic("/data/task.toml", *toml).ok());
  Result<engine::TaskSpec> spec = engine::TaskSpec::Load(&env, "/data/task.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<engine::Trainer>> trainer = engine::Trainer::Create(&env, *spec);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  const engine::TaskSpec& t = (*trainer)->task();
  Result<engine::TilePlan> plan =
      engine::PlanStepTiles(t.model, t.optimizer, t.batch_size, t.seq_len, t.micro_batches);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->tokens);
  const int64_t forged_step = ForgedExampleStep(4);
  ASSERT_EQ(forged_step, 2);

  // Every game against the liar ruled by RefereeTile at the tile of `encoded` holding row 0.
  size_t ruled = 0;
  for (const json& ru : task["verification"]["rulings"]) {
    if (ru.value("defender", std::string()) != liar) continue;
    ++ruled;
    EXPECT_EQ(ru.value("tx", std::string()), "RefereeTile") << ru.dump();
    EXPECT_EQ(ru.value("for", std::string()), "challenger") << ru.dump();
    EXPECT_EQ(ru.value("step", uint64_t{0}), static_cast<uint64_t>(forged_step)) << ru.dump();
    EXPECT_GT(ru.value("witness_bytes", uint64_t{0}), 0u);
    EXPECT_LE(ru.value("witness_bytes", uint64_t{0}), ledger::kMaxTileWitnessBytes);
    const auto tile = testing::RuledTile(ru);
    ASSERT_TRUE(tile.has_value()) << "not ruled at a tile: " << ru.dump();
    const auto [op, tile_index] = *tile;
    ASSERT_GE(op, 1u);
    ASSERT_LE(op, plan->ops.size());
    const engine::TileOp& o = plan->ops[op - 1];
    EXPECT_EQ(o.name, "encoded");
    EXPECT_EQ(o.kind, engine::TileOpKind::kTileOpEmbedding) << o.name;
    EXPECT_EQ(o.grid.TileRect(static_cast<int64_t>(tile_index)).r0, 0)
        << "tile " << tile_index << " does not hold row 0, the swapped token's";
    Result<engine::TileFootprint> fp =
        engine::Footprint(*plan, static_cast<int64_t>(op - 1), static_cast<int64_t>(tile_index), 0);
    ASSERT_TRUE(fp.ok()) << fp.status().ToString();
    ASSERT_FALSE(fp->batch_rows.empty()) << "the tile reads no tokens";
    EXPECT_EQ(fp->batch_rows.front(), 0) << "the swapped token is batch row 0";
    std::printf(
        "[ token    ] unit %u ruled by %s for the %s at tile %llu of operator %u (%s, "
        "reading %zu tokens), witness %llu bytes\n",
        ru.value("index", 0u), ru.value("tx", std::string()).c_str(),
        ru.value("for", std::string()).c_str(), static_cast<unsigned long long>(tile_index), op,
        o.name.c_str(), fp->batch_rows.size(),
        static_cast<unsigned long long>(ru.value("witness_bytes", uint64_t{0})));
  }
  EXPECT_GE(ruled, 1u) << task["verification"].dump();
  EXPECT_EQ(sim.agent(0)->stats().tile_witnesses, 0u) << "the liar posts no witness";
  EXPECT_GE(sim.agent(1)->stats().tile_witnesses + sim.agent(2)->stats().tile_witnesses, ruled);
  // Slashed, never paid; the honest nodes never slashed; the model the honest reference.
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  for (const json& u : task["units"]) {
    EXPECT_NE(u.value("assignee", std::string()), liar) << u.dump();
    EXPECT_GT(u.value("paid", uint64_t{0}), 0u) << u.dump();
  }
  ExpectNeverSlashed(sim, {1, 2});
  Result<GlobalState> st = sim.FinalState();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(HashFloats(st->weights), HashFloats(LocalReference(&env, *toml)));
  EXPECT_TRUE(sim.Totals().Check().ok());
}

// Restart-safe: both verifiers are killed and restarted (new agents on the same data dirs, their
// traces lost) once the game is in its tile phase; the challenger traces the step again, answers
// the rest of the game without posting any move twice, posts the tile's witness, and the ledger
// rules for it.
TEST(VerificationSimTest, AChallengerRestartedInTheTilePhaseStillWins) {
  VerifyFixture f(91, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/1);
  SimOptions o = CheaterAndTwoVerifiers(f, 91, Adversary::kLazy, /*referee=*/false);
  SimHarness sim(o);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  bool restarted = false;
  for (int i = 0; i < 400 && !restarted; ++i) {
    ASSERT_TRUE(sim.Step().ok());
    const json t = sim.Task(true);
    for (const json& u : t["units"]) {
      const json& c = u["check"];
      if (c.is_object() && c["dispute"].is_object() &&
          c["dispute"].value("stage", std::string()) == "tiles") {
        restarted = true;
      }
    }
  }
  ASSERT_TRUE(restarted) << "the game never reached its tile phase";
  for (int i : {1, 2}) {
    sim.Kill(i);
    ASSERT_TRUE(sim.Restart(i).ok());
  }
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  uint64_t witnesses = 0, failed = 0;
  for (int i : {1, 2}) {
    witnesses += sim.agent(i)->stats().tile_witnesses;
    failed += sim.agent(i)->stats().tx_failed;
  }
  EXPECT_GE(witnesses, 1u) << "the restarted challenger posted RefereeTile";
  EXPECT_EQ(failed, 0u) << "no move was sent twice";
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  ExpectNeverSlashed(sim, {1, 2});
  ExpectFinalModelIsHonest(sim, f);
}

// The same dispute, played over whole steps (the verifier's mismatch carries no bundle), refereed
// by a service whose key genesis does not name (it names none: the sequencer's key would rule
// RuleDispute): a RefereeStep needs no key, the ledger executes the step itself, and the lazy
// solver still loses. (A checkpoint every step: every disputed segment
// is one step, so the game goes straight to the referee.)
TEST(VerificationSimTest, AnyoneCanPostTheStepWitnessAndTheLedgerRules) {
  VerifyFixture f(92, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/1);
  // Whole steps (no bundle in the mismatch): the ledger executes the step (RefereeStep).
  SimOptions o = CheaterAndTwoVerifiers(f, 92, Adversary::kLazy, /*referee=*/true,
                                        /*tile_disputes=*/false);
  o.referee_in_genesis = false;
  SimHarness sim(o);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  ASSERT_EQ(sim.genesis().referee, PublicKey{});
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  ASSERT_NE(sim.referee(), nullptr);
  // The witness comes from whoever posts it first: the honest challenger's agent (as soon as the
  // game reaches the referee) or the referee service, a plain funded key. Either way the ledger
  // executed the step: the cheater lost a dispute without any referee key in genesis.
  EXPECT_GE(Tally(sim, "disputes"), 1u);
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  for (const RefereeRecord& r : sim.referee()->rulings()) {
    // Second to post in the same block: the first witness already settled the game.
    if (!r.ok) {
      EXPECT_NE(r.error.find("no dispute waiting for the referee"), std::string::npos) << r.error;
    }
    EXPECT_EQ(r.tx_type, "RefereeStep");
    EXPECT_GT(r.ruling.witness_bytes, 0u);
    EXPECT_EQ(r.dispute.defender, sim.node_key(0).public_key());
    EXPECT_EQ(r.ruling.output, r.dispute.task.challenger_output) << r.ruling.reason;
  }
  EXPECT_GT(Slashes(sim, 0), 0u);
  ExpectNeverSlashed(sim, {1, 2});
  ExpectFinalModelIsHonest(sim, f);
}

// A task verified in tolerance mode (for hardware without bitwise reproducibility): honest units
// are clean (our engine replays them bit for bit), a noisy solver's perturbation is far outside
// the tolerance, so the verifier claims it and the referee, comparing the solver's committed end
// state with the true one, rules against it.
TEST(VerificationSimTest, ToleranceModeCatchesANoisySolverThroughTheReferee) {
  VerifyFixture f(95, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/2);
  SimOptions o = CheaterAndTwoVerifiers(f, 95, Adversary::kNoisy, /*referee=*/true);
  o.tweak_params = [](ledger::TaskParams& p) {
    p.tolerance_rel_l2_ppm = 10;
    p.tolerance_cosine_gap_ppb = 10;
  };
  SimHarness sim(o);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  ASSERT_FALSE(sim.referee()->rulings().empty());
  for (const RefereeRecord& r : sim.referee()->rulings()) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.dispute.defender, sim.node_key(0).public_key());
    EXPECT_EQ(r.ruling.tolerance_verdict, 2) << r.ruling.reason;
  }
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  ExpectNeverSlashed(sim, {1, 2});
  ExpectFinalModelIsHonest(sim, f);
}

// Every unit is a forced error: the solver commits the forced commitment, the honest verifier
// catches it (jackpot), the rubber stamp approves it and loses stake. Nobody else is slashed.
TEST(VerificationSimTest, RubberStampVerifierLosesStakeToAForcedError) {
  VerifyFixture f(51, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/2);
  SimOptions o{.seed = 51, .nodes = 3, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options = {{.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleVerifier},
                    {.roles = ledger::kRoleVerifier}};
  o.tweak_genesis = VerifyingChain(/*forced_per_million=*/1'000'000, /*verifiers_per_unit=*/2);
  o.agent_options = [](int i, AgentOptions& a) {
    if (i == 2) a.adversary = Adversary::kRubberStamp;
  };
  SimHarness sim(o);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  const uint64_t balance0 =
      sim.Call("get_account", {{"address", sim.node_key(1).public_key().ToHex()}})
          .value("balance", uint64_t{0});
  for (int b = 0; b < 120 && Slashes(sim, 2) == 0; ++b) ASSERT_TRUE(sim.Step().ok());
  json stamp = Node(sim, 2);
  EXPECT_GT(stamp["reputation"].value("slashes", uint64_t{0}), 0u) << stamp.dump();
  EXPECT_LT(stamp.value("stake", uint64_t{0}), sim.genesis().params.min_stake_verifier);
  EXPECT_GT(sim.agent(0)->stats().forced_errors, 0u);
  EXPECT_GT(sim.agent(1)->stats().mismatches, 0u);
  EXPECT_EQ(sim.agent(2)->stats().replays, 0u);  // it never replayed anything
  // The honest verifier shares the jackpot the rubber stamp's stake fed.
  const uint64_t balance1 =
      sim.Call("get_account", {{"address", sim.node_key(1).public_key().ToHex()}})
          .value("balance", uint64_t{0});
  EXPECT_GT(balance1, balance0);
  ExpectNeverSlashed(sim, {0, 1});
  EXPECT_TRUE(sim.Totals().Check().ok());
}

// Forced errors now and then in an honest network: each is caught and re-run, nobody is slashed
// and the model is the reference's. Which units are forced depends on the blocks (their hashes
// cover the committed state hashes), so a seed may draw none: the first seed that does counts.
uint64_t RunWithForcedErrors(uint64_t seed) {
  VerifyFixture f(seed, /*rounds=*/2, /*units=*/3, /*H=*/4, /*k=*/2);
  SimOptions o{.seed = seed, .nodes = 4, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options.assign(4, SimNodeOptions{.roles = kAllRoles});
  o.tweak_genesis = VerifyingChain(/*forced_per_million=*/250'000);
  SimHarness sim(o);
  Status setup = sim.Setup();
  EXPECT_TRUE(setup.ok()) << setup.ToString();
  Status run = setup.ok() ? sim.RunUntilFinished(800) : setup;
  EXPECT_TRUE(run.ok()) << run.ToString();
  if (!run.ok()) return 0;
  uint64_t forced = 0, caught = 0;
  for (int i = 0; i < 4; ++i) {
    forced += sim.agent(i)->stats().forced_errors;
    caught += sim.agent(i)->stats().mismatches;
  }
  // A forced unit a verifier replays is caught; one not drawn for a replay (the solver's streak
  // lowers its probability) settles as a forced error all the same, and one of a round dropped
  // for an earlier round's re-run never settles: so the catches are at least one, not one per
  // forced unit. What matters is below: none was accepted, nobody slashed, the model the
  // reference's.
  EXPECT_EQ(caught > 0, forced > 0);
  // (A forced unit whose round re-ran for another unit's forced error is never settled.)
  EXPECT_LE(Tally(sim, "forced_error"), forced);
  EXPECT_EQ(Tally(sim, "forced_error") > 0, forced > 0);
  EXPECT_EQ(Tally(sim, "fraud") + Tally(sim, "abandoned"), 0u);
  ExpectNeverSlashed(sim, {0, 1, 2, 3});
  Result<GlobalState> st = sim.FinalState();
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (st.ok()) {
    EXPECT_EQ(HashFloats(st->weights), HashFloats(LocalReference(&f.env, f.toml)));
  }
  EXPECT_TRUE(sim.Totals().Check().ok());
  return forced;
}

TEST(VerificationSimTest, ForcedErrorsAreCaughtAndRerunWithoutSlashingAnyone) {
  uint64_t forced = 0;
  for (uint64_t seed = 61; seed < 66 && forced == 0 && !HasFailure(); ++seed) {
    forced = RunWithForcedErrors(seed);
  }
  EXPECT_GT(forced, 0u) << "no seed drew a forced error";
}

// The only verifier rubber-stamps a lazy solver's units; a whistleblower re-checks them before
// the round is final, challenges, and wins the dispute: the cheat and the rubber stamp are
// slashed, and the final model is the honest one.
TEST(VerificationSimTest, WhistleblowerCatchesWhatARubberStampApproved) {
  VerifyFixture f(71, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/2);
  SimOptions o{.seed = 71, .nodes = 4, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options = {{.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleVerifier},
                    {.roles = ledger::kRoleWhistleblower}};
  o.tweak_genesis = VerifyingChain();
  // Long enough after the aggregate that the units' checks settle before the round is final.
  o.tweak_params = [](ledger::TaskParams& p) { p.verification_window_blocks = 30; };
  o.agent_options = [](int i, AgentOptions& a) {
    if (i == 0) a.adversary = Adversary::kLazy;
    if (i == 2) a.adversary = Adversary::kRubberStamp;
    if (i == 3) a.whistleblower_sample = 1.0;
  };
  SimHarness sim(o);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(600);
  ASSERT_TRUE(run.ok()) << run.ToString();
  EXPECT_GT(sim.agent(3)->stats().challenges, 0u);
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  EXPECT_GT(Slashes(sim, 2), 0u);
  ExpectNeverSlashed(sim, {1, 3});
  const std::string cheater = sim.node_key(0).public_key().ToHex();
  const json final_task = sim.Task(true);
  for (const json& u : final_task["units"]) {
    EXPECT_NE(u.value("assignee", std::string()), cheater) << u.dump();
  }
  ExpectFinalModelIsHonest(sim, f);
  EXPECT_TRUE(sim.Totals().Check().ok());
}

// A solver that trains on another unit's data (wrong_data) answers the whistleblower's dispute
// over steps with its own states but has no step to show in the tile phase, so it falls silent
// there, on purpose: its silence alone would spare the verifier that approved its unit unread. In
// the merits window that follows, the whistleblower's node shows the disputed segment on its
// merits (ProveMerits: the segment's witness from the solver's checkpoint it replayed from), the
// ledger replays it, and the rubber stamp is slashed with the cheat. The final model is honest.
TEST(VerificationSimTest, AWhistleblowerShowsTheMeritsOfADisputeItsSolverFellSilentIn) {
  VerifyFixture f(71, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/2);
  SimHarness* simp = nullptr;
  bool window_seen = false;
  SimOptions o{.seed = 71, .nodes = 4, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options = {{.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleVerifier},
                    {.roles = ledger::kRoleWhistleblower}};
  o.tweak_genesis = VerifyingChain();
  o.tweak_params = [](ledger::TaskParams& p) { p.verification_window_blocks = 30; };
  o.agent_options = [](int i, AgentOptions& a) {
    if (i == 0) a.adversary = Adversary::kWrongData;
    if (i == 2) a.adversary = Adversary::kRubberStamp;
    if (i == 3) a.whistleblower_sample = 1.0;
  };
  o.on_block = [&](uint64_t) {
    const json t = simp->Task(true);
    for (const json& u : t.value("units", json::array())) {
      if (u.contains("check") && u["check"].is_object() && u["check"].contains("merits_deadline")) {
        window_seen = true;
      }
    }
  };
  SimHarness sim(o);
  simp = &sim;
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(600);
  ASSERT_TRUE(run.ok()) << run.ToString();
  EXPECT_GT(sim.agent(3)->stats().challenges, 0u);
  EXPECT_TRUE(window_seen) << "the solver never fell silent in a whistleblower's dispute";
  EXPECT_GT(sim.agent(3)->stats().merits_shown, 0u);
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  EXPECT_GT(Slashes(sim, 2), 0u) << "the rubber stamp, slashed only on the merits";
  ExpectNeverSlashed(sim, {1, 3});
  ExpectFinalModelIsHonest(sim, f);
  EXPECT_TRUE(sim.Totals().Check().ok());
}

// The same silent wrong_data solver, but the whistleblower that challenged stalls through the
// merits window (a crash, or an accomplice keeping them back). Another checker shows them: node 4,
// a whistleblower that re-checks nothing itself (sample 0), sees the window in its node_work (role
// "merits"), replays the disputed segment from the solver's checkpoint, and sends ProveMerits. The
// rubber stamp is slashed with the cheat, as when the challenger shows them; the prover is paid
// the jackpot's share of the solver's slash.
TEST(VerificationSimTest, AnotherCheckerShowsTheMeritsTheChallengerKeptBack) {
  VerifyFixture f(71, /*rounds=*/1, /*units=*/2, /*H=*/4, /*k=*/2);
  SimHarness* simp = nullptr;
  bool window_seen = false;
  SimOptions o{.seed = 71, .nodes = 5, .task_toml = f.toml, .log = SimLog(), .env = &f.env};
  o.node_options = {{.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleSolver | ledger::kRoleAggregator},
                    {.roles = ledger::kRoleVerifier},
                    {.roles = ledger::kRoleWhistleblower},
                    {.roles = ledger::kRoleWhistleblower}};
  o.tweak_genesis = VerifyingChain();
  o.tweak_params = [](ledger::TaskParams& p) { p.verification_window_blocks = 30; };
  o.agent_options = [](int i, AgentOptions& a) {
    if (i == 0) a.adversary = Adversary::kWrongData;
    if (i == 2) a.adversary = Adversary::kRubberStamp;
    if (i == 3) a.whistleblower_sample = 1.0;
    if (i == 4) a.whistleblower_sample = 0.0;
  };
  // Asked after each block is produced, before the agents tick: node 3 sits out from the block
  // that opens the window.
  o.skip_tick = [&](int node) {
    if (node != 3) return false;
    const json t = simp->Task(true);
    for (const json& u : t.value("units", json::array())) {
      if (u.contains("check") && u["check"].is_object() && u["check"].contains("merits_deadline")) {
        window_seen = true;
        return true;
      }
    }
    return false;
  };
  SimHarness sim(o);
  simp = &sim;
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(600);
  ASSERT_TRUE(run.ok()) << run.ToString();
  EXPECT_GT(sim.agent(3)->stats().challenges, 0u);
  EXPECT_TRUE(window_seen) << "the solver never fell silent in a whistleblower's dispute";
  EXPECT_EQ(sim.agent(3)->stats().merits_shown, 0u);
  EXPECT_EQ(sim.agent(4)->stats().challenges, 0u);
  EXPECT_GT(sim.agent(4)->stats().merits_shown, 0u);
  EXPECT_GE(Tally(sim, "fraud"), 1u);
  EXPECT_GT(Slashes(sim, 0), 0u);
  EXPECT_GT(Slashes(sim, 2), 0u) << "the rubber stamp, slashed only on the merits";
  EXPECT_GT(Node(sim, 4)["earnings"].value("jackpot", uint64_t{0}), 0u);
  ExpectNeverSlashed(sim, {1, 3, 4});
  ExpectFinalModelIsHonest(sim, f);
  EXPECT_TRUE(sim.Totals().Check().ok());
}

}  // namespace
}  // namespace meshlearn::node

// What a submitter's assurance level buys against a node that wants to change the model rather
// than save compute (issue 19; docs/verification.md, "Assurance" and "Taint"): whole networks in
// one process, a poisoner among honest solvers, verification on with the chain's default of one
// segment replayed per check.
//
//   full      every segment of every unit is replayed: every poisoner is caught, slashed, never
//             paid, and the final model is the honest reference, seed after seed;
//   economic  a checked unit replays 1 of its S segments, so one perturbed segment is caught
//             with probability 1/S per checked unit; when the poisoner is caught, taint takes
//             the task back to the first round it touched, so the final model holds none of its
//             work; the measured catch rate per checked unit matches 1 - SegmentEscapePpm.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "meshlearn/node/adversary.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/protocol/verification.h"
#include "testing/verification_sim.h"

namespace meshlearn::node {
namespace {

using testing::CheckLog;
using testing::SimHarness;
using testing::SimOptions;
using testing::VerifyFixture;

constexpr uint32_t kH = 8, kK = 2;  // 4 segments a unit
constexpr uint32_t kSegments = kH / kK;

// A verifying chain with the default sampling: one segment per check, no forced errors.
void SampledChain(ledger::Genesis& g) {
  g.params.verification = true;
  g.params.forced_error_per_million = 0;
  g.params.verifiers_per_unit = 1;
}

struct Outcome {
  bool caught = false;          // the poisoner was slashed
  bool reference = false;       // the final model is the honest reference
  bool paid = false;            // a unit of the poisoner's is paid in the final record
  uint64_t clean = 0, disputed = 0;  // the poisoner's checks: passed, caught
  uint64_t rounds_rewound = 0;
};

// One task: 3 rounds x 3 units over 3 solvers, node 0 the poisoner, two more verifiers.
Outcome RunTask(uint64_t seed, Adversary adv, const std::string& assurance) {
  VerifyFixture f(seed, /*rounds=*/3, /*units=*/3, kH, kK);
  const std::string table = "[network]\n";
  const size_t at = f.toml.find(table);
  EXPECT_NE(at, std::string::npos);
  f.toml.insert(at + table.size(), "assurance = \"" + assurance + "\"\n");
  SimHarness* simp = nullptr;
  CheckLog checks;
  SimOptions o{.seed = seed, .nodes = 5, .task_toml = f.toml, .log = testing::SimLog(),
               .env = &f.env};
  o.node_options = {{.roles = testing::kAllRoles},
                    {.roles = testing::kAllRoles},
                    {.roles = testing::kAllRoles},
                    {.roles = ledger::kRoleVerifier},
                    {.roles = ledger::kRoleVerifier}};
  o.tweak_genesis = SampledChain;
  o.agent_options = [adv](int i, AgentOptions& a) {
    if (i == 0) a.adversary = adv;
  };
  o.on_block = [&](uint64_t) { checks.Scan(*simp); };
  SimHarness sim(o);
  simp = &sim;
  Outcome out;
  Status setup = sim.Setup();
  EXPECT_TRUE(setup.ok()) << setup.ToString();
  if (!setup.ok()) return out;
  Status run = sim.RunUntilFinished(1500);
  EXPECT_TRUE(run.ok()) << "seed " << seed << ": " << run.ToString();
  if (!run.ok()) return out;
  const std::string poisoner = sim.node_key(0).public_key().ToHex();
  out.caught = testing::Slashes(sim, 0) > 0;
  out.clean = checks.Count(poisoner, "clean");
  out.disputed = checks.Count(poisoner, "disputed");
  out.rounds_rewound = testing::Tally(sim, "rounds_rewound");
  const nlohmann::json task = sim.Task(true);  // kept: the loop below reads into it
  for (const nlohmann::json& u : task["units"]) {
    out.paid |= u.value("assignee", std::string()) == poisoner && u.value("paid", uint64_t{0}) > 0;
  }
  testing::ExpectNeverSlashed(sim, {1, 2, 3, 4});
  EXPECT_TRUE(sim.Totals().Check().ok());
  Result<GlobalState> st = sim.FinalState();
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  out.reference =
      st.ok() && HashFloats(st->weights) == HashFloats(LocalReference(&f.env, f.toml));
  return out;
}

std::string Name(Adversary a) { return std::string(AdversaryName(a)); }

// Full assurance: every poisoner, every seed, caught and unpaid; the model is the honest one.
TEST(AssuranceSimTest, FullCatchesEveryPoisonerAndKeepsTheModelHonest) {
  for (Adversary adv : {Adversary::kNoisy, Adversary::kNoisyLast, Adversary::kTargeted}) {
    for (uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE(Name(adv) + " seed " + std::to_string(seed));
      const Outcome o = RunTask(seed, adv, "full");
      EXPECT_TRUE(o.caught);
      EXPECT_FALSE(o.paid);
      // noisy_last is honest before the last round: its earlier units pass, rightly.
      if (adv != Adversary::kNoisyLast) {
        EXPECT_EQ(o.clean, 0u) << "a poisoned unit passed";
      }
      EXPECT_TRUE(o.reference);
    }
  }
}

// Economic assurance: one segment of four replayed per checked unit (the poisoner is new, so
// every unit of it is checked). Whenever it is caught, taint removes all its work: the model
// is the reference. Its units escape their checks at the rate the quote prints.
TEST(AssuranceSimTest, EconomicCatchesAtThePrintedRateAndTaintKeepsACaughtPoisonerOut) {
  protocol::VerificationParams vp;  // the chain's defaults: one segment a check
  const protocol::CheckPlan plan =
      protocol::PlanCheck(protocol::AssuranceLevel{}, protocol::Reputation{}, kSegments, vp);
  const double printed_escape = protocol::SegmentEscapePpm(plan, kSegments) / 1e6;  // 0.75
  uint64_t clean = 0, disputed = 0, caught = 0, rewound = 0, tasks = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Outcome o = RunTask(seed, Adversary::kNoisy, "economic");
    ++tasks;
    clean += o.clean;
    disputed += o.disputed;
    caught += o.caught;
    rewound += o.rounds_rewound;
    if (o.caught) {
      EXPECT_TRUE(o.reference) << "a caught poisoner's work stayed in the model";
      EXPECT_FALSE(o.paid);
    } else if (o.clean > 0) {
      EXPECT_FALSE(o.reference) << "the poisoner's units escaped yet the model is the reference";
    }
  }
  const double n = static_cast<double>(clean + disputed);
  const double escape = n == 0 ? 0 : static_cast<double>(clean) / n;
  const double sigma = std::sqrt(printed_escape * (1 - printed_escape) / std::max(n, 1.0));
  std::cout << "economic, one perturbed segment of " << kSegments << ": " << tasks << " tasks, "
            << caught << " poisoners caught, " << rewound << " tainted rounds re-run; checked "
            << "units " << n << ", escaped " << clean << " = " << escape << " (printed "
            << printed_escape << ", sigma " << sigma << ")" << std::endl;
  EXPECT_GT(rewound, 0u) << "no seed caught the poisoner after a unit of it had passed";
  EXPECT_NEAR(escape, printed_escape, 4 * sigma);
}

}  // namespace
}  // namespace meshlearn::node

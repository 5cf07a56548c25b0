// Helpers shared by the verification tests that run a whole network in one process
// (verification_sim_test.cc, result_proof_sim_test.cc): a tiny synthetic task, a chain with
// verification on, and what the tests read back from the ledger.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/unit_executor.h"
#include "testing/diloco_task.h"
#include "testing/sim_harness.h"
#include "testing/synthetic_task.h"

namespace meshlearn::node::testing {

using nlohmann::json;

// MESHLEARN_SIM_LOG=1 prints every agent's log (and the referee's) to stderr.
inline bool SimLog() { return std::getenv("MESHLEARN_SIM_LOG") != nullptr; }

inline constexpr uint32_t kAllRoles =
    ledger::kRoleSolver | ledger::kRoleAggregator | ledger::kRoleVerifier;

// A tiny synthetic task (H steps, a checkpoint every k), and a chain with verification on where
// every segment of a checked unit is replayed (so a cheat in any segment is caught) and, unless
// a test asks for them, no forced errors.
struct VerifyFixture {
  MemEnv env;
  std::string toml;
  VerifyFixture(uint64_t seed, uint32_t rounds, uint32_t units, uint32_t h, uint32_t k) {
    Result<std::string> t =
        WriteSyntheticTask(&env, "/data", seed, 480, 160, 32, 4, rounds, units, h, k);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    toml = *t;
  }
};

inline std::function<void(ledger::Genesis&)> VerifyingChain(uint32_t forced_per_million = 0,
                                                     uint32_t verifiers_per_unit = 1) {
  return [=](ledger::Genesis& g) {
    g.params.verification = true;
    g.params.verify_segments_per_check = 64;
    g.params.forced_error_per_million = forced_per_million;
    g.params.verifiers_per_unit = verifiers_per_unit;
  };
}

inline json Node(SimHarness& sim, int i) {
  return sim.Call("get_node", {{"id", sim.node_key(i).public_key().ToHex()}});
}
inline uint64_t Slashes(SimHarness& sim, int i) {
  return Node(sim, i)["reputation"].value("slashes", uint64_t{0});
}

// Invariant of every test here: an honest node never loses stake.
inline void ExpectNeverSlashed(SimHarness& sim, const std::vector<int>& honest) {
  for (int i : honest) {
    json n = Node(sim, i);
    EXPECT_EQ(n["reputation"].value("slashes", uint64_t{1}), 0u) << "honest node " << i << ": "
                                                                 << n.dump();
    EXPECT_EQ(n.value("stake", uint64_t{0}),
              sim.genesis().params.MinStakeFor(n.value("roles", 0u)))
        << "honest node " << i << ": " << n.dump();
  }
}

// The task's verification tally on the ledger (get_task "verification").
inline uint64_t Tally(SimHarness& sim, const char* what) {
  return sim.Task(false)["verification"].value(what, uint64_t{0});
}

// Every check outcome seen on the ledger while the test ran, by solver, via on_block. A check
// settled as fraud is not seen: the same block re-runs the round, which clears it; its dispute
// (stage "disputed") is.
struct CheckLog {
  std::map<std::string, std::multiset<std::string>> results;  // solver hex -> results
  std::set<std::string> seen;                                 // index/commit_height/result
  void Scan(SimHarness& sim) {
    json t = sim.Task(true);
    if (!t.contains("units")) return;
    for (const json& u : t["units"]) {
      if (!u.contains("check") || !u["check"].is_object()) continue;
      const json& c = u["check"];
      const std::string stage = c.value("stage", std::string());
      if (stage == "disputed") {
        const std::string key = std::to_string(u.value("index", 0u)) + "/" +
                                std::to_string(c.value("commit_height", uint64_t{0})) + "/disputed";
        if (seen.insert(key).second) results[c.value("solver", std::string())].insert("disputed");
      }
      if (stage != "settled") continue;
      const std::string key = std::to_string(u.value("index", 0u)) + "/" +
                              std::to_string(c.value("commit_height", uint64_t{0})) + "/" +
                              c.value("result", std::string());
      if (!seen.insert(key).second) continue;
      results[c.value("solver", std::string())].insert(c.value("result", std::string()));
    }
  }
  size_t Count(const std::string& solver, const std::string& result) const {
    auto it = results.find(solver);
    return it == results.end() ? 0 : it->second.count(result);
  }
};

// The operator and tile a RefereeTile ruling's reason names ("referee recomputed tile T of
// operator J of step S: ..."; a ruling of get_task's verification.rulings): {J, T} (J 1-based:
// the plan's operator J - 1), or nothing.
inline std::optional<std::pair<uint32_t, uint64_t>> RuledTile(const json& ruling) {
  static const std::regex kTile(R"(referee recomputed tile (\d+) of operator (\d+) of step \d+)");
  std::smatch m;
  const std::string reason = ruling.value("reason", std::string());
  if (!std::regex_search(reason, m, kTile)) return std::nullopt;
  return std::make_pair(static_cast<uint32_t>(std::stoul(m[2])), std::stoull(m[1]));
}

// The task's final weights are the honest in-process run's, bit for bit: a cheater's work never
// reached the model.
inline void ExpectFinalModelIsHonest(SimHarness& sim, VerifyFixture& f) {
  Result<GlobalState> st = sim.FinalState();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(HashFloats(st->weights), HashFloats(LocalReference(&f.env, f.toml)));
}

}  // namespace meshlearn::node::testing

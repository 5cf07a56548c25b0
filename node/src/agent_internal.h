// Pieces of NodeAgent shared by its source files (agent.cc, agent_verification.cc); not a public
// header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/node/agent.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/task_bundle.h"

namespace meshlearn::node {

// A task the node works on: its bundle, trainer and facts, loaded once.
struct NodeAgent::TaskContext {
  Hash256 id;
  TaskInfo info;
  LoadedBundle bundle;
  std::unique_ptr<engine::Trainer> trainer;
  TaskFacts facts;
  uint64_t memory_need = 0;
  // The tree over the training examples, built when a step witness is first needed.
  std::unique_ptr<engine::DataTree> data_tree;
};

struct NodeAgent::VerifyJob {
  enum class Kind { kVerdict, kDispute, kWhistle, kWitness };
  Kind kind = Kind::kVerdict;
  const CheckAssignment* check = nullptr;
  uint64_t deadline = 0;
};

// What replaying some segments of a checked unit found.
struct NodeAgent::SegmentFinding {
  std::vector<Hash256> leaves;  // the solver's committed leaves (checked against its commitment)
  bool mismatch = false;
  uint32_t segment = 0;  // the first segment whose replay ends elsewhere than its committed leaf
  Hash256 start;         // committed leaves around it
  Hash256 solver_end;
  Hash256 replayed_end;  // where the replay ended
  // The solver's checkpoint the replay of `segment` started from (checked against its leaf);
  // empty: the replay started from the unit's start.
  std::string checkpoint;
  // Result binding: what the result check found; when kWrong, the committed final state is
  // saved in the check's directory (final.safetensors) for ProveResult.
  ResultCheck result = ResultCheck::kNotShown;
};

namespace agent_internal {

inline std::string TaskShort(const Hash256& t) { return t.ShortHex(); }
// PinBook reasons (agent.h, "Blobs the node keeps").
inline std::string StateReason(const Hash256& t) { return "state:" + t.ToHex(); }

inline Result<nlohmann::json> ReadJson(Env* env, const std::string& path) {
  ML_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(path + " is not a JSON object");
  return j;
}

}  // namespace agent_internal
}  // namespace meshlearn::node

// The solver's secret chain (secret_chain.h) of the node's current registration (not a public
// header): its epoch is journaled in <data_dir>/secret_chain.json (records.h SecretEpoch), and the
// chain is derived from the node key and the epoch, so a restarted node has the same secrets.
// Every (re-)registration starts a new epoch, whose head goes in RegisterNode.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "meshlearn/node/secret_chain.h"
#include "node_context.h"

namespace meshlearn::node {

class SolverSecrets {
 public:
  explicit SolverSecrets(NodeContext* node) : node_(node) {}

  // The chain of the journaled epoch (once); NotFound when the node has none (it registered
  // from another data dir).
  Status Load();
  // A new epoch, journaled; returns its head.
  Result<Hash256> NewEpoch();
  // Logs loudly when the ledger's anchor is not on this chain (the node cannot reveal).
  void Check(const NodeInfo& record);
  // REQUIRES: Load() or NewEpoch() succeeded.
  Hash256 Element(uint64_t index) const;

 private:
  NodeContext* node_;
  std::shared_ptr<const SecretChain> chain_;  // SecretChain::Shared
};

// Where the Stager keeps the forced step commits of a stage unit it committed with secret
// `secret_index` drawn for a forced error (protocol::EncodeStageStepCommits), for the Solver's
// RevealSecret of that secret (RevealSecretTx::forced_commits). By secret, so that a unit re-run
// and not drawn again reveals none. The file goes with the unit's directory (PinKeeper: once the
// unit's round is final, or the task released).
std::string ForcedStageCommitsPath(const NodeContext& node, const Hash256& task, uint32_t index,
                                   uint64_t secret_index);

}  // namespace meshlearn::node

#include "secrets.h"

#include "journal.h"
#include "meshlearn/protocol/verification.h"
#include "records.h"

namespace meshlearn::node {

namespace {

// The epoch journaled in `path`; a file of the format before journals ({"epoch": N}, written by
// nodes of an earlier version) is read too, so an upgraded node keeps its secrets.
Result<uint64_t> ReadEpoch(Env* env, const std::string& path) {
  Result<journal::SecretEpoch> e = journal::ReadJournal<journal::SecretEpoch>(env, path);
  if (e.ok()) return e->epoch;
  ML_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.size() == 1 && j.contains("epoch") && j["epoch"].is_number_unsigned()) {
    return j["epoch"].get<uint64_t>();
  }
  return e.status();
}

}  // namespace

Status SolverSecrets::Load() {
  if (chain_) return Status::Ok();
  const std::string path = JoinPath(node_->options().data_dir, "secret_chain.json");
  if (!node_->env()->FileExists(path)) {
    return NotFound(path +
                    " does not exist: this node has no secret chain (it registered from "
                    "another data dir?); leave and rejoin (`meshlearn node run --rejoin`)");
  }
  ML_ASSIGN_OR_RETURN(uint64_t epoch, ReadEpoch(node_->env(), path));
  chain_ = SecretChain::Shared(SecretChainSeed(node_->key().seed(), epoch));
  return Status::Ok();
}

Result<Hash256> SolverSecrets::NewEpoch() {
  Env* env = node_->env();
  const std::string path = JoinPath(node_->options().data_dir, "secret_chain.json");
  journal::SecretEpoch e;
  if (env->FileExists(path)) {
    ML_ASSIGN_OR_RETURN(e.epoch, ReadEpoch(env, path));
  }
  ++e.epoch;
  ML_RETURN_IF_ERROR(env->CreateDirs(node_->options().data_dir, 0700));
  ML_RETURN_IF_ERROR(env->WriteFileAtomic(path, journal::EncodeJournal(e), 0600));
  chain_ = SecretChain::Shared(SecretChainSeed(node_->key().seed(), e.epoch));
  return chain_->head();
}

void SolverSecrets::Check(const NodeInfo& record) {
  if (!node_->VerificationOn() || (node_->options().roles & ledger::kRoleSolver) == 0) return;
  const Hash256& anchor = record.secret_anchor;
  const uint64_t index = record.secret_anchor_index;
  if (anchor.IsZero()) return;  // registered without a chain
  Status loaded = Load();
  if (loaded.ok() && index <= protocol::kSecretChainLength && chain_->Element(index) == anchor) {
    return;
  }
  node_->Log("!!! node " + node_->id().ShortHex() + ": the secret chain in " +
             node_->options().data_dir + " is not the one registered on the ledger (" +
             (loaded.ok() ? std::string("another epoch") : loaded.message()) +
             "). It cannot reveal its units' secrets, so the ledger treats its units as "
             "abandoned. Leave and rejoin (meshlearn node leave; meshlearn node run --rejoin) "
             "to register a new chain !!!");
}

Hash256 SolverSecrets::Element(uint64_t index) const { return chain_->Element(index); }

std::string ForcedStageCommitsPath(const NodeContext& node, const Hash256& task, uint32_t index,
                                   uint64_t secret_index) {
  return JoinPath(node.UnitDir(task, index), "forced-" + std::to_string(secret_index) + ".commits");
}

}  // namespace meshlearn::node

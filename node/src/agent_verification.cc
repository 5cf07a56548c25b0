// NodeAgent's verification roles (agent.h, "Verification"; docs/verification.md): the solver's
// secrets, forced errors, served leaves and dispute defence; the verifier's replays and
// commit-reveal verdicts; the whistleblower's re-checks and challenges; dispute moves.
//
// Files, all written atomically:
//   <data_dir>/secret_chain.json              {"epoch"}: the secret chain of this registration
//   <data_dir>/units/<T>-<i>/done.json         the unit's result and its true leaves (agent.cc)
//   <data_dir>/units/<T>-<i>/commit.json       what the last CommitUnit committed: secret index,
//                                              forced or not, commitment, the leaves served
//   <data_dir>/verify/<T>-<i>-<h>/             one check (unit i of task T committed at height h):
//       verdict.json / challenge.json          the verdict, salt and claim (so a restarted node
//                                              can still reveal), where the replay started
//       ckpt-<step>.safetensors                the solver's checkpoint the replay started from
//                                              (and its final state, for the result check)
//       final.safetensors                      the committed final state, when its result is
//                                              wrong (the ProveResult witness)
//       dispute-<first>-<last>.json            the state hash after every step of a disputed
//                                              segment
// A check's directory is deleted once node_work no longer lists the check.
#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "agent_internal.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/agent.h"
#include "meshlearn/node/referee.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/step_witness.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/draw.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::node {

using agent_internal::ReadJson;
using protocol::CheckStage;
using agent_internal::StateReason;
using agent_internal::TaskShort;
using nlohmann::json;

namespace {

constexpr int kMaxVerifyAttempts = 3;

json HexList(const std::vector<Hash256>& v) {
  json out = json::array();
  for (const Hash256& h : v) out.push_back(h.ToHex());
  return out;
}

Result<std::vector<Hash256>> HashList(const json& j, const char* what) {
  if (!j.is_array()) return DataLoss(std::string(what) + " is not a list of hashes");
  std::vector<Hash256> out;
  for (const json& h : j) {
    if (!h.is_string()) return DataLoss(std::string(what) + " holds a non-string");
    ML_ASSIGN_OR_RETURN(Hash256 v, Hash256::FromHex(h.get<std::string>(), what));
    out.push_back(v);
  }
  return out;
}

Result<Hash256> HashAt(const json& j, const char* key) {
  return Hash256::FromHex(j.value(key, std::string()), key);
}

ledger::MerkleProofField ProofField(const std::vector<Hash256>& leaves, uint64_t index) {
  MerkleProof p = MerkleProve(leaves, index);
  return ledger::MerkleProofField{
      .index = p.index, .leaf_count = p.leaf_count, .siblings = std::move(p.siblings)};
}

// The claim of a verdict or challenge record (verdict.json / challenge.json).
Result<ledger::MismatchClaimField> ClaimOf(const json& v) {
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> leaves, HashList(v.value("leaves", json()), "leaves"));
  const uint32_t seg = v.value("segment", 0u);
  if (seg + 1ull >= leaves.size()) return DataLoss("the claim's segment is out of range");
  ledger::MismatchClaimField c;
  c.segment = seg;
  c.start = leaves[seg];
  c.start_proof = ProofField(leaves, seg);
  c.solver_end = leaves[seg + 1];
  c.end_proof = ProofField(leaves, seg + 1);
  ML_ASSIGN_OR_RETURN(c.replayed_end, HashAt(v, "replayed_end"));
  return c;
}

std::string Name(const CheckAssignment& c) {
  return "check " + TaskShort(c.task_id) + "/" + std::to_string(c.index) + " r" +
         std::to_string(c.round) + " s" + std::to_string(c.shard);
}

using Kind = VerifyAction::Kind;

VerifyAction Action(Kind kind, const std::string& dir, std::vector<uint64_t> detail = {}) {
  return VerifyAction{.dir = dir, .kind = kind, .detail = std::move(detail)};
}

// The file in the check's directory that says an action's transaction was sent: after a restart
// the outbox resends it if it is still in flight, so it must not be sent again.
// "sent-<kind>[-<detail>_<detail>...]".
std::string MarkerOf(const VerifyAction& action) {
  std::string name = "sent-" + std::string(VerifyActionKindName(action.kind));
  for (size_t i = 0; i < action.detail.size(); ++i) {
    name += (i == 0 ? "-" : "_") + std::to_string(action.detail[i]);
  }
  return JoinPath(action.dir, name);
}

}  // namespace

std::string_view VerifyActionKindName(VerifyAction::Kind k) {
  switch (k) {
    case Kind::kSecret: return "secret";
    case Kind::kCommit: return "commit";
    case Kind::kReveal: return "reveal";
    case Kind::kChallenge: return "challenge";
    case Kind::kWitness: return "witness";
    case Kind::kProve: return "prove";
    case Kind::kPost: return "post";
  }
  return "unknown";
}

// ---- Chain parameters and secrets ------------------------------------------------------------

Result<const ledger::ChainParams*> NodeAgent::GenesisParams() {
  if (!params_) {
    ML_ASSIGN_OR_RETURN(ledger::Genesis genesis, GetGenesis(*deps_.chain));
    params_ = genesis.params;
  }
  return &*params_;
}

bool NodeAgent::VerificationOn() { return params_ && params_->verification; }

Status NodeAgent::LoadSecretChain() {
  if (secrets_) return Status::Ok();
  const std::string path = JoinPath(options_.data_dir, "secret_chain.json");
  if (!deps_.env->FileExists(path)) {
    return NotFound(path + " does not exist: this node has no secret chain (it registered from "
                    "another data dir?); leave and rejoin (`meshlearn node run --rejoin`)");
  }
  ML_ASSIGN_OR_RETURN(json j, ReadJson(deps_.env, path));
  secret_epoch_ = j.value("epoch", uint64_t{0});
  secrets_ = std::make_unique<SecretChain>(SecretChainSeed(deps_.key.seed(), secret_epoch_));
  return Status::Ok();
}

Status NodeAgent::NewSecretEpoch() {
  const std::string path = JoinPath(options_.data_dir, "secret_chain.json");
  uint64_t epoch = 0;
  if (deps_.env->FileExists(path)) {
    ML_ASSIGN_OR_RETURN(json j, ReadJson(deps_.env, path));
    epoch = j.value("epoch", uint64_t{0});
  }
  ++epoch;
  ML_RETURN_IF_ERROR(deps_.env->CreateDirs(options_.data_dir, 0700));
  ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(path, json{{"epoch", epoch}}.dump(), 0600));
  secret_epoch_ = epoch;
  secrets_ = std::make_unique<SecretChain>(SecretChainSeed(deps_.key.seed(), epoch));
  secret_chain_checked_ = false;
  return Status::Ok();
}

void NodeAgent::CheckSecretChain(const NodeInfo& record) {
  secret_chain_checked_ = true;
  if (!VerificationOn() || (options_.roles & ledger::kRoleSolver) == 0) return;
  const Hash256& anchor = record.secret_anchor;
  const uint64_t index = record.secret_anchor_index;
  if (anchor.IsZero()) return;  // registered without a chain
  Status loaded = LoadSecretChain();
  if (loaded.ok() && index <= protocol::kSecretChainLength && secrets_->Element(index) == anchor) {
    return;
  }
  Log("!!! node " + id().ShortHex() + ": the secret chain in " + options_.data_dir +
      " is not the one registered on the ledger (" +
      (loaded.ok() ? std::string("another epoch") : loaded.message()) +
      "). It cannot reveal its units' secrets, so the ledger treats its units as abandoned. "
      "Leave and rejoin (meshlearn node leave; meshlearn node run --rejoin) to register a new "
      "chain !!!");
}

UnitWork NodeAgent::WorkOf(const TaskContext& ctx, uint32_t round, uint32_t shard) const {
  return protocol::UnitWorkOf(ctx.bundle.net, ctx.facts, round, shard);
}

// ---- Solver ----------------------------------------------------------------------------------

Status NodeAgent::SendCommit(const UnitAssignment& a, const json& done) {
  const std::string dir = UnitDir(a.task_id, a.index);
  ML_ASSIGN_OR_RETURN(Hash256 result, HashAt(done, "result"));
  ML_ASSIGN_OR_RETURN(Hash256 commitment, HashAt(done, "commitment"));
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> leaves, HashList(done.value("leaves", json()), "leaves"));
  if (leaves.empty()) return DataLoss(dir + "/done.json has no leaves");
  std::vector<Hash256> served = leaves;
  uint64_t secret_index = 0;
  bool forced = false;
  if (VerificationOn()) {
    ML_RETURN_IF_ERROR(LoadSecretChain());
    if (next_secret_index_ == 0) {
      return FailedPrecondition("the ledger's node_work gives no next_secret_index");
    }
    // The ledger binds the node's next secret to every commit, in order: ours in flight come
    // first.
    secret_index = next_secret_index_ + unit_commits_.size();
    if (secret_index > protocol::kSecretChainLength) {
      return FailedPrecondition("this node used all " +
                                std::to_string(protocol::kSecretChainLength) +
                                " secrets of its chain; leave and rejoin to register a new one");
    }
    const Hash256 secret = secrets_->Element(secret_index);
    const protocol::UnitId uid{a.task_id, a.round, a.shard};
    if (protocol::IsForcedError(secret, a.assignment_beacon, uid,
                                params_->forced_error_per_million)) {
      // Truebit: a deliberately wrong commitment that honest verifiers must catch. The delta
      // stays honest; the true start leaf lets anyone check, once the secret is out, that the
      // error was the forced one.
      forced = true;
      commitment = protocol::ForcedCommitment(secret, uid, leaves[0], leaves.size());
      for (uint64_t i = 1; i < served.size(); ++i) served[i] = protocol::ForcedLeaf(secret, uid, i);
      ++stats_.forced_errors;
      Log("unit " + TaskShort(a.task_id) + "/" + std::to_string(a.index) +
          ": drawn for a forced error (secret " + std::to_string(secret_index) +
          "); committing the forced commitment");
    }
  }
  json commit = {{"secret_index", secret_index}, {"forced", forced},
                 {"commitment", commitment.ToHex()}, {"leaves", HexList(served)}};
  ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(JoinPath(dir, "commit.json"), commit.dump()));
  ML_RETURN_IF_ERROR(PublishCommitted(a.task_id, a.index, commit));
  ML_ASSIGN_OR_RETURN(Hash256 txid,
                      tx_->Send(ledger::CommitUnitTx{.task_id = a.task_id,
                                                     .index = a.index,
                                                     .node_id = id(),
                                                     .result_hash = result,
                                                     .commitment = commitment,
                                                     .loss_micros = done.value("loss_micros", uint64_t{0}),
                                                     .secret_index = secret_index,
                                                     .leaves = served}));
  unit_commits_[std::make_pair(a.task_id, a.index)] = txid;
  return Status::Ok();
}

Status NodeAgent::PublishCommitted(const Hash256& task, uint32_t index, const json& commit) {
  UnitManifest m;
  m.task_id = task;
  m.index = index;
  ML_ASSIGN_OR_RETURN(m.leaves, HashList(commit.value("leaves", json()), "leaves"));
  std::vector<std::string> paths;
  // A forced unit serves no checkpoint: none hashes to a forced leaf.
  if (!commit.value("forced", false)) {
    const std::string dir = UnitDir(task, index);
    Result<std::vector<std::string>> names = deps_.env->ListDir(dir);
    if (names.ok()) {
      for (const std::string& n : *names) {
        if (!n.starts_with("ckpt-") || !n.ends_with(".safetensors")) continue;
        const int64_t step = std::strtoll(n.c_str() + 5, nullptr, 10);
        Result<uint64_t> size = deps_.env->FileSize(JoinPath(dir, n));
        if (step <= 0 || !size.ok()) continue;
        m.checkpoints.push_back({.step = step, .size = *size});
        paths.push_back(JoinPath(dir, n));
      }
    }
  }
  unit_service_->Publish(std::move(m), std::move(paths));
  return Status::Ok();
}

void NodeAgent::RevealSecret(const CheckAssignment& c) {
  const VerifyAction action =
      Action(Kind::kSecret, VerifyDir(c), {c.secret_index});
  if (verify_sent_.count(action) || c.secret_index == 0 ||
      c.secret_index > protocol::kSecretChainLength) {
    return;
  }
  if (Status s = LoadSecretChain(); !s.ok()) {
    if (!verify_failed_.count(action)) Log(Name(c) + ": cannot reveal the secret: " + s.message());
    verify_failed_[action] = kMaxVerifyAttempts;
    return;
  }
  // The true state hash after step 0: the ledger checks a forced unit's commitment with it.
  Hash256 start_leaf;
  const std::string dir = UnitDir(c.task_id, c.index);
  for (const char* file : {"commit.json", "done.json"}) {
    Result<json> j = ReadJson(deps_.env, JoinPath(dir, file));
    if (!j.ok()) continue;
    Result<std::vector<Hash256>> leaves = HashList(j->value("leaves", json()), "leaves");
    if (leaves.ok() && !leaves->empty()) {
      start_leaf = leaves->front();
      break;
    }
  }
  if (SendVerifyTx(action, ledger::RevealSecretTx{.task_id = c.task_id,
                                                  .index = c.index,
                                                  .node_id = id(),
                                                  .secret = secrets_->Element(c.secret_index),
                                                  .start_leaf = start_leaf})) {
    ++stats_.secrets_revealed;
  }
}

// ---- Per tick --------------------------------------------------------------------------------

std::string NodeAgent::VerifyDir(const CheckAssignment& c) const {
  return JoinPath(JoinPath(options_.data_dir, "verify"), c.task_id.ToHex() + "-" +
                                                             std::to_string(c.index) + "-" +
                                                             std::to_string(c.commit_height));
}

bool NodeAgent::VerifyActionDone(const VerifyAction& action) const {
  if (verify_sent_.count(action)) return true;
  auto failed = verify_failed_.find(action);
  return failed != verify_failed_.end() && failed->second >= kMaxVerifyAttempts;
}

bool NodeAgent::SendVerifyTx(const VerifyAction& action, ledger::TxPayload payload) {
  if (VerifyActionDone(action)) return false;
  const std::string marker = MarkerOf(action);
  if (deps_.env->FileExists(marker)) {  // sent before a restart
    verify_sent_.insert(action);
    return false;
  }
  const std::string type(ledger::TxTypeName(ledger::PayloadType(payload)));
  Result<Hash256> txid = tx_->Send(std::move(payload));
  if (!txid.ok()) {
    Log(type + " not sent: " + txid.status().message());
    ++verify_failed_[action];
    return false;
  }
  verify_sent_.insert(action);
  verify_txs_[*txid] = action;
  // Best effort: without the marker a restarted node sends it again, which the ledger refuses.
  const std::string dir = marker.substr(0, marker.rfind('/'));
  if (deps_.env->CreateDirs(dir).ok()) (void)deps_.env->WriteFileAtomic(marker, "");
  return true;
}

void NodeAgent::VerifyTxFailed(const VerifyAction& action) {
  verify_sent_.erase(action);  // may be sent again (SendVerifyTx caps the attempts)
  ++verify_failed_[action];
  (void)deps_.env->DeleteFile(MarkerOf(action));
}

void NodeAgent::PlayVerification(const NodeWork& work, std::vector<VerifyJob>* urgent,
                                 std::vector<VerifyJob>* later) {
  std::set<std::string> live;
  for (const CheckAssignment& c : work.checks) {
    if (refused_tasks_.count(c.task_id)) continue;
    const std::string dir = VerifyDir(c);
    live.insert(dir);
    if (c.solver == id()) {
      if (!unit_service_->Serves(c.task_id, c.index)) {
        // After a restart: serve again what was committed.
        Result<json> commit = ReadJson(deps_.env, JoinPath(UnitDir(c.task_id, c.index), "commit.json"));
        if (commit.ok() && commit->value("commitment", std::string()) == c.commitment.ToHex()) {
          Status s = PublishCommitted(c.task_id, c.index, *commit);
          if (!s.ok()) Log(Name(c) + ": cannot serve the committed leaves: " + s.message());
        }
      }
      if (c.stage == CheckStage::kCheckRevealVerdicts) RevealSecret(c);
    }
    if (c.HasRole(CheckRole::kCheckRoleVerifier)) {
      const std::string path = JoinPath(dir, "verdict.json");
      const bool have = deps_.env->FileExists(path);
      if (c.stage == CheckStage::kCheckCommitVerdicts && !have) {
        urgent->push_back({VerifyJob::Kind::kVerdict, &c, c.deadline_height});
      } else if (c.stage == CheckStage::kCheckCommitVerdicts) {
        // Decided before a restart: the commitment may not have gone out (SendVerifyTx knows).
        Result<json> v = ReadJson(deps_.env, path);
        Result<Hash256> commitment = v.ok() ? HashAt(*v, "commitment") : Result<Hash256>(v.status());
        if (commitment.ok()) {
          SendVerifyTx(Action(Kind::kCommit, dir),
                       ledger::CommitVerdictTx{.task_id = c.task_id,
                                               .index = c.index,
                                               .node_id = id(),
                                               .commitment = *commitment});
        }
      } else if (c.stage == CheckStage::kCheckRevealVerdicts && have) {
        RevealVerdict(c);
      }
      if (have &&
          (c.stage == CheckStage::kCheckCommitVerdicts ||
           c.stage == CheckStage::kCheckRevealVerdicts) &&
          !verify_sent_.count(Action(Kind::kProve, dir))) {
        // A result found wrong before a restart: prove it (ProveResult sends it once).
        Result<json> v = ReadJson(deps_.env, path);
        if (v.ok() && v->value("result_wrong", false)) ProveResult(c);
      }
    }
    if (c.HasRole(CheckRole::kCheckRoleWhistleblower) && c.stage == CheckStage::kCheckSettled &&
        !whistle_seen_.count(dir)) {
      const double draw = protocol::WhistleSampleDraw(
          ByteSpan(deps_.key.seed().bytes.data(), deps_.key.seed().bytes.size()), c.task_id,
          c.index, c.commit_height);
      if (!CheatsAsVerifier(options_.adversary) && draw < options_.whistleblower_sample &&
          c.num_segments > 0) {
        later->push_back({VerifyJob::Kind::kWhistle, &c, UINT64_MAX});
      } else {
        whistle_seen_.insert(dir);
      }
    }
    if (c.dispute && c.dispute->has_query && c.dispute->stage == protocol::DisputeStage::kDisputeSteps &&
        (c.dispute->defender == id() || c.dispute->challenger == id())) {
      const std::string key = JoinPath(dir, "dispute-" + std::to_string(c.dispute->first_step) +
                                                "-" + std::to_string(c.dispute->last_step) +
                                                ".json");
      if (!dispute_hashes_.count(key)) {
        Result<json> d = ReadJson(deps_.env, key);
        Result<std::vector<Hash256>> h =
            d.ok() ? HashList(d->value("hashes", json()), "hashes")
                   : Result<std::vector<Hash256>>(d.status());
        if (h.ok() && h->size() == c.dispute->last_step - c.dispute->first_step + 1) {
          dispute_hashes_[key] = std::move(*h);
        }
      }
      if (dispute_hashes_.count(key)) {
        PostDisputeMove(c);
      } else {
        urgent->push_back({VerifyJob::Kind::kDispute, &c, c.dispute->query_deadline});
      }
    }
    // At the referee: a party that is not cheating posts the step's witness (the ledger rules).
    if (c.dispute && c.dispute->has_referee && c.dispute->referee.whole_step &&
        !c.dispute->referee.segment &&
        (c.dispute->challenger == id() ||
         (c.dispute->defender == id() && !CheatsAsSolver(options_.adversary))) &&
        // Not again once sent or given up: building a witness replays the unit to the step.
        !VerifyActionDone(Action(Kind::kWitness, dir, {c.dispute->referee.step}))) {
      urgent->push_back({VerifyJob::Kind::kWitness, &c, c.deadline_height});
    }
  }
  std::stable_sort(urgent->begin(), urgent->end(), [](const VerifyJob& a, const VerifyJob& b) {
    return a.deadline < b.deadline;
  });
  CleanVerifyDirs(live);
}

void NodeAgent::CleanVerifyDirs(const std::set<std::string>& live) {
  const std::string root = JoinPath(options_.data_dir, "verify");
  if (!verify_dirs_) {
    verify_dirs_.emplace();
    if (Result<std::vector<std::string>> names = deps_.env->ListDir(root); names.ok()) {
      for (const std::string& n : *names) verify_dirs_->insert(JoinPath(root, n));
    }
  }
  verify_dirs_->insert(live.begin(), live.end());
  for (auto it = verify_dirs_->begin(); it != verify_dirs_->end();) {
    if (live.count(*it)) {
      ++it;
      continue;
    }
    // The check is over (settled and its round final, or the round re-ran).
    const std::string dir = *it;
    if (Result<std::vector<std::string>> names = deps_.env->ListDir(dir); names.ok()) {
      for (const std::string& n : *names) (void)deps_.env->DeleteFile(JoinPath(dir, n));
    }
    whistle_seen_.erase(dir);
    for (auto h = dispute_hashes_.begin(); h != dispute_hashes_.end();) {
      h = h->first.starts_with(dir + "/") ? dispute_hashes_.erase(h) : std::next(h);
    }
    for (auto s = verify_sent_.begin(); s != verify_sent_.end();) {
      s = s->dir == dir ? verify_sent_.erase(s) : std::next(s);
    }
    for (auto f = verify_failed_.begin(); f != verify_failed_.end();) {
      f = f->first.dir == dir ? verify_failed_.erase(f) : std::next(f);
    }
    it = verify_dirs_->erase(it);
  }
}

Status NodeAgent::RunVerifyJob(const VerifyJob& job) {
  switch (job.kind) {
    case VerifyJob::Kind::kVerdict:
      return RunVerdict(*job.check);
    case VerifyJob::Kind::kDispute:
      return RunDisputeReplay(*job.check);
    case VerifyJob::Kind::kWhistle:
      return RunWhistle(*job.check);
    case VerifyJob::Kind::kWitness:
      return RunStepWitness(*job.check);
  }
  return Internal("unknown verification job");
}

// ---- Verifier and whistleblower --------------------------------------------------------------

Result<NodeAgent::SegmentFinding> NodeAgent::CheckSegments(const CheckAssignment& c,
                                                           const std::vector<uint32_t>& segments,
                                                           const std::string& dir) {
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, GetTaskContext(c.task_id));
  ML_ASSIGN_OR_RETURN(Bytes state_bytes, FetchBlob(c.start_state, {}, StateReason(c.task_id)));
  ML_ASSIGN_OR_RETURN(GlobalState start, DecodeGlobalState(state_bytes, ctx->facts.num_params));
  const UnitWork work = WorkOf(*ctx, c.round, c.shard);
  const std::vector<int64_t> steps = HashedSteps(work.inner_steps, work.checkpoint_interval);
  if (steps.size() != c.num_segments + 1ull) {
    return FailedPrecondition(Name(c) + ": the ledger counts " + std::to_string(c.num_segments) +
                              " segments, the task bundle " + std::to_string(steps.size() - 1));
  }
  // The leaves are what a claim proves against the commitment. They are on chain with the
  // commit, so a solver that serves nothing cannot hide them; its checkpoints come from its unit
  // service (without them the segments are replayed from the unit's start).
  std::vector<Hash256> leaves = c.leaves;
  Result<UnitManifest> served =
      FetchUnitManifest(deps_.transport, c.solver_endpoint, c.task_id, c.index);
  UnitManifest m;
  if (served.ok()) {
    m = std::move(*served);
  } else {
    Log(Name(c) + ": the solver serves no manifest (" + served.status().message() +
        "); replaying from the unit's start");
  }
  if (leaves.empty()) leaves = m.leaves;  // a ledger that does not carry them
  if (leaves.size() != steps.size() || MerkleRoot(leaves) != c.commitment) {
    return FailedPrecondition(Name(c) + ": the committed leaves do not hash to the commitment " +
                              c.commitment.ShortHex());
  }
  SegmentFinding f;
  f.leaves = std::move(leaves);
  engine::Trainer* trainer = ctx->trainer.get();
  auto mismatch = [&](uint32_t seg, const Hash256& replayed, std::string checkpoint) {
    f.mismatch = true;
    f.segment = seg;
    f.start = f.leaves[seg];
    f.solver_end = f.leaves[seg + 1];
    f.replayed_end = replayed;
    f.checkpoint = std::move(checkpoint);
  };
  // Tolerance mode (a task for hardware without bitwise reproducibility): a segment is clean
  // when the replay's end state is within the task's tolerance of the solver's committed one.
  protocol::ToleranceParams tolerance;
  tolerance.max_rel_l2_ppm = ctx->info.params.tolerance_rel_l2_ppm;
  tolerance.max_cosine_gap_ppb = ctx->info.params.tolerance_cosine_gap_ppb;
  // Returns whether segment j is a mismatch (recorded in f). The replay starts from the solver's
  // checkpoint (it hashes to its own leaf on any hardware) or from the unit's start; the
  // solver's end state is its checkpoint at the segment's end, or at H its committed delta,
  // compared as the referee does (referee.h). A state the solver does not show is a mismatch;
  // one that cannot be fetched now is an error (retried), never a claim.
  auto tolerance_segment = [&](uint32_t j) -> Result<bool> {
    std::string path;
    Hash256 end;
    bool replayed = false;
    if (j > 0) {
      path = JoinPath(dir, "ckpt-" + std::to_string(steps[j]) + ".safetensors");
      Status via = [&]() -> Status {
        ML_ASSIGN_OR_RETURN(Bytes ckpt, FetchUnitCheckpoint(deps_.transport, c.solver_endpoint,
                                                            m, steps[j]));
        ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(path, AsStringView(ckpt)));
        ML_ASSIGN_OR_RETURN(engine::TrainState st, engine::LoadCheckpoint(deps_.env, path));
        ML_ASSIGN_OR_RETURN(SegmentReplay r,
                            ReplaySegment(trainer, start.weights, work, j, &st, &f.leaves[j]));
        end = r.end_hash;
        return Status::Ok();
      }();
      replayed = via.ok();
      if (!replayed) {
        Log(Name(c) + ": segment " + std::to_string(j) + ": the solver's checkpoint is not usable (" +
            via.message() + "); replaying from the unit's start");
        path.clear();
      }
    }
    if (!replayed) {
      const int64_t to[] = {steps[j + 1]};
      ML_ASSIGN_OR_RETURN(std::vector<Hash256> h,
                          ReplayToSteps(trainer, start.weights, work, 0, nullptr, to));
      end = h[0];
    }
    if (end == f.leaves[j + 1]) return false;  // bit-equal
    std::vector<float> ours = trainer->FlatParams();
    std::optional<std::vector<float>> theirs;
    if (steps[j + 1] < work.inner_steps) {
      Result<Bytes> ckpt =
          FetchUnitCheckpoint(deps_.transport, c.solver_endpoint, m, steps[j + 1]);
      if (!ckpt.ok() && ckpt.status().code() != StatusCode::kNotFound) return ckpt.status();
      if (ckpt.ok()) {
        const std::string end_path =
            JoinPath(dir, "ckpt-" + std::to_string(steps[j + 1]) + ".safetensors");
        ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(end_path, AsStringView(*ckpt)));
        Result<engine::TrainState> st = engine::LoadCheckpoint(deps_.env, end_path);
        if (st.ok() && engine::StateHash(*st) == f.leaves[j + 1]) theirs = StateParams(*st);
      }
    } else {
      ML_ASSIGN_OR_RETURN(Bytes blob, FetchBlob(c.result_hash, {c.solver_endpoint}, ""));
      Result<std::vector<float>> delta = DecodeDelta(blob, ctx->facts.num_params);
      if (delta.ok()) {
        theirs = EndParamsOfDelta(start.weights, *delta);
        ours = EndParamsOfDelta(start.weights, protocol::PseudoGradient(start.weights, ours));
      }
    }
    if (theirs && theirs->size() == ours.size() &&
        protocol::WithinTolerance(protocol::Distance(*theirs, ours), tolerance)) {
      return false;
    }
    mismatch(j, end, path);
    return true;
  };
  std::vector<uint32_t> sorted = segments;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t j : sorted) {
    if (j >= c.num_segments) continue;
    if (!tolerance.exact()) {
      ML_ASSIGN_OR_RETURN(bool bad, tolerance_segment(j));
      if (bad) break;
      continue;
    }
    if (j > 0) {
      // From the solver's checkpoint at the segment's start, which must hash to its leaf.
      const std::string path = JoinPath(dir, "ckpt-" + std::to_string(steps[j]) + ".safetensors");
      Hash256 end;
      Status via = [&]() -> Status {
        ML_ASSIGN_OR_RETURN(Bytes ckpt, FetchUnitCheckpoint(deps_.transport, c.solver_endpoint,
                                                            m, steps[j]));
        ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(path, AsStringView(ckpt)));
        ML_ASSIGN_OR_RETURN(engine::TrainState st, engine::LoadCheckpoint(deps_.env, path));
        ML_ASSIGN_OR_RETURN(SegmentReplay r,
                            ReplaySegment(trainer, start.weights, work, j, &st, &f.leaves[j]));
        end = r.end_hash;
        return Status::Ok();
      }();
      if (via.ok()) {
        if (end != f.leaves[j + 1]) {
          mismatch(j, end, path);
          break;
        }
        continue;
      }
      Log(Name(c) + ": segment " + std::to_string(j) + ": the solver's checkpoint is not usable (" +
          via.message() + "); replaying from the unit's start");
    }
    // From the unit's start (always available): every committed leaf up to the segment's end.
    std::vector<int64_t> upto(steps.begin(), steps.begin() + j + 2);
    ML_ASSIGN_OR_RETURN(std::vector<Hash256> hashes,
                        ReplayToSteps(trainer, start.weights, work, 0, nullptr, upto));
    for (size_t i = 1; i < hashes.size(); ++i) {
      if (hashes[i] != f.leaves[i]) {
        mismatch(static_cast<uint32_t>(i - 1), hashes[i], "");
        break;
      }
    }
    if (f.mismatch) break;
  }

  // Result binding (docs/verification.md "Result binding"): the committed result must be the
  // delta of the state the last leaf commits to. That state is this replay's own when it ended
  // at H, else the solver's checkpoint at H, else a replay of the last segment (from the
  // solver's checkpoint at its start, or from the unit's start). One that does not hash to the
  // last leaf says nothing (a forced error's last leaf is a ForcedLeaf; a wrong checkpoint is
  // the segment checks' business). After a segment mismatch the dispute decides the unit: no
  // result check (and no multi-megabyte proof) is needed.
  if (f.mismatch) return f;
  const Hash256& last_leaf = f.leaves.back();
  std::optional<engine::TrainState> shown;
  auto load = [&](int64_t step) -> Result<engine::TrainState> {
    ML_ASSIGN_OR_RETURN(Bytes ckpt,
                        FetchUnitCheckpoint(deps_.transport, c.solver_endpoint, m, step));
    const std::string path = JoinPath(dir, "ckpt-" + std::to_string(step) + ".safetensors");
    ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(path, AsStringView(ckpt)));
    return engine::LoadCheckpoint(deps_.env, path);
  };
  engine::TrainState* final_state = nullptr;
  if (trainer->state().model && trainer->state().step == work.inner_steps &&
      engine::StateHash(trainer->state()) == last_leaf) {
    final_state = &trainer->state();
  } else if (Result<engine::TrainState> st = load(work.inner_steps);
             st.ok() && engine::StateHash(*st) == last_leaf) {
    shown = std::move(*st);
    final_state = &*shown;
  } else {
    const uint32_t j = c.num_segments - 1;
    Status replayed = [&]() -> Status {
      std::optional<engine::TrainState> from;
      if (j > 0) {
        Result<engine::TrainState> st = load(steps[j]);
        if (st.ok() && engine::StateHash(*st) == f.leaves[j]) from = std::move(*st);
      }
      const int64_t to[] = {work.inner_steps};
      return ReplayToSteps(trainer, start.weights, work, from ? steps[j] : 0,
                           from ? &*from : nullptr, to)
          .status();
    }();
    if (replayed.ok() && engine::StateHash(trainer->state()) == last_leaf) {
      final_state = &trainer->state();
    }
  }
  if (final_state != nullptr) {
    f.result = CheckUnitResult(start.weights, *final_state, last_leaf, c.result_hash);
    ++stats_.results_checked;
    if (f.result == ResultCheck::kWrong) {
      ML_RETURN_IF_ERROR(
          engine::SaveCheckpoint(deps_.env, JoinPath(dir, "final.safetensors"), *final_state));
    }
  } else {
    Log(Name(c) + ": result check skipped: no state hashing to the last committed leaf " +
        last_leaf.ShortHex() + " could be had");
  }
  return f;
}

namespace {

// A SegmentFinding as verdict.json / challenge.json keep it.
template <typename Finding>
json FindingJson(const Finding& f) {
  json v = {{"leaves", HexList(f.leaves)}, {"mismatch", f.mismatch},
            {"result_wrong", f.result == ResultCheck::kWrong}};
  if (f.mismatch) {
    v["segment"] = f.segment;
    v["replayed_end"] = f.replayed_end.ToHex();
    v["checkpoint"] = f.checkpoint;
  }
  return v;
}

}  // namespace

Status NodeAgent::RunVerdict(const CheckAssignment& c) {
  const std::string dir = VerifyDir(c);
  ML_RETURN_IF_ERROR(deps_.env->CreateDirs(dir));
  SegmentFinding f;
  if (!CheatsAsVerifier(options_.adversary)) {
    ML_ASSIGN_OR_RETURN(f, CheckSegments(c, c.segments, dir));
    ++stats_.replays;
  }  // else rubber stamp: "clean", nothing replayed
  const protocol::Verdict verdict =
      f.mismatch ? protocol::Verdict::kVerdictMismatch : protocol::Verdict::kVerdictClean;
  // The salt hides the verdict until the reveal: secret (the node key) and the same after a
  // restart.
  const Hash256 salt = Hasher("meshlearn.node.verdict_salt.v1")
                           .Update(ByteSpan(deps_.key.seed().bytes.data(),
                                            deps_.key.seed().bytes.size()))
                           .Update(c.task_id)
                           .UpdateU64(c.index)
                           .UpdateU64(c.commit_height)
                           .Finish();
  const Hash256 evidence =
      f.mismatch ? protocol::MismatchEvidence(f.segment, f.replayed_end) : Hash256{};
  const Hash256 commitment = protocol::VerdictCommitment(
      verdict, salt, id(), protocol::UnitId{c.task_id, c.round, c.shard}, evidence);
  json v = FindingJson(f);
  v["verdict"] = static_cast<int>(verdict);
  v["salt"] = salt.ToHex();
  v["commitment"] = commitment.ToHex();
  ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(JoinPath(dir, "verdict.json"), v.dump()));
  std::string segs;
  for (uint32_t s : c.segments) segs += (segs.empty() ? "" : ",") + std::to_string(s);
  Log(Name(c) + ": verdict " + std::string(protocol::VerdictName(verdict)) +
      (CheatsAsVerifier(options_.adversary) ? " (rubber stamp, nothing replayed)"
                                            : " (segments " + segs + " of solver " +
                                                  c.solver.ShortHex() + ")") +
      (f.mismatch ? ": segment " + std::to_string(f.segment) + " replays to " +
                        f.replayed_end.ShortHex() + ", committed " + f.solver_end.ShortHex()
                  : ""));
  if (SendVerifyTx(Action(Kind::kCommit, dir), ledger::CommitVerdictTx{.task_id = c.task_id,
                                                                        .index = c.index,
                                                                        .node_id = id(),
                                                                        .commitment = commitment})) {
    ++stats_.verdicts_committed;
    if (f.mismatch) ++stats_.mismatches;
  }
  // After the verdict's commitment (same block, in order): the proof settles the check and
  // voids the verdicts.
  if (f.result == ResultCheck::kWrong) ProveResult(c);
  return Status::Ok();
}

void NodeAgent::RevealVerdict(const CheckAssignment& c) {
  const std::string dir = VerifyDir(c);
  const VerifyAction action = Action(Kind::kReveal, dir);
  if (verify_sent_.count(action)) return;
  Result<json> v = ReadJson(deps_.env, JoinPath(dir, "verdict.json"));
  Result<Hash256> salt = v.ok() ? HashAt(*v, "salt") : Result<Hash256>(v.status());
  if (!salt.ok()) {
    Log(Name(c) + ": cannot reveal the verdict: " + salt.status().message());
    verify_failed_[action] = kMaxVerifyAttempts;
    return;
  }
  ledger::RevealVerdictTx tx{.task_id = c.task_id,
                             .index = c.index,
                             .node_id = id(),
                             .verdict = static_cast<uint8_t>(v->value("verdict", 0)),
                             .salt = *salt};
  if (v->value("mismatch", false)) {
    Result<ledger::MismatchClaimField> claim = ClaimOf(*v);
    if (!claim.ok()) {
      Log(Name(c) + ": cannot reveal the verdict: " + claim.status().message());
      verify_failed_[action] = kMaxVerifyAttempts;
      return;
    }
    tx.claim = std::move(*claim);
  }
  if (SendVerifyTx(action, std::move(tx))) ++stats_.verdicts_revealed;
}

Status NodeAgent::RunWhistle(const CheckAssignment& c) {
  const std::string dir = VerifyDir(c);
  whistle_seen_.insert(dir);  // one draw per unit, whatever happens
  ML_RETURN_IF_ERROR(deps_.env->CreateDirs(dir));
  const uint32_t segment = protocol::WhistleSegment(
      ByteSpan(deps_.key.seed().bytes.data(), deps_.key.seed().bytes.size()), c.task_id, c.index,
      c.commit_height, c.num_segments);
  ML_ASSIGN_OR_RETURN(SegmentFinding f, CheckSegments(c, {segment}, dir));
  ++stats_.replays;
  if (f.result == ResultCheck::kWrong) {
    // One computation settles it: no dispute needed.
    ProveResult(c);
    return Status::Ok();
  }
  if (!f.mismatch) {
    Log(Name(c) + ": whistleblower re-check of segment " + std::to_string(segment) + ": clean");
    return Status::Ok();
  }
  json v = FindingJson(f);
  ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(JoinPath(dir, "challenge.json"), v.dump()));
  ML_ASSIGN_OR_RETURN(ledger::MismatchClaimField claim, ClaimOf(v));
  Log(Name(c) + ": whistleblower: segment " + std::to_string(f.segment) + " of solver " +
      c.solver.ShortHex() + " replays to " + f.replayed_end.ShortHex() + ", committed " +
      f.solver_end.ShortHex() + "; challenging the " + std::string(protocol::CheckResultName(c.result)) + " unit");
  if (SendVerifyTx(Action(Kind::kChallenge, dir),
                   ledger::ChallengeUnitTx{.task_id = c.task_id,
                                           .index = c.index,
                                           .node_id = id(),
                                           .claim = std::move(claim)})) {
    ++stats_.challenges;
  }
  return Status::Ok();
}

Status NodeAgent::RunStepWitness(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const std::string dir = VerifyDir(c);
  const VerifyAction action = Action(Kind::kWitness, dir, {d.referee.step});
  if (VerifyActionDone(action)) return Status::Ok();
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, GetTaskContext(c.task_id));
  // Only a task with a data root on the ledger is refereed by the ledger itself.
  if (ctx->info.params.data_root.IsZero()) return Status::Ok();
  if (!ctx->data_tree) {
    if (ctx->trainer->data().tokens) return Status::Ok();
    ctx->data_tree = std::make_unique<engine::DataTree>(ctx->trainer->data().train);
  }
  ML_ASSIGN_OR_RETURN(Bytes bundle, FetchBlob(ctx->info.spec_hash, {}, ""));
  ML_ASSIGN_OR_RETURN(Bytes state_bytes, FetchBlob(c.start_state, {}, StateReason(c.task_id)));
  ML_ASSIGN_OR_RETURN(GlobalState start, DecodeGlobalState(state_bytes, ctx->facts.num_params));
  const UnitWork work = WorkOf(*ctx, c.round, c.shard);
  // The agreed state may be the defender's own (false) checkpoint at the dispute's first step:
  // the defender has it in its unit directory, the challenger replayed from it.
  std::string checkpoint;
  if (d.defender == id()) {
    checkpoint = JoinPath(UnitDir(c.task_id, c.index),
                          "ckpt-" + std::to_string(d.first_step) + ".safetensors");
  } else {
    for (const char* file : {"verdict.json", "challenge.json"}) {
      Result<nlohmann::json> v = ReadJson(deps_.env, JoinPath(dir, file));
      if (v.ok() && v->value("mismatch", false)) checkpoint = v->value("checkpoint", std::string());
    }
  }
  DisputeStart from{.first_step = static_cast<int64_t>(d.first_step), .agreed = d.agreed};
  if (!checkpoint.empty()) {
    from.checkpoint = [this, checkpoint](int64_t step) -> Result<engine::TrainState> {
      ML_ASSIGN_OR_RETURN(engine::TrainState st, engine::LoadCheckpoint(deps_.env, checkpoint));
      if (st.step != step) {
        return NotFound("checkpoint " + checkpoint + " is of step " + std::to_string(st.step));
      }
      return st;
    };
  }
  Result<BuiltStepWitness> w =
      BuildStepWitness(ctx->trainer.get(), start.weights, work, d.referee,
                       AsStringView(bundle), *ctx->data_tree, from);
  if (!w.ok()) {
    if (!verify_failed_.count(action)) {
      Log(Name(c) + ": no witness for step " + std::to_string(d.referee.step) + ": " +
          w.status().message());
    }
    verify_failed_[action] = kMaxVerifyAttempts;
    return Status::Ok();
  }
  Bytes witness = ledger::EncodeStepWitness(w->witness);
  Log(Name(c) + ": the dispute narrowed to step " + std::to_string(d.referee.step) +
      "; posting its witness (RefereeStep, " + std::to_string(witness.size()) +
      " bytes): the ledger computes " + w->output.ShortHex());
  SendVerifyTx(action, ledger::RefereeStepTx{.task_id = c.task_id,
                                             .index = c.index,
                                             .witness = {std::move(witness)}});
  return Status::Ok();
}

// ---- Result binding --------------------------------------------------------------------------

void NodeAgent::ProveResult(const CheckAssignment& c) {
  const std::string dir = VerifyDir(c);
  const VerifyAction action = Action(Kind::kProve, dir);
  if (VerifyActionDone(action)) return;  // not the witness's I/O again every poll
  auto give_up = [&](const std::string& why) {
    if (!verify_failed_.count(action)) Log(Name(c) + ": cannot prove the wrong result: " + why);
    verify_failed_[action] = kMaxVerifyAttempts;
  };
  // The witness: the task bundle, the round's start state blob and the final state (saved by
  // the check that found the result wrong). All three are local: pinned or in the check's dir.
  Result<TaskContext*> ctx = GetTaskContext(c.task_id);
  if (!ctx.ok()) return give_up(ctx.status().message());
  Result<Bytes> bundle = FetchBlob((*ctx)->info.spec_hash, {}, "");
  Result<Bytes> start = FetchBlob(c.start_state, {}, StateReason(c.task_id));
  Result<engine::TrainState> st =
      engine::LoadCheckpoint(deps_.env, JoinPath(dir, "final.safetensors"));
  if (!bundle.ok()) return give_up("the task bundle: " + bundle.status().message());
  if (!start.ok()) return give_up("the round's start state: " + start.status().message());
  if (!st.ok()) return give_up("the final state: " + st.status().message());
  ledger::ResultWitness w{.bundle = std::string(AsStringView(*bundle)),
                          .start_state = std::move(*start),
                          .state = engine::FlatState(*st)};
  Bytes witness = ledger::EncodeResultWitness(w);
  if (witness.size() > ledger::kMaxWitnessBytes) {
    return give_up("its witness is " + std::to_string(witness.size()) + " bytes, over the " +
                   std::to_string(ledger::kMaxWitnessBytes) + " a transaction may carry");
  }
  Log(Name(c) + ": result of unit " + std::to_string(c.index) + " (" + c.result_hash.ShortHex() +
      ") is not the delta of its committed final state: proving it (ProveResult, " +
      std::to_string(witness.size()) + "-byte witness)");
  if (SendVerifyTx(action, ledger::ProveResultTx{.task_id = c.task_id,
                                                 .index = c.index,
                                                 .node_id = id(),
                                                 .witness = {std::move(witness)}})) {
    ++stats_.results_proven;
  }
}

// ---- Disputes --------------------------------------------------------------------------------

Status NodeAgent::RunDisputeReplay(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const std::string dir = VerifyDir(c);
  ML_RETURN_IF_ERROR(deps_.env->CreateDirs(dir));
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, GetTaskContext(c.task_id));
  ML_ASSIGN_OR_RETURN(Bytes state_bytes, FetchBlob(c.start_state, {}, StateReason(c.task_id)));
  ML_ASSIGN_OR_RETURN(GlobalState start, DecodeGlobalState(state_bytes, ctx->facts.num_params));
  const UnitWork work = WorkOf(*ctx, c.round, c.shard);
  // Start from a state this node trusts at the disputed segment's start: its own checkpoint as
  // the defender, the solver's checked checkpoint as the challenger; else the unit's start.
  std::string checkpoint;
  if (d.first_step > 0) {
    if (d.defender == id()) {
      checkpoint = JoinPath(UnitDir(c.task_id, c.index),
                            "ckpt-" + std::to_string(d.first_step) + ".safetensors");
    } else {
      for (const char* file : {"verdict.json", "challenge.json"}) {
        Result<json> v = ReadJson(deps_.env, JoinPath(dir, file));
        if (v.ok() && v->value("mismatch", false)) checkpoint = v->value("checkpoint", std::string());
      }
    }
  }
  std::optional<engine::TrainState> state;
  if (!checkpoint.empty() && deps_.env->FileExists(checkpoint)) {
    Result<engine::TrainState> st = engine::LoadCheckpoint(deps_.env, checkpoint);
    if (st.ok() && st->step == static_cast<int64_t>(d.first_step)) state = std::move(*st);
  }
  std::vector<int64_t> steps;
  for (uint64_t s = d.first_step; s <= d.last_step; ++s) steps.push_back(static_cast<int64_t>(s));
  std::vector<Hash256> hashes;
  if (d.defender == id() && CheatsAsSolver(options_.adversary)) {
    // A cheating solver defends with its own states (adversary.h): its unit run again with a
    // state hash after every step, so the game reaches the ledger, which rules against it.
    UnitWork every = work;
    every.checkpoint_interval = 1;
    AdversaryInputs in;
    in.last_round = c.round + 1 == ctx->bundle.net.rounds;  // as RunUnit told it (noisy_last)
    ML_ASSIGN_OR_RETURN(UnitOutcome out, RunAdversaryUnit(options_.adversary, ctx->trainer.get(),
                                                          start.weights, every, {}, in));
    for (int64_t s : steps) {
      if (s >= static_cast<int64_t>(out.state_hashes.size())) {
        return Internal("dispute: the adversary's run has no state after step " +
                        std::to_string(s));
      }
      hashes.push_back(out.state_hashes[static_cast<size_t>(s)]);
    }
  } else {
    ML_ASSIGN_OR_RETURN(hashes, ReplayToSteps(ctx->trainer.get(), start.weights, work,
                                              state ? static_cast<int64_t>(d.first_step) : 0,
                                              state ? &*state : nullptr, steps));
  }
  if (hashes.front() != d.agreed) {
    Log(Name(c) + ": dispute: this node's state after step " + std::to_string(d.first_step) +
        " is " + hashes.front().ShortHex() + ", the agreed one " + d.agreed.ShortHex());
  }
  const std::string key = JoinPath(dir, "dispute-" + std::to_string(d.first_step) + "-" +
                                            std::to_string(d.last_step) + ".json");
  ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(key, json{{"hashes", HexList(hashes)}}.dump()));
  dispute_hashes_[key] = std::move(hashes);
  Log(Name(c) + ": dispute over steps " + std::to_string(d.first_step) + ".." +
      std::to_string(d.last_step) + " as the " +
      (d.defender == id() ? "defender" : "challenger") + ": replayed");
  PostDisputeMove(c);
  return Status::Ok();
}

void NodeAgent::PostDisputeMove(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const std::string dir = VerifyDir(c);
  const std::string key = JoinPath(dir, "dispute-" + std::to_string(d.first_step) + "-" +
                                            std::to_string(d.last_step) + ".json");
  auto it = dispute_hashes_.find(key);
  if (it == dispute_hashes_.end() || d.position < d.first_step ||
      d.position - d.first_step >= it->second.size()) {
    return;
  }
  const VerifyAction action =
      Action(Kind::kPost, dir, {d.first_step, d.last_step, d.position, d.query_deadline});
  if (SendVerifyTx(action, ledger::DisputePostTx{.task_id = c.task_id,
                                                 .index = c.index,
                                                 .node_id = id(),
                                                 .position = d.position,
                                                 .hash = it->second[d.position - d.first_step]})) {
    ++stats_.dispute_posts;
  }
}

}  // namespace meshlearn::node

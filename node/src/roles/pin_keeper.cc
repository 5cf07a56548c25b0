#include "pin_keeper.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

namespace meshlearn::node {

namespace {

std::string KeepFinalReason(const Hash256& t) { return "keep-final:" + t.ToHex(); }

}  // namespace

void PinKeeper::DeleteUnitFiles(const Hash256& task, uint32_t index) {
  const std::string dir = node_->UnitDir(task, index);
  node_->unit_service().Withdraw(task, index);
  Result<std::vector<std::string>> names = node_->env()->ListDir(dir);
  if (!names.ok()) return;  // never created (the unit was refused before its first file)
  for (const std::string& n : *names) (void)node_->env()->DeleteFile(JoinPath(dir, n));
  ++node_->stats().unit_dirs_deleted;
}

Status PinKeeper::AdoptUploads() {
  std::map<Hash256, uint64_t> uploads;  // blob -> earliest upload height
  for (const auto& [id, reasons] : node_->book().Snapshot()) {
    for (const std::string& r : reasons) {
      if (!r.starts_with(kUploadPrefix)) continue;
      uint64_t h = std::strtoull(r.c_str() + std::strlen(kUploadPrefix), nullptr, 10);
      if (h == 0) h = first_height_;  // uploaded before this agent's first Tick
      auto [it, inserted] = uploads.emplace(id, h);
      if (!inserted) it->second = std::min(it->second, h);
    }
  }
  if (uploads.empty()) return Status::Ok();
  std::set<Hash256> adopted;
  ML_ASSIGN_OR_RETURN(std::vector<TaskInfo> tasks, ListTasks(node_->chain()));
  for (const TaskInfo& t : tasks) {
    if (t.status != ledger::TaskStatus::kOpen) continue;
    if (uploads.count(t.spec_hash)) {
      ML_RETURN_IF_ERROR(node_->book().Add(t.spec_hash, TaskReason(t.id)));
      adopted.insert(t.spec_hash);
      // Its data blobs (uploaded with it, or fetched later) belong to the task too.
      Result<Bytes> bundle = node_->deps().store->Get(net::BlobId{t.spec_hash});
      if (bundle.ok()) {
        Result<std::vector<std::pair<std::string, net::BlobId>>> data =
            BundleDataBlobs(AsStringView(*bundle));
        if (data.ok()) {
          for (const auto& [key, id] : *data) {
            ML_RETURN_IF_ERROR(node_->book().Add(id.hash, TaskReason(t.id)));
            adopted.insert(id.hash);
          }
        }
      }
      node_->Log("task " + t.id.ShortHex() + ": keeping the bundle and data pushed to this node "
          "while the task is open");
    }
    const Hash256& init = t.params.initial_state;
    if (uploads.count(init)) {
      ML_RETURN_IF_ERROR(node_->book().Add(init, StateReason(t.id)));
      adopted.insert(init);
    }
  }
  const uint64_t grace = node_->options().upload_grace_blocks;
  ML_ASSIGN_OR_RETURN(size_t freed, node_->book().Remove([&](const Hash256& id, const std::string& r) {
    if (!r.starts_with(kUploadPrefix)) return false;
    uint64_t h = std::strtoull(r.c_str() + std::strlen(kUploadPrefix), nullptr, 10);
    if (h == 0) h = first_height_;
    return adopted.count(id) > 0 || h + grace <= node_->height();
  }));
  node_->stats().blobs_unpinned += freed;
  return Status::Ok();
}

Status PinKeeper::ReleaseTask(const Hash256& task, const Hash256& final_state) {
  const bool keep_final = node_->options().keep_final_states && !final_state.IsZero() &&
                          node_->deps().store->HasBlob(net::BlobId{final_state});
  if (keep_final) ML_RETURN_IF_ERROR(node_->book().Add(final_state, KeepFinalReason(task)));
  stager_->ReleaseEvidence(task, UINT32_MAX);
  ML_ASSIGN_OR_RETURN(size_t freed, node_->book().Remove([&](const Hash256&, const std::string& r) {
    std::string kind;
    Hash256 t;
    return PinBook::ParseTaskReason(r, &kind, &t) && t == task && kind != "keep-final";
  }));
  node_->stats().blobs_unpinned += freed;
  std::vector<PinBook::UnitKey> units;
  for (const auto& [k, round] : node_->book().Units()) {
    if (k.first != task) continue;
    DeleteUnitFiles(k.first, k.second);
    units.push_back(k);
  }
  ML_RETURN_IF_ERROR(node_->book().RemoveUnits(units));
  // The data files written from the task's data blobs, and the aggregation records.
  const std::string data_dir = node_->TaskDataDir(task);
  if (Result<std::vector<std::string>> names = node_->env()->ListDir(data_dir); names.ok()) {
    for (const std::string& n : *names) (void)node_->env()->DeleteFile(JoinPath(data_dir, n));
  }
  const std::string agg_dir = JoinPath(node_->options().data_dir, "aggregates");
  if (Result<std::vector<std::string>> names = node_->env()->ListDir(agg_dir); names.ok()) {
    for (const std::string& n : *names) {
      if (n.starts_with(task.ToHex() + "-")) (void)node_->env()->DeleteFile(JoinPath(agg_dir, n));
    }
  }
  node_->ForgetTask(task);
  solver_->ForgetTask(task);
  ML_RETURN_IF_ERROR(node_->book().ForgetTask(task));
  node_->Log("task " + task.ShortHex() + " closed: released " + std::to_string(freed) + " blobs and " +
      std::to_string(units.size()) + " unit directories" +
      (keep_final ? " (final state " + final_state.ShortHex() + " kept)" : std::string()));
  return Status::Ok();
}

Status PinKeeper::ReviewPins(const NodeWork& work) {
  last_review_height_ = node_->height();
  ML_RETURN_IF_ERROR(AdoptUploads());
  const std::map<PinBook::UnitKey, uint32_t> units = node_->book().Units();
  for (const Hash256& task : node_->book().Tasks({"keep-final"})) {
    Result<TaskInfo> info = GetTask(node_->chain(), task);
    if (!info.ok() && info.status().code() != StatusCode::kNotFound) return info.status();
    const bool gone = !info.ok();  // unknown to this ledger (e.g. a devnet started afresh)
    const Hash256 final_state = gone ? Hash256{} : info->final_state;
    if (gone || info->status != ledger::TaskStatus::kOpen) {
      uint64_t seen = node_->book().ClosedSeen(task);
      const bool first_seen = seen == 0;
      if (first_seen) {
        seen = node_->height();
        ML_RETURN_IF_ERROR(node_->book().SetClosedSeen(task, seen));
      }
      // A finished task can still be reopened and rewound to any of its rounds (a fraud proof
      // within its audit window): everything stays until the window has closed.
      const uint64_t audit_end = gone ? 0 : info->audit_window_end;
      const uint64_t release_at =
          std::max(seen + node_->options().release_after_blocks, audit_end + 1);
      if (first_seen) {
        node_->Log(
            "task " + task.ShortHex() + " is " +
            (gone ? "unknown to the ledger" : std::string(ledger::TaskStatusName(info->status))) +
            ": its blobs are released at block " + std::to_string(release_at) +
            (audit_end != 0 ? " (its audit window ends at block " + std::to_string(audit_end) + ")"
                            : std::string()));
      }
      // A late game open on one of its units (LateChallengeTx) is answered by a re-run of the
      // unit from its round's start state: the task's states, bundle and data stay until every
      // such game is ruled, whatever the window.
      const bool late_game = !gone && !info->late_games.empty();
      if (node_->height() >= release_at && late_game && late_hold_logged_.insert(task).second) {
        node_->Log("task " + task.ShortHex() + ": " + std::to_string(info->late_games.size()) +
                   " late game(s) open on its units: its blobs are kept until they are ruled");
      }
      if (node_->height() >= release_at && !late_game) {
        ML_RETURN_IF_ERROR(ReleaseTask(task, final_state));
        continue;
      }
    } else if (node_->book().ClosedSeen(task) != 0) {
      // Seen closed, open again: a fraud proof reopened it (its rounds re-run from the first
      // one the cheater worked in). It is released when it closes again.
      ML_RETURN_IF_ERROR(node_->book().ForgetTask(task));
      node_->Log("task " + task.ShortHex() + " was reopened: keeping its blobs until it closes");
    }
    // Rounds [0, finalized) are final (rounds_settled). SEAM (verification): a round is final
    // only when its checks settled and its verification window closed, so deltas and
    // checkpoints of a round that can still be checked or disputed stay. The global states
    // ("state:<T>", every round's start) stay until the task is released: a fraud proof while
    // the task is open or within its audit window takes the task back to the first round the
    // cheater worked in, which trains again from its start state (docs/verification.md,
    // "Fraud proofs after the fact"); a redo needs no delta or checkpoint of the rounds it
    // re-runs.
    const uint32_t finalized = gone ? 0 : info->rounds_settled;
    // Stage evidence goes with its round's finality, or once the ledger no longer counts its
    // unit as this node's (`work`'s stage_units), as the ledger counts a stage node's disk (its
    // units of rounds not final, on open tasks: ledger StageDiskHeld); a closed task's all at
    // once: a finished task's rounds are all final, and a cancelled task's units are never
    // checked or paid (nor is it reopened), so nothing replays them.
    const bool open = !gone && info->status == ledger::TaskStatus::kOpen;
    stager_->ReleaseEvidence(task, open ? finalized : UINT32_MAX,
                             work.stage_units ? &*work.stage_units : nullptr);
    ML_ASSIGN_OR_RETURN(
        size_t freed, node_->book().Remove([&](const Hash256&, const std::string& r) {
          std::string kind;
          Hash256 t;
          if (!PinBook::ParseTaskReason(r, &kind, &t) || t != task) return false;
          if (kind == "delta") {
            uint32_t round =
                static_cast<uint32_t>(std::strtoul(r.c_str() + r.rfind(':') + 1, nullptr, 10));
            return round < finalized;
          }
          return false;
        }));
    node_->stats().blobs_unpinned += freed;
    std::vector<PinBook::UnitKey> done;
    for (const auto& [k, round] : units) {
      if (k.first != task || round >= finalized) continue;
      DeleteUnitFiles(k.first, k.second);
      done.push_back(k);
    }
    ML_RETURN_IF_ERROR(node_->book().RemoveUnits(done));
  }
  return Status::Ok();
}

}  // namespace meshlearn::node

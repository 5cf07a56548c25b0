// meshlearn task audit ID [--full] [--sample N] [--seed S] [--prove --key K [--witness-limit B]]:
// fetches a finished task's record from the ledger and its bundle and data from the nodes,
// re-executes its units (all of them with --full, else a seeded random sample) and checks every
// recorded hash, printing the chain from the initial weights to the final model and a verdict
// (node/task_audit.h does the work; docs/submitters.md "Audit a task"). With --prove every unit
// whose commitment does not replay is proven on chain (ProveFraudTx: the witness of its first
// segment that misses its leaf; a witness over the ledger's 8 MiB bound, or over --witness-limit,
// opens a late game instead, LateChallengeTx, whose challenger's side the command then plays until
// it is ruled: PlayLateGames). `task audit ID --resume-games --key K` re-audits nothing: it plays
// the late games K challenged and left open (an audit stopped while it played them) to their
// rulings (ResumeLateGames).
// It hangs under `meshlearn task`, which cmd_task.cc creates.
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/progress.h"
#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/agent.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/task_audit.h"
#include "meshlearn/node/task_bundle.h"
#include "task_client.h"

namespace meshlearn::cli {
namespace {

using nlohmann::json;
using node::AuditCheck;

struct AuditArgs {
  std::string id;
  std::string rpc;
  std::string task_file;
  bool full = false;
  uint32_t sample = 3;
  std::optional<uint64_t> seed;
  uint64_t max_rebuild_units = 100;
  bool prove = false;
  // With --prove: a witness over this many bytes is sent as a LateChallenge, not a ProveFraud.
  std::optional<uint64_t> witness_limit;
  bool resume_games = false;
  std::string key;
  std::string passphrase_file;
};

// Rounds with more re-executed units than this print only their failures and a count.
constexpr size_t kMaxUnitLinesPerRound = 16;

const char* Mark(AuditCheck c) {
  switch (c) {
    case AuditCheck::kAuditCheckPass:
      return "✓";
    case AuditCheck::kAuditCheckFail:
      return "✗";
    case AuditCheck::kAuditCheckFetched:
      return "·";
    case AuditCheck::kAuditCheckSkipped:
      return "-";
  }
  return "?";
}

std::string Hex16(const Hash256& h) {
  return h.IsZero() ? std::string(16, '-') : h.ToHex().substr(0, 16);
}

// The size of a late game's witness and why it went late ("" when unknown: a resumed game).
std::string LateWitnessText(const json& p) {
  if (!p.contains("witness_bytes")) return "";
  const uint64_t limit = p.value("witness_limit", uint64_t{ledger::kMaxWitnessBytes});
  return fmt::format(" ({} bytes of witness, over {})", p.value("witness_bytes", uint64_t{0}),
                     limit == ledger::kMaxWitnessBytes ? std::string("the ledger's limit")
                                                       : fmt::format("--witness-limit {}", limit));
}

// What became of a fraud proof of segment `segment` (AuditUnit::proof, made by SendFraudProof and
// RecordLateOutcome).
std::string ProofLine(int64_t segment, const json& p) {
  if (p.value("late", false) && p.contains("ruled")) {  // a late game played to its end
    if (p.value("ruled", std::string()) == "moot") {
      return fmt::format(
          "segment {}: a late game{} closed without a ruling: the unit was taken back meanwhile "
          "(a proof on its solver rewound the task), the bond back",
          segment, LateWitnessText(p));
    }
    if (!p.value("proven", false)) {
      return fmt::format(
          "segment {}: a late game{} ruled for {}{}: not proven, the bond paid the solver's "
          "re-run",
          segment, LateWitnessText(p), p.value("ruled", std::string("nobody")),
          p.contains("reason") ? " (" + p.value("reason", std::string()) + ")" : "");
    }
    return fmt::format(
        "segment {}: a late game{} ruled for the challenger: PROVEN; solver slashed {}, {} "
        "clawed back, bounty {}, the bond back",
        segment, LateWitnessText(p), p.value("slashed", uint64_t{0}),
        p.value("clawed_back", uint64_t{0}), p.value("bounty", uint64_t{0}));
  }
  if (!p.value("sent", false) || !p.value("ok", false)) {
    return fmt::format("segment {}: {}", segment < 0 ? std::string("-") : std::to_string(segment),
                       p.value("error", std::string("not sent")));
  }
  std::string rounds;
  for (const json& r : p.value("fraud_rounds", json::array())) {
    rounds += (rounds.empty() ? "" : ", ") + r.dump();
  }
  // Its commitment refused (SendProveFraud): the bounty is an earlier commitment's, if any.
  const std::string uncommitted =
      p.contains("commit_error")
          ? " (sent without a commitment of this run: " + p.value("commit_error", std::string()) +
                "; the bounty went to an earlier commitment of the same witness, or stays in the "
                "jackpot)"
          : "";
  if (p.value("rewound", false)) {
    // Within the task's audit window (or while it runs): the task trains again without it.
    return fmt::format(
        "segment {} re-executed by the ledger ({} bytes of witness): PROVEN; solver slashed {}, "
        "bounty {}; the task is reopened from round {} (the first its solver worked in) and "
        "runs again without it, {} of its pay clawed back into the escrow for the redo{}",
        segment, p.value("witness_bytes", uint64_t{0}), p.value("slashed", uint64_t{0}),
        p.value("bounty", uint64_t{0}), p.value("rewound_to", uint32_t{0}),
        p.value("clawed_back", uint64_t{0}), uncommitted);
  }
  return fmt::format(
      "segment {} re-executed by the ledger ({} bytes of witness): PROVEN; solver slashed {}, "
      "{} clawed back to the submitter, bounty {}; the task's record marks round(s) {}{}",
      segment, p.value("witness_bytes", uint64_t{0}), p.value("slashed", uint64_t{0}),
      p.value("clawed_back", uint64_t{0}), p.value("bounty", uint64_t{0}), rounds, uncommitted);
}

// Signs `payload` with `key`, sends it and waits for its block; `out` gains the transaction's id,
// `sent`, `ok` and the error (`name` the transaction's, `refused` what the ledger refused).
// Returns whether the ledger executed it.
bool SendAndWait(ledger::RpcClient& rpc, const KeyPair& key, const std::string& chain_id,
                 ledger::TxPayload payload, std::string_view name, std::string_view refused,
                 json* out) {
  Result<uint64_t> nonce = ledger::FetchNextNonce(rpc, key.public_key());
  if (!nonce.ok()) {
    (*out)["error"] = nonce.status().message();
    return false;
  }
  const ledger::Transaction tx = ledger::BuildSignedTx(key, chain_id, *nonce, std::move(payload));
  (*out)["tx"] = ledger::TxId(tx).ToHex();
  Result<json> done = ledger::SendTxAndWait(rpc, tx, 120000);
  if (!done.ok()) {
    (*out)["error"] = std::string(name) + " was not included: " + done.status().message();
    return false;
  }
  (*out)["sent"] = true;
  const json receipt = done->value("receipt", json::object());
  (*out)["ok"] = receipt.value("ok", false);
  if (!receipt.value("ok", false)) {
    (*out)["error"] = "the ledger refused the " + std::string(refused) + ": " +
                      receipt.value("reason", std::string("no reason given"));
    return false;
  }
  return true;
}

// Unit `index` of task record `t` (get_task with units), or null where the record lists none.
const json* UnitOf(const json& t, uint32_t index) {
  const auto units = t.find("units");  // not value(): that is a copy, the pointer would dangle
  if (units == t.end() || !units->is_array()) return nullptr;
  for (const json& u : *units) {
    if (u.value("index", UINT32_MAX) == index) return &u;
  }
  return nullptr;
}

// What the task's `verification` record says became of unit `index`'s proven fraud, into `out`
// (the answer AuditUnit::proof keeps; PrintReport's proof line reads it). Returns whether the
// record lists it as proven.
bool RecordProvenFraud(const json& verification, uint32_t index, json* out) {
  bool proven = false;
  for (const json& f : verification.value("proven_frauds", json::array())) {
    if (f.value("index", UINT32_MAX) != index) continue;
    (*out)["slashed"] = f.value("slashed", uint64_t{0});
    (*out)["clawed_back"] = f.value("clawed_back", uint64_t{0});
    (*out)["bounty"] = f.value("bounty", uint64_t{0});
    (*out)["rewound"] = f.value("rewound", false);
    (*out)["rewound_to"] = f.value("rewound_to", uint32_t{0});
    proven = true;
  }
  (*out)["fraud_rounds"] = verification.value("fraud_rounds", json::array());
  return proven;
}

// Sends ProveFraud `tx` (of unit `u`) and waits for its block; `out` (what the witness is) gains
// what became of it: the answer AuditUnit::proof keeps.
json SendProveFraud(ledger::RpcClient& rpc, const KeyPair& key, const std::string& chain_id,
                    const node::AuditUnit& u, ledger::ProveFraudTx tx, json out) {
  const Hash256 task_id = tx.task_id;
  // Commit, then prove (docs/verification.md): the bounty is the earliest committer's and the
  // proof goes after its commitment's block, so a copier of the public proof cannot take it. A
  // commitment refused does not stop the proof, as in the node's VerifyOutbox::SendProof: a re-run
  // of an audit whose first run's commitment landed but whose proof did not (killed, or its wait
  // timed out) is refused the same commitment as a replay, and the one kept still takes the
  // bounty; with none (the prover's bound full, or its deposit unpaid) the proof still rules,
  // its bounty left in the jackpot.
  // A commitment holds a deposit until a proof spends it (params.proof_commit_deposit): to a unit
  // that is no longer paid work (an earlier proof of this audit rewound its task: it runs again)
  // the proof is refused ("is not final yet"), so no commitment is sent, whose deposit would only
  // be held until it expired into the jackpot.
  bool still_paid = true;  // where the ledger cannot say, commit as always
  if (Result<json> t = GetTask(rpc, task_id, true); t.ok()) {
    if (const json* unit = UnitOf(*t, u.index)) {
      still_paid = unit->value("status", std::string()) == "verified";
    }
  }
  json commit;
  const ledger::CommitProofTx c{
      .commitment = ledger::ProofCommitment(ledger::ProofWitnessId(tx), key.public_key()),
      .prover = key.public_key()};
  if (!still_paid) {
    out["commit_error"] = "not sent: the unit is no longer paid work (its task was rewound)";
  } else if (SendAndWait(rpc, key, chain_id, c, "CommitProof", "proof's commitment", &commit)) {
    out["commit_tx"] = commit["tx"];
  } else {
    out["commit_error"] = commit.value("error", std::string("the commitment was not sent"));
  }
  if (!SendAndWait(rpc, key, chain_id, std::move(tx), "ProveFraud", "proof", &out)) return out;
  Result<json> t = GetTask(rpc, task_id, false);
  if (t.ok()) (void)RecordProvenFraud(t->value("verification", json::object()), u.index, &out);
  return out;
}

// Sends what proves unit `u`'s failed segment `w` (node::FraudProofFor): its ProveFraud when the
// witness fits a transaction, else a LateChallenge, whose game the audit then plays
// (PlayLateGames). `task` is the record with units; `limit` the largest witness sent as a
// ProveFraud (--witness-limit; the ledger's kMaxWitnessBytes unless lowered).
json SendFraudProof(ledger::RpcClient& rpc, const KeyPair& key, const std::string& chain_id,
                    const json& task, const node::AuditUnit& u, const node::BuiltSegmentWitness& w,
                    const node::BlobGetter& get, uint64_t limit) {
  json out = {{"segment", w.segment},
              {"committed_end", w.committed_end.ToHex()},
              {"replayed_end", w.replayed_end.ToHex()},
              {"sent", false}};
  Result<node::FraudProofSend> f = node::FraudProofFor(task, u, w, get, limit);
  if (!f.ok()) {
    out["error"] = f.status().message();
    return out;
  }
  out["witness_bytes"] = f->witness_bytes;
  if (!f->late) {
    return SendProveFraud(rpc, key, chain_id, u, std::get<ledger::ProveFraudTx>(std::move(f->tx)),
                          std::move(out));
  }
  // Over the bound: the late game (docs/verification.md, "Over 8 MiB: a late dispute").
  out["late"] = true;
  out["bond"] = f->bond;
  out["witness_limit"] = limit;
  SendAndWait(rpc, key, chain_id, std::move(f->tx), "LateChallenge", "late challenge", &out);
  return out;
}

// The open late games on task record `t` (get_task with units) whose challenger is `challenger`
// (hex): each unit's `late` view (segment, bond, game) and its `assignee`, by unit index.
std::map<uint32_t, json> OpenLateGamesOf(const json& t, const std::string& challenger) {
  std::map<uint32_t, json> out;
  for (const json& u : t.value("units", json::array())) {
    if (!u.contains("late") || u["late"].value("challenger", std::string()) != challenger) continue;
    json g = u["late"];
    g["assignee"] = u.value("assignee", std::string());
    out[u.value("index", 0u)] = std::move(g);
  }
  return out;
}

// What became of the late game on unit `index` that `challenger` (hex) played against `defender`
// (the unit's solver when the game was open), once it is closed, from the task's record `t` (with
// units) into `out`: `ruled` (the referee's ruling: `challenger`, `defender` or `both`; `silence`:
// a party missed its turn; `moot`: the unit was taken back meanwhile, e.g. by another proof's
// rewind, and the bond came back), its `reason`, and `proven` with the proven fraud's effects
// (RecordProvenFraud).
void RecordLateOutcome(const json& t, uint32_t index, const std::string& challenger,
                       const std::string& defender, json* out) {
  const json v = t.value("verification", json::object());
  (*out)["late"] = true;
  (*out)["ruled"] = "silence";
  bool ruled = false;
  for (const json& ru : v.value("rulings", json::array())) {
    if (ru.value("index", UINT32_MAX) == index &&
        ru.value("challenger", std::string()) == challenger) {
      (*out)["ruled"] = ru.value("for", std::string());
      (*out)["reason"] = ru.value("reason", std::string());
      ruled = true;
    }
  }
  const bool proven = RecordProvenFraud(v, index, out);
  (*out)["proven"] = proven;
  if (proven || ruled || defender.empty()) return;
  // The game closes moot when its unit is no longer the verified work of its defender
  // (ledger LateGameMoot); after a silence the unit stays so.
  if (const json* u = UnitOf(t, index);
      u != nullptr && (u->value("status", std::string()) != "verified" ||
                       u->value("assignee", std::string()) != defender)) {
    (*out)["ruled"] = "moot";
  }
}

// Plays the challenger's side of the late games on `units` of task `id` (open, with `key` as their
// challenger) with an agent for `key` that is an account, not a node
// (node::AgentOptions::late_challenger), until none is open, and returns each game's outcome
// (RecordLateOutcome) by unit. Progress on stderr (unless --json): the agent's moves and each game
// as it closes.
Result<std::map<uint32_t, json>> PlayLateGames(GlobalOptions& g, node::HttpChainClient& chain,
                                               net::BlobStore* store, const KeyPair& key,
                                               const Hash256& id, const std::set<uint32_t>& units) {
  std::map<uint32_t, json> outcomes;
  if (units.empty()) return outcomes;
  const std::string me = key.public_key().ToHex();
  ML_ASSIGN_OR_RETURN(json record, GetTask(chain.rpc(), id, true));
  const std::map<uint32_t, json> open_games = OpenLateGamesOf(record, me);
  net::HttpTransport transport;
  node::AgentOptions opts;
  opts.data_dir = JoinPath(JoinPath(g.Home().AuditDir(), id.ToHex()), "late");
  opts.roles = 0;
  opts.late_challenger = true;
  opts.sleep = [](int64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); };
  if (!g.json) opts.log = [](const std::string& line) { std::cerr << line << std::endl; };
  node::NodeAgent agent({.env = Env::Default(),
                         .clock = SystemClock::Default(),
                         .transport = &transport,
                         .store = store,
                         .chain = &chain,
                         .key = key},
                        opts);
  ML_RETURN_IF_ERROR(agent.init_status());
  if (!g.json) {
    std::cerr << fmt::format(
                     "playing the challenger's side of {} late game(s) on task {} (the solver "
                     "answers each turn within blocks sized by the unit's work; Ctrl-C stops, "
                     "and a silent challenger loses its bond; `meshlearn task audit {} "
                     "--resume-games --key NAME` goes on)",
                     units.size(), id.ShortHex(), id.ShortHex())
              << std::endl;
  }
  std::set<uint32_t> playing = units;
  for (;;) {
    ML_ASSIGN_OR_RETURN(json t, GetTask(chain.rpc(), id, false));
    std::set<uint32_t> still;
    for (const json& i : t["verification"].value("late_games", json::array())) {
      if (playing.count(i.get<uint32_t>())) still.insert(i.get<uint32_t>());
    }
    if (!g.json) {
      for (uint32_t u : playing) {
        if (!still.count(u)) {
          std::cerr << fmt::format("late game on unit {} closed ({} of {} still open)", u,
                                   still.size(), units.size())
                    << std::endl;
        }
      }
    }
    playing = std::move(still);
    if (playing.empty()) break;
    Result<node::TickReport> tick = agent.Tick();
    if (!tick.ok()) {
      std::cerr << "late game: " << tick.status().message() << std::endl;
      std::this_thread::sleep_for(std::chrono::seconds(1));
      continue;
    }
    if (tick->busy) continue;
    (void)chain.Call("wait_block", {{"after", tick->height}, {"timeout_ms", 5000}});
  }
  // Each game's ruling (the last one on its unit with this key as challenger).
  ML_ASSIGN_OR_RETURN(json t, GetTask(chain.rpc(), id, true));
  for (uint32_t u : units) {
    json out = json::object();
    const auto at = open_games.find(u);
    if (at != open_games.end()) {
      out["segment"] = at->second.value("segment", uint32_t{0});
      out["bond"] = at->second.value("bond", uint64_t{0});
    }
    RecordLateOutcome(
        t, u, me,
        at == open_games.end() ? std::string() : at->second.value("assignee", std::string()), &out);
    outcomes[u] = std::move(out);
  }
  return outcomes;
}

// Sends the ProveFraud of stage unit `u`'s step u.fraud_segment with the witness `w` the audit
// built (a step witness, or a continuity witness of its commits).
json SendStageFraudProof(ledger::RpcClient& rpc, const KeyPair& key, const std::string& chain_id,
                         const Hash256& task_id, const node::AuditUnit& u,
                         const node::StageFraudProof& w) {
  const uint32_t step = static_cast<uint32_t>(u.fraud_segment);
  json out = {{"segment", step}, {"kind", node::StageFraudProofName(w.kind)}, {"sent", false}};
  out["witness_bytes"] = w.witness.size();
  if (w.witness.size() > ledger::kMaxWitnessBytes) {
    out["error"] = fmt::format(
        "the witness of step {} is {} bytes, over the ledger's limit of {} ({}); this stage "
        "cannot be proven on chain",
        step, w.witness.size(), ledger::kMaxWitnessBytes,
        w.kind == node::StageFraudProof::kStep
            ? "the stage's checkpoint, its received tensors and the step's batch"
        : w.kind == node::StageFraudProof::kContinuity
            ? "the step's commit, the bundle and the round's start state"
            : "the step's commits");
    return out;
  }
  return SendProveFraud(
      rpc, key, chain_id, u,
      ledger::ProveFraudTx{
          .task_id = task_id, .index = u.index, .segment = step, .witness = {w.witness}},
      std::move(out));
}

void PrintReport(const node::AuditReport& r, double seconds) {
  std::cout << fmt::format("audit of task {}\n  {}: {} rounds x {} units x {} steps, {}",
                           r.task_id.ToHex(), r.task_name, r.rounds, r.units_per_round,
                           r.inner_steps, r.status);
  if (r.rounds_audited < r.rounds) std::cout << fmt::format(" after {} rounds", r.rounds_audited);
  std::cout << "\n";
  if (r.full) {
    std::cout << fmt::format("  full re-execution: {} units in {}\n\n", r.units_executed,
                             ProgressBar::FormatDuration(seconds));
  } else {
    std::cout << fmt::format(
        "  sample of {} units, seed {} (repeat it with --seed {}); {} units "
        "re-executed in {}\n\n",
        r.sample, r.seed, r.seed, r.units_executed, ProgressBar::FormatDuration(seconds));
  }
  if (r.stages > 1) {
    std::cout << fmt::format(
        "  pipeline of {} stages: each replica re-run whole; {} stage steps compared with their "
        "commits\n\n",
        r.stages, r.stage_steps_compared);
  }
  if (r.chain.empty()) {  // nothing could be re-executed (the bundle disagrees with the ledger)
    std::cout << "FAIL: " << r.first_mismatch << "\n";
    return;
  }
  auto state_line = [](const node::AuditState& s) {
    std::cout << fmt::format("  {:<9} {}  {}  {}\n", s.name, Hex16(s.recorded), Mark(s.check),
                             s.note);
  };
  state_line(r.chain[0]);
  for (uint32_t round = 0; round < r.rounds_audited; ++round) {
    std::vector<const node::AuditUnit*> ran;
    for (const node::AuditUnit& u : r.units) {
      if (u.round == round && !u.replayed_result.IsZero()) ran.push_back(&u);
    }
    size_t quiet = 0;
    for (const node::AuditUnit* u : ran) {
      // A stage unit's commitment is over records its nodes signed: its steps are compared one by
      // one with its committed step commits instead.
      const bool stage = u->stage >= 0;
      const bool c_ok = stage ? u->fraud_segment < 0 && u->steps_compared == r.inner_steps
                              : u->replayed_commitment == u->commitment;
      const bool d_ok = u->replayed_result == u->result;
      if (ran.size() > kMaxUnitLinesPerRound && c_ok && d_ok) {
        ++quiet;
        continue;
      }
      if (stage) {
        std::cout << fmt::format(
            "      unit {:<4} replica {:<3} stage {:<2} node {}  {} of {} steps {}  delta {} "
            "{}{}\n",
            u->index, u->replica, u->stage, u->assignee.substr(0, 12), u->steps_compared,
            r.inner_steps, c_ok ? "✓" : "✗", Hex16(u->result), d_ok ? "✓" : "✗",
            u->sampled && !r.full ? "  (sampled)" : "");
      } else {
        std::cout << fmt::format(
            "      unit {:<4} shard {:<3} node {}  commitment {} {}  delta {} {}{}\n", u->index,
            u->shard, u->assignee.substr(0, 12), Hex16(u->commitment), c_ok ? "✓" : "✗",
            Hex16(u->result), d_ok ? "✓" : "✗", u->sampled && !r.full ? "  (sampled)" : "");
      }
      if (!c_ok || !d_ok) std::cout << "        " << u->note << "\n";
      if (!u->proof.is_null())
        std::cout << "        fraud proof: " << ProofLine(u->fraud_segment, u->proof) << "\n";
    }
    if (quiet > 0) std::cout << fmt::format("      {} more units ✓\n", quiet);
    state_line(r.chain[round + 1]);
  }
  if (r.chain.size() > r.rounds_audited + 1) state_line(r.chain.back());
  std::cout << "\n";
  if (!r.pass) {
    std::cout << "FAIL: " << r.first_mismatch << "\n";
  } else if (r.full) {
    std::cout << fmt::format(
        "PASS: {} units re-executed{}; every commitment, delta and state from "
        "the initial weights to the {} reproduced bit for bit\n",
        r.units_executed,
        r.stages > 1 ? fmt::format(" ({} stage steps compared)", r.stage_steps_compared) : "",
        r.status == "finished" ? "final model" : "last round");
  } else {
    // A pipeline sample re-runs each drawn unit's whole replica: more units than drawn.
    std::cout << fmt::format(
        "PASS (sample): the {} sampled units{} reproduce their commitments and "
        "deltas{}; states marked · or - were not recomputed (--full checks "
        "everything)\n",
        r.sample, r.stages > 1 ? " and the other stages of their replicas" : "",
        r.units_executed > r.sample && r.stages == 1 ? ", and so do the rounds rebuilt for them"
                                                     : "");
  }
}

// `task audit ID --resume-games --key K`: no audit; plays the late games on task `id` that `key`
// challenged and that are still open (a `--prove` audit stopped while it played them) to their
// rulings, and reports each (docs/submitters.md "Audit a task"). Exit status 1 when a game was
// lost (ruled for the solver, or the challenger silent).
Status ResumeLateGames(GlobalOptions& g, const AuditArgs& a, node::HttpChainClient& chain,
                       net::BlobStore* store, const KeyPair& key, const Hash256& id) {
  const std::string me = key.public_key().ToHex();
  ML_ASSIGN_OR_RETURN(json record, GetTask(chain.rpc(), id, true));
  const std::map<uint32_t, json> mine = OpenLateGamesOf(record, me);
  if (mine.empty()) {
    std::set<std::string> others;
    for (const json& u : record.value("units", json::array())) {
      if (u.contains("late")) {
        others.insert(u["late"].value("challenger", std::string()).substr(0, 12));
      }
    }
    if (others.empty()) {
      return FailedPrecondition(fmt::format(
          "task {} has no open late game: nothing to resume (a game's ruling is in `meshlearn "
          "task status {} --json`, verification.rulings; `task audit --prove` opens games)",
          id.ShortHex(), id.ShortHex()));
    }
    std::string list;
    for (const std::string& c : others) list += (list.empty() ? "" : ", ") + c + "...";
    return FailedPrecondition(fmt::format(
        "no open late game on task {} has key '{}' ({}...) as its challenger (the open games' "
        "challengers: {}): pass the key that sent the LateChallenge",
        id.ShortHex(), a.key, me.substr(0, 12), list));
  }
  std::set<uint32_t> units;
  for (const auto& [index, game] : mine) units.insert(index);
  ML_ASSIGN_OR_RETURN(auto outcomes, PlayLateGames(g, chain, store, key, id, units));
  json j = {{"task_id", id.ToHex()}, {"challenger", me}, {"games", json::array()}};
  bool lost = false;
  for (const auto& [index, out] : outcomes) {
    json game = out;
    game["index"] = index;
    lost = lost || (!out.value("proven", false) && out.value("ruled", std::string()) != "moot");
    j["games"].push_back(std::move(game));
  }
  g.Output(j, [&] {
    std::cout << fmt::format("late games of key '{}' on task {}: {} played to their rulings\n",
                             a.key, id.ToHex(), outcomes.size());
    for (const auto& [index, out] : outcomes) {
      std::cout << fmt::format("  unit {}: {}\n", index,
                               ProofLine(out.value("segment", int64_t{-1}), out));
    }
  });
  if (lost) g.exit_code = 1;
  return Status::Ok();
}

Status RunAudit(GlobalOptions& g, const AuditArgs& a) {
  ML_RETURN_IF_ERROR(engine::ConfigureFromEnv());
  Env* env = Env::Default();
  if (!a.full && a.sample == 0)
    return InvalidArgument("--sample must be at least 1 (or use --full)");
  if (a.prove && a.key.empty()) {
    return InvalidArgument(
        "--prove needs --key NAME: the key that signs and pays for the "
        "ProveFraud transactions (and gets their bounties)");
  }
  if (a.resume_games && a.key.empty()) {
    return InvalidArgument(
        "--resume-games needs --key NAME: the key that sent the LateChallenges (the games' "
        "challenger)");
  }
  if (!a.prove && !a.resume_games && !a.key.empty()) {
    return InvalidArgument("--key " + a.key + " is only used with --prove (or --resume-games)");
  }
  if (a.witness_limit && !a.prove) {
    return InvalidArgument("--witness-limit is only used with --prove");
  }
  if (a.witness_limit && *a.witness_limit > ledger::kMaxWitnessBytes) {
    return InvalidArgument(fmt::format(
        "--witness-limit {} is over the ledger's limit of {} bytes (kMaxWitnessBytes): a "
        "ProveFraud that large is refused; leave it out to use the ledger's limit",
        *a.witness_limit, ledger::kMaxWitnessBytes));
  }
  const std::string url = ledger::DefaultRpcUrl(a.rpc);
  node::HttpChainClient chain(url);
  // A malformed id is refused before any network; a prefix needs the ledger's list of tasks.
  ML_RETURN_IF_ERROR(CheckTaskIdText(a.id));
  if (Result<json> up = chain.Call("chain_status", json::object()); !up.ok()) {
    if (up.status().code() != StatusCode::kUnavailable) return up.status();
    return Unavailable(up.status().message() +
                       "; is the ledger running? Pass its URL with --rpc "
                       "(or set $MESHLEARN_RPC)");
  }
  ML_ASSIGN_OR_RETURN(Hash256 id, ResolveTaskId(chain.rpc(), a.id));
  // --prove signs with --key: load it before hours of re-execution, not after. (--resume-games
  // plays with it: its agent signs the moves.)
  std::optional<KeyPair> key;
  std::string chain_id;
  if (a.prove || a.resume_games) {
    KeyStore keys(env, g.KeysDir());
    ML_ASSIGN_OR_RETURN(std::string pass, ReadPassphrase(a.passphrase_file, false, !g.json));
    ML_ASSIGN_OR_RETURN(KeyPair k, keys.Load(a.key, pass));
    key = std::move(k);
    if (a.prove) {
      ML_ASSIGN_OR_RETURN(chain_id, ledger::FetchChainId(chain.rpc()));
    }
  }
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, g.Home().BlobsDir()));
  if (a.resume_games) return ResumeLateGames(g, a, chain, store.get(), *key, id);
  if (!a.task_file.empty()) {
    // The task file and its data, from this machine: the audit then needs nothing from the
    // nodes but the states it does not recompute.
    ML_ASSIGN_OR_RETURN(node::TaskBundle b, node::MakeBundle(env, a.task_file, store.get()));
    ML_ASSIGN_OR_RETURN(json t, GetTask(chain.rpc(), id, false));
    if (b.id.ToHex() != t.value("spec_hash", std::string())) {
      return InvalidArgument(fmt::format(
          "--task {} is not this task's file: its bundle is {} but the task's spec_hash is {}",
          a.task_file, b.id.ToHex(), t.value("spec_hash", std::string())));
    }
  }
  node::AuditOptions o;
  o.full = a.full;
  o.sample = a.sample;
  // Six digits: easy to type back; an audit's sample need not be unpredictable.
  o.seed = a.seed ? *a.seed : std::random_device{}() % 1'000'000;
  o.max_rebuild_units = a.max_rebuild_units;
  o.work_dir = JoinPath(JoinPath(g.Home().AuditDir(), id.ToHex()), "data");
  std::unique_ptr<ProgressBar> bar;  // its total is known once the audit has planned
  o.on_progress = [&](const node::AuditProgress& p) {
    if (!bar)
      bar = std::make_unique<ProgressBar>("audit", static_cast<int64_t>(p.steps_total), "steps",
                                          !g.json);
    bar->Update(static_cast<int64_t>(p.steps_done),
                fmt::format("{} ({}/{} units)", p.status, p.units_done, p.units_total));
  };
  if (!g.json) o.log = [](const std::string& s) { std::cerr << s << std::endl; };
  auto get = [&](const Hash256& h) { return FetchBlob(chain.rpc(), store.get(), net::BlobId{h}); };
  if (key) {
    o.on_fraud = [&](const node::AuditUnit& u, const node::BuiltSegmentWitness& w) -> json {
      Result<json> task = GetTask(chain.rpc(), id, true);  // the units as they are now
      if (!task.ok()) return {{"sent", false}, {"error", task.status().message()}};
      return SendFraudProof(chain.rpc(), *key, chain_id, *task, u, w, get,
                            a.witness_limit.value_or(ledger::kMaxWitnessBytes));
    };
    o.on_stage_fraud = [&](const node::AuditUnit& u, const node::StageFraudProof& w) {
      return SendStageFraudProof(chain.rpc(), *key, chain_id, id, u, w);
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  ML_ASSIGN_OR_RETURN(node::AuditReport r, node::AuditTask(env, chain, id, get, o));
  if (bar) bar->Finish();
  // A unit whose proof was over the witness bound: its late game, played to its ruling.
  if (key) {
    std::set<uint32_t> late;
    for (const node::AuditUnit& u : r.units) {
      // (A unit that passed, or was not proven, has no proof: null.)
      if (u.proof.is_object() && u.proof.value("late", false) && u.proof.value("ok", false)) {
        late.insert(u.index);
      }
    }
    // And the games this key opened before (an audit stopped while it played them, run again:
    // its LateChallenge is refused as open already, and the game goes on from where it is).
    ML_ASSIGN_OR_RETURN(json record, GetTask(chain.rpc(), id, true));
    for (const auto& [index, game] : OpenLateGamesOf(record, key->public_key().ToHex())) {
      late.insert(index);
    }
    ML_ASSIGN_OR_RETURN(auto outcomes, PlayLateGames(g, chain, store.get(), *key, id, late));
    for (node::AuditUnit& u : r.units) {
      const auto at = outcomes.find(u.index);
      if (at == outcomes.end()) continue;
      if (!u.proof.is_object()) u.proof = json::object();
      for (const auto& [k, v] : at->second.items()) u.proof[k] = v;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json j = node::AuditReportToJson(r);
  j["seconds"] = seconds;
  // Where the task's tokens went, in the words of every task command (task_client.h TaskMoney).
  TaskMoney money;
  if (Result<json> t = GetTask(chain.rpc(), id, false); t.ok()) {
    money = MoneyOf(*t);
    j["money"] = MoneyJson(money);
  }
  // After the proofs: the record as the ledger has it now.
  if (a.prove) {
    if (Result<json> t = GetTask(chain.rpc(), id, false); t.ok()) {
      const json v = t->value("verification", json::object());
      r.proven_frauds = v.value("proven_frauds", json::array());
      r.fraud_rounds = v.value("fraud_rounds", json::array());
      j["proven_frauds"] = r.proven_frauds;
      j["fraud_rounds"] = r.fraud_rounds;
    }
  }
  g.Output(j, [&] {
    PrintReport(r, seconds);
    for (const json& f : r.proven_frauds) {
      std::cout << fmt::format(
          "on chain: unit {} (round {}) proven fraudulent in segment {} at height {}: slashed {}, "
          "{} clawed back, bounty {}\n",
          f.value("index", 0u), f.value("round", 0u), f.value("segment", 0u),
          f.value("height", uint64_t{0}), f.value("slashed", uint64_t{0}),
          f.value("clawed_back", uint64_t{0}), f.value("bounty", uint64_t{0}));
    }
    if (j.contains("money")) std::cout << MoneyLine(money) << "\n";
  });
  if (!r.pass) g.exit_code = 1;
  return Status::Ok();
}

void AddTaskAudit(CLI::App& root, GlobalOptions& g) {
  static AuditArgs a;
  CLI::App* task = root.get_subcommand("task");  // cmd_task.cc (order 40)
  CLI::App* c = task->add_subcommand(
      "audit", "Re-execute a finished task's units and check every recorded hash (PASS/FAIL)");
  c->add_option("id", a.id, "Task id: the 64 hex digits or any unique prefix")->required();
  c->add_flag("--full", a.full, "Re-execute every unit of every round from the initial weights");
  c->add_option("--sample", a.sample, "Without --full: how many random units to re-execute")
      ->capture_default_str();
  c->add_option("--seed", a.seed,
                "Seed of the sample (printed by every sampled audit; default random)");
  c->add_option("--max-rebuild-units", a.max_rebuild_units,
                "Without --full: the most units re-executed only to rebuild start states no node "
                "serves any more")
      ->capture_default_str();
  c->add_option("--task", a.task_file,
                "The task file, if you have it and its data: nothing of the task is fetched");
  c->add_flag("--prove", a.prove,
              "Prove every unit that fails on chain (ProveFraud: the ledger re-executes its first "
              "segment that misses its committed leaf, slashes the solver, pays a bounty; over "
              "the 8 MiB witness bound a LateChallenge with a bond of the unit's cost, whose "
              "dispute game the command plays until it is ruled)");
  CLI::Option* limit = c->add_option(
      "--witness-limit", a.witness_limit,
      "With --prove: the largest witness (bytes) sent as one ProveFraud; a larger one opens a "
      "late game (LateChallenge) instead (default and most: the ledger's 8388608; 0: every "
      "proof as a late game)");
  CLI::Option* resume = c->add_flag(
      "--resume-games", a.resume_games,
      "Audit nothing: play the late games this --key challenged and left open (a --prove audit "
      "stopped while it played them) to their rulings");
  for (const char* other :
       {"--full", "--sample", "--seed", "--max-rebuild-units", "--task", "--prove"}) {
    resume->excludes(c->get_option(other));
  }
  resume->excludes(limit);
  c->add_option("--key", a.key,
                "With --prove or --resume-games: the key that signs the proofs and plays the late "
                "games (`meshlearn keys list`)");
  c->add_option("--passphrase-file", a.passphrase_file, "Read the key's passphrase from this file");
  c->add_option("--rpc", a.rpc, "Ledger RPC URL (default $MESHLEARN_RPC or http://127.0.0.1:7700)");
  c->footer(
      "Examples:\n"
      "  meshlearn task audit 3f2a... --full                  # everything, initial weights to "
      "final model\n"
      "  meshlearn task audit 3f2a...                         # 3 random units; prints its seed\n"
      "  meshlearn task audit 3f2a... --sample 10 --seed 42   # repeat a sample\n"
      "  meshlearn --json task audit 3f2a... --full --rpc http://127.0.0.1:7700\n"
      "  meshlearn task audit 3f2a... --full --task my-task.toml   # bundle and data from here\n"
      "  meshlearn task audit 3f2a... --full --prove --key alice  # slash what fails, on chain\n"
      "  meshlearn task audit 3f2a... --full --prove --key alice --witness-limit 0\n"
      "                                     # every proof as a late game, played to its ruling\n"
      "  meshlearn task audit 3f2a... --resume-games --key alice  # go on with alice's open "
      "late games\n"
      "Exit status 0 on PASS, 1 on FAIL (the first mismatch is named) or on an error.\n"
      "A sampled unit needs its round's start state: fetched from the nodes, else rebuilt by\n"
      "re-executing the rounds before it (at most --max-rebuild-units units). See\n"
      "docs/submitters.md \"Audit a task\".\n"
      "A pipeline task (network.stages > 1): each replica is re-run whole and every step of\n"
      "every stage compared with the step commits its CommitStage kept public.\n"
      "--prove: for each unit that fails, the first segment whose replay misses its committed\n"
      "leaf is sent as ProveFraud (a few MB of witness; a stage: its first step that differs by\n"
      "its own fault, with the re-run's checkpoint and tensors); accepted for a final round\n"
      "while the solver's stake is bonded (params.unbonding_delay_blocks >=\n"
      "params.audit_window_blocks). A witness over the ledger's 8 MiB (or --witness-limit)\n"
      "opens a late game instead, with a bond of the unit's cost, and the command plays it to\n"
      "its ruling; stopped meanwhile, --resume-games --key K plays the key's open games on\n"
      "(exit status 1 when a game was lost: neither proven nor moot).");
  c->callback([&g] { g.Exit(RunAudit(g, a)); });
}

}  // namespace

MESHLEARN_COMMAND(41, AddTaskAudit);

}  // namespace meshlearn::cli

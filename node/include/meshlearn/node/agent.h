// NodeAgent: everything a node does, with its transport, clock, files, blob store and ledger
// client injected, so the same code runs as the `meshlearn node run` daemon (HTTP, real clock,
// real files) and by the dozen inside one test process (SimNetwork, FakeClock, MemEnv).
//
// The agent itself keeps the node's membership (registration, heartbeats) and schedules its
// roles, one class each in node/src/roles/ with its own state machine and journal (docs/node.md):
// Solver (units), Aggregator (rounds), Verifier (verdicts), Whistleblower (re-checks), Disputes
// (the dispute game) and PinKeeper (which blobs and files stay).
//
// Driving: call Tick() after every new block (the daemon follows blocks by long-poll; a
// simulation calls it per node per block). One Tick:
//   1. polls its transactions in flight (TxSender) and handles their outcomes;
//   2. registers the node if the ledger does not know it (RegisterNode with the capabilities,
//      endpoint, price and stake of AgentOptions) or updates it if its endpoint, capabilities or
//      price changed; heartbeats every `heartbeat_every_blocks`;
//   3. reads node_work and does at most ONE job: an aggregation it is assigned (first), or one
//      assigned unit (earliest deadline first). TickReport::busy says more work is waiting, so
//      the daemon ticks again at once instead of waiting for a block.
//
// A unit: fetch the task bundle + data (once per task) and the round's start state, train H
// inner steps with UnitExecutor (stream = protocol::UnitSeed(task seed, UnitId{content id,
// round, shard}), lr_scale = NetworkSpec::InnerLrScale(round): exactly RunLocalDiloco's), save
// a checkpoint every k steps under <data_dir>/units/, store the delta blob (pinned), send
// CommitUnit. Killed mid-unit, the next agent on the same data dir resumes from the last
// checkpoint and produces the same bits. A unit whose memory need exceeds the node's real memory
// (memory_limit_bytes, else capabilities.memory_bytes) is refused, with the need and the limit in
// the log. The need is the scheduler's number, protocol::RequiredMemoryBytes of the ledger's
// params: TaskParams::memory_bytes, which the node checks equals UnitMemoryBytes of the bundle's
// model (CheckBundleMatchesLedger), or, for a task that declares none, the 5 x model_bytes
// fallback. A pipeline stage unit's need is params.stage_memory_bytes[stage], refused the same
// way. The refused unit expires at its deadline and the ledger gives it to another node. When the
// real limit is below the memory the node registered, the node also reports the lower value
// (UpdateNode) so that the scheduler stops assigning it such units.
//
// An aggregation: fetch every committed delta blob (from its committer's endpoint first, then
// from every registered node), decode it (a malformed delta blob is logged and left out, like a
// NaN delta), protocol::Aggregate with the task's rule, protocol::OuterStep with the outer
// momentum carried in the state blob, evaluate on the test set, store the new state blob
// (pinned), send CommitAggregate with the test accuracy and loss.
//
// Blobs the node keeps (PinBook, <data_dir>/pins.json): every pin has a reason, and the pin goes
// when its last reason ends; unpinned blobs stay on disk until the BlobStore's LRU needs their
// room (blob_quota_bytes). Reasons and when they end (reviewed every `gc_every_blocks`, one
// get_task per task the node holds something of):
//   "task:<T>"        bundle and data blobs of task T: some blocks after T is closed (below);
//   "state:<T>"       a global state of T (a round's start state, or one the node aggregated):
//                     with "task:<T>" (below): a fraud proof while T is open or within its audit
//                     window may rewind T to any round, which trains again from its start state;
//                     and the step commits of each stage unit the node committed or whose
//                     round it aggregated (an audit of T compares every stage step with them
//                     and proves from them);
//   "delta:<T>:<r>"   the node's delta for round r of T: once round r is final;
//   "upload:<h>"      pushed to the node at height h (blob.put_manifest): replaced by "task:<T>"
//                     / "state:<T>" when an open task T uses it as bundle, data or initial
//                     state; dropped after `upload_grace_blocks` if no open task does;
//   "keep"            the operator's keep_blobs: never ends;
//   "keep-final:<T>"  T's final state when keep_final_states: never ends.
// A closed (finished or cancelled) task: `release_after_blocks` blocks after the node first saw
// it closed, and not before its audit window closed (get_task's audit_window_end), every reason
// naming it ends, its unit directories and data files are deleted. A task seen closed and then
// open again (reopened by a fraud proof) is kept until it closes anew.
// A unit's checkpoints (<data_dir>/units/<T>-<index>/) are all kept until the unit's round is
// final, then deleted. A stage unit's evidence files (<data_dir>/stages/) too, or until the node
// sees its task closed (a cancelled task's units are never checked): the ledger counts them
// against the node's declared disk until then (docs/ledger.md, "Network training"). SEAM
// (verification): a round is final only when its verification window has closed (the task's
// weights_history grows only then), so a verifier can replay any k-step segment from the solver's
// checkpoint and a dispute can bisect it until then; keeping them longer (e.g. for a dispute still
// open) means holding finality (RoundStateMachine::HoldFinality), not a node-side rule.
//
// Verification (docs/verification.md; the ledger side is ledger/src/verification.cc). With the
// chain's genesis `verification` on, the node plays every role node_work's "checks" give it:
//   solver        registers the head of its secret chain (secret_chain.h); commits each unit with
//                 the next secret index (node_work's next_secret_index + its commits in flight)
//                 and, when that secret draws a forced error for the unit, commits
//                 protocol::ForcedCommitment instead of its Merkle root (the delta stays honest);
//                 serves the committed leaves and checkpoints (unit_service.h); in the unit's
//                 reveal window sends RevealSecret (checked or not: a solver that does not is
//                 "abandoned"); defends a dispute by posting its true state hashes;
//   verifier      replays the drawn segments from the solver's checkpoints (checked against the
//                 committed leaves, themselves checked against the on-chain commitment), or from
//                 the unit's start when the solver serves no usable checkpoint; commits
//                 VerdictCommitment (salt derived from the node key, persisted under
//                 <data_dir>/verify/ with the claim so a restart can still reveal), reveals it in
//                 the reveal window, and plays the dispute as challenger after a mismatch; a
//                 task in tolerance mode (TaskParams tolerance_*) is clean when the replay's end
//                 state is within tolerance of the solver's (its checkpoint, at H its delta),
//                 compared as the referee does (referee.h), and its disputes go to the referee;
//   whistleblower re-checks one segment of a sample (whistleblower_sample) of the units settled
//                 clean or unchecked in a round not final yet; on a mismatch sends ChallengeUnit
//                 and plays the dispute as challenger.
// Verifiers and whistleblowers also check every unit whose replayed segments were clean for
// result binding (docs/verification.md "Result binding"): the state after step H (their own
// replay when it ends there, else the solver's served checkpoint at H, else a replay of the last
// segment) must hash to the last committed leaf and give the committed result; when it hashes
// but gives another result they send ProveResult (the unit is fraud at once). The solver keeps and
// serves its final state (ckpt-H) with its other checkpoints for that. Dispute turns post the state
// hash after the asked step, replayed once per dispute over the whole disputed segment. Tick order:
// cheap verification transactions (reveals, dispute moves already computed) every tick, then ONE
// job: a replay for a verdict or a dispute (their windows are short), else an aggregation, else a
// whistleblower re-check, else a unit.
//
// Serving: RegisterServices() puts net::BlobService (download), BlobUploadService (upload,
// blob_push.h) and UnitService (committed leaves and checkpoints, unit_service.h) on a router,
// which the daemon serves over HTTP and a simulation on a SimNode.
//
//   NodeAgent agent({.env = env, .clock = clock, .transport = transport, .store = store.get(),
//                    .chain = &chain, .key = node_key},
//                   {.data_dir = dir, .endpoint = "127.0.0.1:7801", .capabilities = bench,
//                    .price = 1, .stake = 1000});
//   agent.RegisterServices(&router);
//   while (running) { ML_ASSIGN_OR_RETURN(TickReport r, agent.Tick()); if (!r.busy) wait_block; }
//
// Thread-compatible: one thread calls Tick. The registered services are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/net/blob_service.h"
#include "meshlearn/net/blob_store.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/blob_push.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/pin_book.h"
#include "meshlearn/node/secret_chain.h"
#include "meshlearn/node/stage_plane.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/node/unit_service.h"

namespace meshlearn::node {

struct AgentDeps {
  Env* env = nullptr;
  const Clock* clock = nullptr;  // measures step times (speed factor) and log times
  net::Transport* transport = nullptr;
  net::BlobStore* store = nullptr;
  ChainClient* chain = nullptr;
  KeyPair key = KeyPair::FromSeed(KeySeed{});  // the node's key: its id, owner and signer
};

struct AgentOptions {
  std::string data_dir;  // progress, checkpoints, task data files, tx outbox
  std::string endpoint;  // how peers reach this node's blob services
  uint32_t roles = ledger::kRoleSolver | ledger::kRoleAggregator;
  ledger::NodeCapabilities capabilities;  // from `node bench` (throughput x speed_factor is sent)
  ledger::Amount price = 1;               // tokens per 10^9 training FLOPs
  ledger::Amount stake = 0;               // bonded at registration
  uint64_t heartbeat_every_blocks = 5;
  // (0, 1]: a deliberately slow node, for tests and demos. It reports throughput x factor and
  // after each inner step sleeps (1/factor - 1) x the step's time (through `sleep`).
  double speed_factor = 1.0;
  std::function<void(int64_t micros)> sleep;  // null: no sleeping (virtual time)
  uint32_t max_units = 0;                     // stop taking units after this many; 0 = no limit
  // As an aggregator: after this many failed attempts to fetch a committed unit's delta from
  // anyone (its solver died before anybody copied it), report it unavailable to the ledger, which
  // re-runs the round without that solver (ReportUnavailableTx).
  uint32_t report_unavailable_after = 5;
  // A pipeline stage unit's data plane (node/stage_plane.h): its step deadline, push timeouts and
  // retries. A step that misses its deadline fails the unit, which commits nothing.
  StagePlaneOptions stage_plane;
  net::FetchOptions fetch;  // .pin is ignored: the agent pins with a reason (PinBook)
  UploadOptions upload;     // .pin/.on_complete are set by the agent (reason "upload:<h>")
  // The memory this node can really give a unit now; 0 = capabilities.memory_bytes. Units that
  // need more are refused (see above).
  uint64_t memory_limit_bytes = 0;
  // Blob clean-up (see "Blobs the node keeps").
  uint64_t gc_every_blocks = 1;
  uint64_t release_after_blocks = 100;  // after a task is closed (and its audit window)
  uint64_t upload_grace_blocks = 100;   // for uploads no open task uses
  std::vector<Hash256> keep_blobs;      // never unpinned
  bool keep_final_states = false;       // keep closed tasks' final states pinned
  // A node that left (LeaveNode, its record is unbonding) registers again at start-up
  // (RegisterNode with `stake`) instead of idling. Only the record seen by the first Tick counts:
  // a node that leaves while running stops taking work.
  bool rejoin = false;
  // An account, not a node: the challenger of late disputes (LateChallengeTx, sent by
  // `meshlearn task audit --prove` for a unit whose fraud proof is over the witness bound;
  // docs/verification.md, "Over 8 MiB: a late dispute"). It registers nothing, sends no
  // heartbeat, takes no unit, aggregation or check, and plays only the late games its key
  // challenged (node_work lists them), with the moves and witnesses a live dispute's challenger
  // sends, until they are ruled.
  bool late_challenger = false;
  // Log lines ("unit 3f2a9c01/7 r1 s2: step 20/50 loss 0.41"). Null: discarded.
  std::function<void(const std::string&)> log;
  // Checked before every inner step: true stops the unit (it resumes from its last checkpoint
  // next time) and Tick returns Unavailable. The daemon sets it on SIGTERM.
  std::function<bool()> should_stop;
  // Rounds in flight: while a unit trains, round r-1's checks run. At a checkpoint, at most this
  // often (by deps.clock; every checkpoint without a clock), the solver looks at node_work,
  // sends the verification transactions that need no computation (reveals), and pauses the unit
  // at that checkpoint when a replay with a short window waits (a verdict, a dispute move, a
  // witness); the unit resumes from there on a later tick. 0: never (the unit runs to its end).
  int64_t verification_poll_ms = 1000;
  // Testing and demos only (adversary.h, docs/operators.md): the node cheats as this kind of
  // solver in every unit it runs (copy borrows a committed delta of another solver of the same
  // round from get_task; stale re-commits its previous unit of the task). Logged loudly at start.
  Adversary adversary = Adversary::kNone;
  // As a whistleblower (roles include kRoleWhistleblower): the share of the units settled clean
  // or unchecked in a round not final yet that this node re-checks (one segment each). The draw
  // is a hash of the node key and the unit, so a restarted node draws the same units.
  double whistleblower_sample = 0.2;
  // A mismatch this node reveals (or a challenge it makes) carries the task bundle whenever the
  // ledger can narrow the dispute to one tile of one operator (ledger::TileContextOf accepts
  // it): the dispute plays the tile phase and is ruled by RefereeTile from a witness of at most
  // 256 KiB (docs/verification.md, "Tiles"). False: whole steps, as before, except where the
  // ledger refuses a mismatch without the bundle (ledger::MismatchNeedsBundle: a token task with a
  // data root, a larger classification model, a stage over the stage witness bound): that one
  // always carries it.
  bool tile_disputes = true;
  // Testing only (docs/verification.md "Stage adversaries"): with stage_plane.corrupt_sent, a
  // faulty kernel rather than a corrupted send. The node then also defends its stage's disputed
  // step as the kernel computed it: its trace of the step has the tensors it sent corrupted as
  // their operators' outputs (CorruptSentTrace, stage_unit.h), so the game narrows to a tile of
  // such an operator. False: it answers from the honest trace of what it served, and the game
  // ends at the agreed chain end, where its commit does not follow from the roots.
  bool corrupt_sent_in_trace = false;
  // Testing only: the node's stage units commit a delta that does not decode (StageRunHooks::
  // malformed_result), which the round's aggregator reports (docs/verification.md).
  bool malformed_stage_result = false;
  // Testing only: a stage node that serves its steps' evidence ("stage.step", "stage.slice") to
  // no one over the data plane (it answers NotFound, as for a step it never ran), and reads it
  // from itself alone: a verifier claims the step served nothing, and the stage answers only on
  // chain (ServeStageEvidence), as a stage that withholds until a claim forces it to.
  bool withhold_stage_evidence = false;
  // Test hook: called after each checkpoint of a unit; an error aborts the Tick as a crash
  // would (nothing after the checkpoint is written).
  std::function<Status(const Hash256& task, uint32_t index, int64_t step)> after_checkpoint;
  // Test hook: called after the recheck of a step served on chain (Disputes::RunServedRecheck)
  // journaled what it found, before its challenge is sent; an error ends the job there, as a
  // crash would (the test then restarts the node).
  std::function<Status(const Hash256& task, uint32_t index, bool mismatch)> after_served_recheck;
};

struct TickReport {
  uint64_t height = 0;
  uint32_t units_run = 0;
  uint32_t aggregations_run = 0;
  uint32_t verifications_run = 0;  // verdict replays, dispute replays, whistleblower re-checks
  bool busy = false;               // more work waits: tick again without waiting for a block
};

struct AgentStats {
  uint64_t units_completed = 0;  // delta computed and CommitUnit sent
  // Pipeline stage units run (committed or failed): the tensor bytes this node's stages sent to
  // their neighbours, the time they ran, and the part of it they waited for a neighbour's tensor.
  uint64_t stage_bytes_sent = 0;
  uint64_t stage_run_us = 0;
  uint64_t stage_wait_us = 0;
  // Stage steps this node trained with its neighbours over the data plane, and steps it re-ran
  // alone for a lost node it replaced (the resume at step k: docs/protocol.md "The resume step");
  // a kept stage that resumes at k does not train its steps 0..k-1 again.
  uint64_t stage_steps_trained = 0;
  uint64_t stage_steps_recomputed = 0;
  uint64_t stage_resumes = 0;  // runs that resumed at a step k > 0 (kept or new node)
  // What the node serves of its stage steps for their verifiers (checkpoint and tensor files on
  // disk, the step commits in memory: StageEvidence::bytes) until their rounds are final; a gauge.
  uint64_t stage_evidence_bytes = 0;
  // Whole-model trainers built (one per task a role trained, replayed or evaluated whole: the
  // whole model's weights, gradients and optimizer moments). A node that only ran stage units
  // builds none: it holds its stage, not the model.
  uint64_t whole_models_built = 0;
  // What the node's whole-model trainer holds of optimizer moments and of gradients after its
  // last aggregation, gauges: 0 and 0 on a pipeline task, whose aggregator builds no trainer (it
  // evaluates with the weights alone: TaskContext::Evaluator).
  uint64_t whole_model_moments_bytes = 0;
  uint64_t whole_model_gradient_bytes = 0;
  // The most this node held between two ticks, of a pipeline task whose whole model it never
  // built, beyond its stage units: the task's data (a text corpus, tens of MB that no stage need
  // counts) and a stage dispute trace's operator values (several times the stage's state). A
  // verification job reads either and drops it before it ends (TaskContext::ReleaseStageData,
  // Disputes::StageValueBytes): held between ticks, it would sit beside the stage unit a tick
  // may start. 0 is the rule (PipelineNetworkTest).
  uint64_t stage_held_bytes = 0;
  uint64_t units_resumed = 0;  // continued from a checkpoint
  uint64_t units_paused = 0;   // paused at a checkpoint for a verification replay
  uint64_t units_refused = 0;  // did not fit in memory (each Tick that refused one)
  uint64_t commits_ok = 0;     // CommitUnit receipts ok
  uint64_t commits_failed = 0;
  uint64_t aggregations = 0;  // CommitAggregate sent
  uint64_t aggregations_ok = 0;
  // CommitAggregate that failed because another party's transaction (a fraud proof, a forced
  // error's reveal, a check settled abandoned) re-ran its round first: an expected race, not in
  // tx_failed (Aggregator::Overtaken).
  uint64_t aggregations_overtaken = 0;
  uint64_t bad_deltas = 0;  // malformed delta blobs left out of an aggregation
  // Any transaction whose receipt failed or that was refused, but the overtaken aggregates.
  uint64_t tx_failed = 0;
  uint64_t blobs_unpinned = 0;     // pins released (their last reason ended)
  uint64_t unit_dirs_deleted = 0;  // unit checkpoint directories cleaned up
  // Verification.
  uint64_t forced_errors = 0;       // units and stage units committed as forced errors
  uint64_t secrets_revealed = 0;    // RevealSecret sent
  uint64_t replays = 0;             // segment checks run (verifier and whistleblower)
  uint64_t verdicts_committed = 0;  // CommitVerdict sent
  uint64_t mismatches = 0;          // ... of which "mismatch"
  uint64_t verdicts_revealed = 0;   // RevealVerdict sent
  uint64_t challenges = 0;          // ChallengeUnit sent
  uint64_t merits_shown = 0;        // ProveMerits sent (a silent solver's dispute, on its merits)
  uint64_t dispute_posts = 0;       // DisputePost and DisputeChildren sent
  uint64_t tile_witnesses = 0;      // RefereeTile sent
  uint64_t tile_witness_bytes = 0;  // ... the largest witness among them
  uint64_t results_checked = 0;     // result checks that had the committed final state
  uint64_t results_proven = 0;      // ProveResult sent (a result not the delta of its final state)
};

// The roles (node/src/roles/, docs/node.md).
class NodeContext;
class VerifyOutbox;
class Solver;
class Aggregator;
class Stager;
class Verifier;
class Whistleblower;
class Disputes;
class PinKeeper;
struct VerifyJob;

class NodeAgent {
 public:
  NodeAgent(AgentDeps deps, AgentOptions options);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Registers "blob.manifest", "blob.chunk", "blob.put_chunk", "blob.put_manifest",
  // "unit.manifest", "unit.checkpoint".
  void RegisterServices(net::Router* router);

  // The endpoint registered and announced (AgentOptions::endpoint), for a node that learns it only
  // once its server has bound a port (`listen = "host:0"`). REQUIRES: before the first Tick().
  void set_endpoint(std::string endpoint);

  Result<TickReport> Tick();

  const PublicKey& id() const { return deps_.key.public_key(); }
  const AgentStats& stats() const { return stats_; }
  bool registered() const { return registered_; }
  // The node's record is unbonding (it left) and it is not rejoining: it takes no work.
  bool left() const { return left_; }
  // True once the node was seen active on the ledger by this agent.
  bool was_active() const { return was_active_; }
  // Why this agent could not start (the pin book did not load); Tick returns it too.
  const Status& init_status() const { return init_status_; }
  PinBook* pin_book() { return book_.get(); }
  // Whether a stage unit's thread runs now: started and not yet ended (one that ended is collected,
  // committed or dropped, at the next Tick). On the Tick thread, between ticks.
  bool stage_unit_running() const;
  TxSender& tx_sender() { return *tx_; }

 private:
  // Tick, in two parts: what every tick does (transactions, node_work, registration, pins), and
  // the one job it runs.
  Result<std::optional<NodeWork>> Prepare(TickReport* report);
  Status RunOneJob(const NodeWork& work, TickReport* report);
  // Commits a finished stage unit and, when `replay_need` (the memory an urgent check's replay
  // will hold this tick: StageReplayNeed) leaves room for it, starts the next.
  void RunStages(const NodeWork& work, uint64_t replay_need);
  // The memory a verification job holds when it replays or traces a pipeline stage (a verdict, a
  // whistleblower's re-check, or a dispute's trace of the disputed step: the stage's
  // stage_memory_bytes, as the scheduler placed it); 0 for any other job (dispute posts and
  // witnesses hold no stage).
  uint64_t StageReplayNeed(const VerifyJob& job);
  // A stage replay that does not fit in the node's memory beside the stage unit training on the
  // Stager's thread waits for the unit to end (logged once per check): so a node that trains a
  // stage and verifies another never holds more than it offers (docs/node.md, "Stage units"). A
  // dispute's trace (or a tile's witness) answers a turn with a deadline: it waits while its turn
  // leaves it the blocks this node's stage replays take (TraceWaitEnd, from the height it first
  // waited; `height` now), then stops the unit (Stager::StopForReplay) and runs once the unit
  // ended, or beside it when the deadline is kMoveSendBlocks away, rather than lose the turn.
  bool WaitsForStageUnit(const VerifyJob& job, uint64_t height);
  // Whether a stage replay holding `replay_need` bytes may run beside a stage unit holding
  // `unit_need`: never on a node with memory_limit_bytes, else when both fit in its memory.
  bool FitsBeside(uint64_t unit_need, uint64_t replay_need) const;
  Status EnsureRegistered(uint64_t height);
  Status RegisterOrRejoin(const std::optional<NodeInfo>& me, const ledger::NodeCapabilities& caps);
  void Heartbeat(uint64_t height);
  void HandleOutcomes();
  // Polls the transactions in flight (a failure is logged; retried next time) and hands their
  // outcomes to the roles.
  void PollTransactions();
  // The roles' verification transactions that need no computation go out at once; the replays
  // they need go to `urgent` (verdicts, dispute moves, witnesses) and `later` (whistleblower
  // re-checks).
  void PlayVerification(const NodeWork& work, std::vector<VerifyJob>* urgent,
                        std::vector<VerifyJob>* later);
  Status RunVerifyJob(const VerifyJob& job);
  // Solver::set_pause's question at a unit's checkpoint (AgentOptions::verification_poll_ms).
  Status PauseForVerification();
  // Deletes the directories of checks node_work no longer lists, and the roles' state of them.
  void CleanVerifyDirs(const std::set<std::string>& live);
  void Log(const std::string& line);

  AgentDeps deps_;
  AgentOptions options_;
  bool ticked_ = false;  // set_endpoint's precondition
  std::unique_ptr<TxSender> tx_;
  std::unique_ptr<net::BlobService> blob_service_;
  std::unique_ptr<BlobUploadService> upload_service_;
  std::unique_ptr<UnitService> unit_service_;
  // AgentOptions::withhold_stage_evidence: the stage evidence's router, reached only through
  // self_transport_ (the node's transport, which answers requests to its own endpoint from it).
  std::unique_ptr<net::Router> withheld_router_;
  std::unique_ptr<net::Transport> self_transport_;
  std::unique_ptr<PinBook> book_;
  Status init_status_;
  AgentStats stats_;
  // The roles (node/src/roles/), each with one job and its own state; the tick schedules them.
  std::unique_ptr<NodeContext> node_;
  std::unique_ptr<VerifyOutbox> outbox_;
  std::unique_ptr<Solver> solver_;
  std::unique_ptr<Aggregator> aggregator_;
  std::unique_ptr<Stager> stager_;  // pipeline stage units, each on a thread of its own
  std::unique_ptr<Verifier> verifier_;
  std::unique_ptr<Whistleblower> whistleblower_;
  std::unique_ptr<Disputes> disputes_;
  std::unique_ptr<PinKeeper> pins_;

  // Membership (registration, heartbeats).
  bool registered_ = false;
  bool left_ = false;
  bool looked_ = false;  // the node's record was read once (rejoin applies only then)
  bool was_active_ = false;
  bool secret_chain_checked_ = false;
  uint64_t last_heartbeat_sent_ = 0;
  int64_t last_verification_poll_us_ = 0;
  std::atomic<uint64_t> seen_height_{0};              // the height, for the upload threads
  std::optional<std::set<std::string>> verify_dirs_;  // entries of <data_dir>/verify
  // Urgent verification jobs whose last run failed (VerifyJobKey -> the height it failed at):
  // PlayVerification runs them after the urgent jobs that have not failed (chaos seed 29).
  std::map<std::string, uint64_t> verify_job_failed_at_;
  // The need of the stage unit the Stager runs (Solver::NeedBytes), while it runs.
  uint64_t stage_unit_need_ = 0;
  std::set<std::string> replay_wait_logged_;  // VerifyJobKey of the checks logged as waiting
  // VerifyJobKey of a dispute trace that waits for the stage unit -> the height it first waited.
  std::map<std::string, uint64_t> trace_wait_from_;
  // The height of the tick that ran a stage replay (StageReplayNeed > 0), until the next tick
  // measures it, and the most blocks one took (from its tick to the next): TraceWaitEnd's bound.
  std::optional<uint64_t> replay_ran_at_;
  uint64_t stage_replay_blocks_ = 0;
};

}  // namespace meshlearn::node

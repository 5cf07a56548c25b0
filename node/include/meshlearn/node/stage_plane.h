// The data plane between the stage nodes of a pipeline replica (issue 15; docs/networking.md
// "Pipeline stages").
//
// Each stage node serves one method beside its blob and unit services, and pushes what it sends
// straight to the receiving stage's node:
//
//   "stage.push"  {record: EncodeStageTransfer, tensor: raw float32 bytes,
//                  chain: StageChainDigest of the sender's chain} -> empty
//
// A push from a sender whose chain is not the receiver's is answered Unavailable and retried:
// one of the two runs the replica on a chain that has since changed (a stage's node was
// replaced), and a run of the new chain must get the tensor, not a stale one that will be
// stopped. Without it a live stage's stale run took its neighbour's new run's step-0 tensor as a
// retry of a step it had passed (or refused the replacement's signature), and the new chain
// waited out a whole step deadline. The digest is unsigned: a wrong one only delays the push.
// The receiver then checks everything before keeping a byte: the record's shape, that it belongs to
// this replica (task, round, replica, chain length) and is addressed to this stage, the sender's
// signature against the chain's node of the sending stage, the tensor's size and hash against the
// record (content-addressed: the key's tensor is the one its hash names), and the step: the
// current one or the next are held; a later one is answered Unavailable ("not yet") and retried,
// as a replacement node may begin a step after its peers; an earlier step's push is a retry of
// something already used and is answered ok. A second tensor for a key already held or taken is
// refused as equivocation; the same tensor again is held again, for a re-run of the step. The
// stage's RunStageStep takes what is held from its inbox.
//
// Back-pressure: the inbox holds at most `inbox_bytes` from each sending stage (but always one
// tensor, whatever its size, and always the tensor the stage is waiting for); a push beyond is
// refused with ResourceExhausted and the sender retries, backing off, until the step's deadline.
// Per sender, because a stage takes each neighbour's tensors in the order that neighbour sends
// them but not the neighbours' in the order they arrive (one budget for all could hold the next
// step's activation while refusing this step's gradient total: a deadlock). Unavailable and
// DeadlineExceeded (a peer restarting, a lost answer) are retried the same way; anything else (a
// refused record) fails the step at once. A Receive waits for its tensor until the step's deadline:
// a stage that stops answering fails its neighbours' step with a DeadlineExceeded that names the
// stage, its endpoint and the tensor, and no stage's weights change (stage_step.h: the update is
// the step's last act).
//
//   StagePlane plane(ctx, stage, key, &transport, {.step_deadline_ms = 60'000});
//   plane.Register(&router);                    // then serve `router` over HTTP
//   plane.SetChain(chain, endpoints);            // stage s: node chain[s] at endpoints[s]
//   plane.BeginStep(step);                       // the deadline starts now
//   Result<StageStepOutcome> r = RunStageStep(*stage_obj, ctx, batch, seed, *plane.link());
//
// Checkpoint replication (docs/networking.md "Checkpoint replication"): at the start of every
// `checkpoint_every`-th step, before the step's first tensor, a stage sends its checkpoint of the
// step's start (ledger::StageCheckpointBytes) and its signed state claim
// (protocol/stage_state_claim.h) to its keeper stage's node (protocol::StageCheckpointKeeper):
//
//   "stage.keep"  {claim: EncodeStageStateClaim, checkpoint: the checkpoint file's bytes,
//                  chain: StageChainDigest of the sender's chain} -> empty
//
// The keeper checks the claim's replica and signature against its chain (another chain:
// Unavailable, retried, as a push) and that the checkpoint hashes to the claimed state, and keeps
// the newest of each stage it keeps (kept()), across SetChain: the point is that a stage's
// checkpoint outlives its node. So the node that replaces a lost stage restores a state that its
// lost node signed, and the replica resumes from that step rather than from the round's start.
//
// Thread-safety: the handlers run on the server's threads; link() and KeepCheckpoint are used by
// one thread (the stage's); BeginStep from that thread; stats() and kept() from any.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/encoding.h"  // kMaxEncodedLength
#include "meshlearn/base/sign.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/node/stage_step.h"
#include "meshlearn/protocol/stage_state_claim.h"

namespace meshlearn::node {

inline constexpr char kMethodStagePush[] = "stage.push";
inline constexpr char kMethodStageKeep[] = "stage.keep";
inline constexpr char kMethodStageResume[] = "stage.resume";

// What a stage's run answers "stage.resume" {chain: StageChainDigest} (its plane's, on that
// chain; Unavailable on another, or before the run offers it): the steps the run holds at its
// start (a kept stage's steps 0..held-1 of a run that lost a neighbour; 0 for a run from the
// round's start), and, once the run decided, the step it trains from (stage_resume.h).
struct StageResumeAnswer {
  uint64_t held = 0;
  std::optional<uint64_t> start;  // unset: not decided yet
};

struct StagePlaneOptions {
  uint64_t inbox_bytes = 256ull << 20;      // held from one sending stage, not yet taken
  uint64_t max_tensor_bytes = 64ull << 20;  // one push (larger ones are refused, unread)
  int64_t step_deadline_ms = 120'000;       // from BeginStep to the step's last receive or send
  int64_t request_timeout_ms = 10'000;      // one push
  int64_t retry_initial_ms = 2;             // backoff after a refused or failed push, doubling
  int64_t retry_max_ms = 100;
  // A stage replicates its checkpoint of every `checkpoint_every`-th step's start to its keeper
  // (0: none; step 0's start is the round's, which every node reads from the chain). The default
  // is every step: the newest step start of a lost stage then outlives it, for one checkpoint's
  // bytes per step and stage (a stage's parameters and optimizer moments; measured in
  // StagePlaneStats::checkpoint_bytes_sent). The Stager sets the task's checkpoint_interval
  // when the task has one. A checkpoint over max_checkpoint_bytes is not sent
  // (checkpoints_skipped): the replica then resumes from an earlier one, or the round's start.
  uint64_t checkpoint_every = 1;
  uint64_t max_checkpoint_bytes = kMaxEncodedLength - 4096;
  // Keeps a copy of every tensor the stage sends in a step (sent()), as it keeps what it
  // received: what a kept stage serves the node that replaces a lost neighbour, which re-runs the
  // lost stage's earlier steps from them (stage_resume.h). Off by default (the same order of
  // bytes as the received tensors); the node's Stager turns it on.
  bool keep_sent = false;
  // Testing only (an adversary that computes its part honestly and sends corrupted tensors;
  // docs/verification.md "Pipeline stages"): a tensor whose key this matches is sent, and
  // signed, as CorruptedStageTensor of it.
  std::function<bool(const protocol::StageTensorKey&)> corrupt_sent;
  // Testing only, with corrupt_sent: the record Send returns (the one the stage's commit lists
  // among what it sent) is its signature of the tensor it computed, not of the corrupted one it
  // sent. A stage that signs one tensor to its neighbour and commits another: only the two
  // commits together show it (ledger::StageRecordWitness with other; node/task_audit.h).
  bool commit_uncorrupted = false;
};

// What StagePlaneOptions::corrupt_sent sends for `values`: the first value changed by 1e-3 (an
// empty tensor as it is). A stage that claims the corrupted tensor as its operator's output in a
// dispute (CorruptSentTrace, stage_unit.h) derives it here too.
std::vector<float> CorruptedStageTensor(std::span<const float> values);

// What this stage measured of its link to one peer stage: the pushes that peer took. A measure
// of the link (bytes over the time its pushes took, the fastest push's round trip) for placing
// consecutive stages on well-connected nodes: the node reports it to the ledger (MeasuredLinks,
// ReportLinksTx) and protocol::PlaceStages pairs stages by it.
struct StageLinkStats {
  uint64_t pushes = 0;
  uint64_t bytes = 0;        // tensor bytes
  uint64_t push_us = 0;      // the taken pushes' round trips, summed (microseconds)
  uint64_t min_push_us = 0;  // the fastest one
};

struct StagePlaneStats {
  std::map<uint32_t, StageLinkStats> links;  // by the receiving stage
  uint64_t pushes_sent = 0;                  // pushes the peers took
  uint64_t bytes_sent = 0;                   // tensor bytes in them
  uint64_t push_retries = 0;                 // pushes sent again (busy, unavailable, timed out)
  uint64_t pushes_taken = 0;                 // pushes this stage took into its inbox
  uint64_t refused_busy = 0;                 // pushes this stage refused: inbox full
  uint64_t duplicates = 0;  // pushes of a key held or of an earlier step, answered ok
  uint64_t peak_inbox_bytes = 0;
  uint64_t checkpoints_sent = 0;       // KeepCheckpoint's, taken by the keeper
  uint64_t checkpoint_bytes_sent = 0;  // their checkpoint bytes
  uint64_t checkpoints_skipped = 0;    // over max_checkpoint_bytes: not sent
  uint64_t checkpoints_kept = 0;       // "stage.keep" pushes this stage took
  // Time Take waited for a neighbour's tensor: the stage's share of the pipeline's bubble (and of
  // any neighbour that is slow or starved of a core), in microseconds.
  uint64_t wait_us = 0;
};

// The links `stats` measured, as a node reports them (ledger ReportLinksTx), sorted by peer:
// for every peer stage whose pushes moved bytes, its node chain[stage] with
//   latency_ms            = min_push_us / 1000: the fastest push's round trip, in whole
//                           milliseconds (a push carries a tensor, so this is an upper bound of
//                           the link's latency), at most protocol::kMaxLinkLatencyMs;
//   bandwidth_bytes_per_s = bytes x 10^6 / push_us: the bytes its pushes moved per second of
//                           their round trips, in [1, protocol::kMaxLinkBandwidthBytesPerS].
// A stage with no pushes taken (or none of any bytes), or not in `chain`, gives none.
std::vector<ledger::NodeLink> MeasuredLinks(const StagePlaneStats& stats,
                                            std::span<const protocol::NodeId> chain);

// A stage's checkpoint as its keeper holds it: the state claim its node signed and the
// checkpoint's bytes (ledger::StageCheckpointState loads them; their StateHash is claim.state).
struct KeptCheckpoint {
  protocol::StageStateClaim claim;
  Bytes checkpoint;
};
// What a keeper checks before it keeps a checkpoint, and a node before it restores one: the claim
// verifies as `signer`'s (the chain's node of the claimed stage), and the checkpoint loads and
// hashes to the claimed state. PermissionDenied or InvalidArgument naming the claim.
Status CheckKeptCheckpoint(const KeptCheckpoint& k, const protocol::NodeId& signer);

class StagePlane {
 public:
  // Stage `stage` of ctx's replica, signing with `key` (ctx.chain[stage] must be its public key).
  // `transport` must outlive the plane.
  StagePlane(StageContext ctx, int stage, const KeyPair& key, net::Transport* transport,
             StagePlaneOptions options = {});
  ~StagePlane();
  StagePlane(const StagePlane&) = delete;
  StagePlane& operator=(const StagePlane&) = delete;

  // Registers "stage.push" (bodies up to max_tensor_bytes and the record), "stage.keep" and
  // "stage.resume".
  void Register(net::Router* router);
  // The replica's nodes and where they serve: chain[s] and endpoints[s] for stage s (this
  // stage's own endpoint is unused). Set before a step that sends anything -- a node serves first
  // and learns its peers' endpoints after (the chain's node registry) -- and again when a stage's
  // node is replaced: what is held from a node no longer in the chain is dropped.
  // REQUIRES: both of ctx.stages() entries, chain[stage] this node's key.
  void SetChain(std::vector<protocol::NodeId> chain, std::vector<std::string> endpoints);
  // The context RunStageStep must be given (the chain as last set).
  StageContext context() const;
  // Step `step` begins (or begins again: a replica that failed a step, or rolls back to an
  // earlier one, resumes from its stages' checkpoints and calls it with that step): its deadline
  // is step_deadline_ms from now; what is held for earlier steps is dropped, what is held for it
  // and the next is kept (tensors are a pure function of the step's inputs: a re-run sends the
  // same ones).
  void BeginStep(uint64_t step);
  // Ends the unit's run: every Receive and Send waiting now or later fails at once
  // (FailedPrecondition), BeginStep included, and every push from then on is answered
  // Unavailable (the sender retries: a fresh assignment of the unit runs on a new plane, which
  // must get those tensors). For a unit no longer assigned (its round re-ran, it expired, or a
  // stage of its replica was replaced), so that the node does not hold it up to a step deadline.
  // Thread-safe.
  void Cancel();
  // The link RunStageStep uses for the current step.
  StageLink* link();
  // The resume (stage_resume.h, StartStageRun): "stage.resume" answers nothing (Unavailable)
  // until the run offers what it holds at its start, then that, and the step it trains from
  // once decided. A run that offers steps takes no push until it decided to resume at one of
  // them (Unavailable: retried), since it may yet re-run from the round's start on a plane of its
  // own.
  // Thread-safe.
  void OfferResume(uint64_t held);
  void DecideStart(uint64_t step);
  // Stage `stage`'s "stage.resume" answer on this plane's chain, retried as a push is (its node
  // runs the unit on another chain, or not yet: Unavailable) until `deadline_ms` from now; with
  // `decided`, until the answer carries the step its run trains from. DeadlineExceeded naming
  // the stage then; FailedPrecondition once the plane is cancelled; the answer's other errors.
  Result<StageResumeAnswer> AskResume(uint32_t stage, int64_t deadline_ms, bool decided);
  // After BeginStep(step), before the step's first tensor: when the step is due (a multiple of
  // checkpoint_every, not 0) and the chain has a keeper, sends `state` (the stage's state at the
  // step's start) and its signed claim to the keeper, retried as a push until the step's
  // deadline. Ok and nothing sent when not due, or over max_checkpoint_bytes (counted skipped).
  // Errors: a push's (the keeper did not take it).
  Status KeepCheckpoint(uint64_t step, engine::TrainState& state);
  // The newest checkpoint this stage keeps of each stage (by stage), whatever chain sent it.
  std::map<uint32_t, KeptCheckpoint> kept() const;
  // The tensors the stage took this step, by hash (StageTensorBytes): what it serves verifiers
  // (stage_evidence.h). A copy of each is kept until the next BeginStep.
  std::map<Hash256, Bytes> received() const;
  // With keep_sent, the tensors the stage sent this step, by hash (as received()); else empty.
  std::map<Hash256, Bytes> sent() const;
  // The step's received() and sent() together, moved out (the plane holds neither after): what
  // the step's evidence writes to its files (StageEvidence::Publish), without a second copy of
  // the step's tensors in memory. Call it once the step ended.
  std::map<Hash256, Bytes> TakeStepTensors();
  StagePlaneStats stats() const;
  // Whether a receive waits for a tensor now (a test that stops the plane under it waits for
  // this, rather than guess how long the receive takes to start waiting). Thread-safe.
  bool awaiting() const;

  // The handlers of "stage.push" and "stage.keep" (public for tests that drive them without
  // HTTP).
  Result<Bytes> HandlePush(const net::Request& request);
  Result<Bytes> HandleKeep(const net::Request& request);
  Result<Bytes> HandleResume(const net::Request& request);

 private:
  class Link;
  struct Held {
    protocol::StageTransfer record;
    std::vector<float> values;
  };
  Result<std::vector<float>> Take(const protocol::StageTensorKey& key,
                                  protocol::StageTransfer* record);
  Result<protocol::StageTransfer> Push(const protocol::StageTensorKey& key,
                                       std::span<const float> values);
  // Sends `body` as `method` to stage `to`'s node, retrying a busy, unavailable or timed-out
  // answer with the doubling backoff until the step's deadline; `what` names it in errors. The
  // round trip of the push taken, in microseconds.
  Result<uint64_t> Deliver(const char* method, const Bytes& body, uint32_t to,
                           const std::string& what);
  std::string PeerName(uint32_t stage) const;             // REQUIRES: mu_ held
  void StageUnhold(uint32_t from_stage, uint64_t bytes);  // REQUIRES: mu_ held

  StageContext ctx_;      // its chain: guarded by mu_ (the rest never changes)
  Hash256 chain_digest_;  // StageChainDigest(ctx_.chain): guarded by mu_
  const uint32_t stage_;
  const uint32_t stages_;  // the chain's length
  const KeyPair key_;
  net::Transport* const transport_;
  const StagePlaneOptions options_;
  std::unique_ptr<Link> link_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> endpoints_;  // by stage
  uint64_t step_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  bool cancelled_ = false;
  std::map<protocol::StageTensorKey, Held> inbox_;
  std::map<protocol::StageTensorKey, Hash256> taken_;  // this step's, by key
  std::map<Hash256, Bytes> received_;                  // this step's, by hash
  std::map<Hash256, Bytes> sent_;                      // this step's, by hash (keep_sent)
  uint64_t held_bytes_ = 0;
  std::map<uint32_t, uint64_t> held_from_;  // by sending stage
  protocol::StageTensorKey awaited_;        // what Take waits for (default: nothing)
  StagePlaneStats stats_;
  std::map<uint32_t, KeptCheckpoint> kept_;  // by the stage kept
  std::optional<StageResumeAnswer> resume_;  // what "stage.resume" answers (OfferResume)
};

// The digest of a replica's chain (its stages' nodes in order) that a push carries.
Hash256 StageChainDigest(std::span<const protocol::NodeId> chain);
// The body of a push (what StagePlane sends; for tests of the handler): `chain` is the sender's
// StageChainDigest.
Bytes EncodeStagePush(const protocol::StageTransfer& record, std::span<const float> values,
                      const Hash256& chain);

}  // namespace meshlearn::node

// One pipeline stage's training step (issue 15): the stage's half of engine::RunPipelineStep,
// talking to its neighbours through a StageLink.
//
// RunStageStep is the one derivation of what a stage receives, computes and sends in a step; the
// node's data plane (node/stage_plane.h: peers over HTTP), its in-process links
// (node::MemoryStageNetwork: tests, one machine), a verifier's replay and the ledger's ruling of a
// stage dispute (stage_replay.h: inputs from the stage's commitment) all run it. It lives in the
// ledger's core, not in node/, because the ledger executes it to rule a stage step
// (RefereeStageStepTx) and is the one library that links both the engine (the stage's model) and
// the protocol (the signed transfer records); protocol/ links base only and engine/ knows no
// signed records. The node calls the same functions (node/stage_step.h re-exports them). The
// order, which every stage follows (engine/pipeline.h has the why of each part):
//   0. a GPT cut into S > 1 stages: stage 0 sends wte, the last stage receives it (the head's
//      copy; the record carries the step that uses it);
//   1. for m = 0..M-1: receive the activations of micro-batch m from stage s-1 (not stage 0),
//      forward, send the output to stage s+1 (not the last stage);
//   2. for m = 0..M-1: receive d loss / d output from stage s+1 (not the last stage), backward,
//      send d loss / d input to stage s-1 (not stage 0);
//   3. a GPT: the last stage sends its head's wte gradient to stage 0, which adds it (S = 1: the
//      stage adds its own);
//   4. the sum of squares: receive the running sum from s-1 (0 for stage 0), add the stage's,
//      send it on to s+1; the last stage sends the total to every other stage;
//   5. the update with norm = sqrt(total).
// The stage's weights change only in step 5, after everything was received and sent: a step that
// fails (a peer silent past the deadline, a tensor refused) leaves the stage's StateHash as it
// was, never half-applied. The stages of a replica then resume together from their checkpoints
// of the step's start (the replica-level rollback is the caller's).
//
// Its stages' parameters after any number of steps equal, bit for bit, RunPipelineStep's and so
// the unsplit model's (stage_test.cc).
//
//   StageContext ctx{task, round, replica, chain};
//   node::MemoryStageNetwork net(ctx, keys);              // or an HttpStageLink per node
//   Result<StageStepOutcome> r = RunStageStep(*stage, ctx, batch, dropout_seed, *net.link(s));
//
// Thread-safety: one thread per Stage.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/protocol/stage_transfer.h"

namespace meshlearn::ledger {

// Which replica chain a stage belongs to. chain[s]: the node of stage s (it signs what stage s
// sends).
struct StageContext {
  protocol::TaskId task;
  uint32_t round = 0;
  uint32_t replica = 0;
  std::vector<protocol::NodeId> chain;
  // How the replica's stages tile what they send (TileColsOf): in rows of tile_cols floats (a
  // GPT's n_embd: StageTileCols), or, when tile_rows > 0 (a sequential model's micro-batch
  // samples: StageTileRows), in tile_rows rows, whatever a boundary's width. A record tiled
  // otherwise is refused, as its tiles would not be the stage tile plan's.
  uint32_t tile_cols = 0;
  int64_t tile_rows = 0;
  uint32_t stages() const { return static_cast<uint32_t>(chain.size()); }
  // The row width a tensor of `floats` is tiled in: floats / tile_rows when tile_rows > 0 (0, one
  // row, for a size it does not divide: the one-float sums), else tile_cols.
  uint32_t TileColsOf(size_t floats) const;
  // The key of a tensor of this replica.
  protocol::StageTensorKey Key(protocol::StageTensorKind kind, uint32_t from, uint32_t to,
                               uint64_t step, int64_t micro_batch = -1) const;
};

// A stage's connection to its neighbours in one replica.
class StageLink {
 public:
  virtual ~StageLink() = default;
  // The tensor of `key` (addressed to this stage) and the sender's signed record, checked: the
  // record verifies against the chain's node of key.from_stage and the values hash to it.
  // Errors name the key (a silent peer: DeadlineExceeded).
  virtual Result<std::vector<float>> Receive(const protocol::StageTensorKey& key,
                                             protocol::StageTransfer* record) = 0;
  // Sends `values` under `key` (from this stage), signed by this stage's node; returns the record.
  virtual Result<protocol::StageTransfer> Send(const protocol::StageTensorKey& key,
                                               std::span<const float> values) = 0;
};

struct StageStepOutcome {
  float loss = 0;       // the last stage: the mean of the micro-batch losses (others: 0)
  float grad_norm = 0;  // every stage: sqrt of the total sum of squares, before clipping
  protocol::StageStepCommit commit;  // what the stage commits for the step
};

// One training step of `stage` (stage stage.index() of ctx's chain) on the step's whole `batch`
// (split into the stage's micro-batches), at step stage.state().step. See the top of the file.
// REQUIRES: stage.index() < ctx.stages().
Result<StageStepOutcome> RunStageStep(engine::Stage& stage, const StageContext& ctx,
                                      const engine::Batch& batch, uint64_t dropout_seed,
                                      StageLink& link);

// How a task's stages tile the tensors they exchange, as the stage's tile plan views them
// (engine::PlanStageStepTiles; StageContext's two fields). A GPT's are rows of n_embd (its tied
// tensors too); a sequential model's are the micro-batch's samples (batch_size / micro_batches
// rows), a width per boundary: StageTileCols 0 and StageTileRows the rows.
uint32_t StageTileCols(const engine::ModelSpec& model);
int64_t StageTileRows(const engine::ModelSpec& model, int64_t batch_size, int64_t micro_batches);

// Raw little-endian float32 bytes: how a tensor travels and is stored as a blob (its address is
// engine::TensorHash of the values).
Bytes StageTensorBytes(std::span<const float> values);
// REQUIRES: bytes.size() % 4 == 0.
std::vector<float> StageTensorFromBytes(ByteSpan bytes);

// A signed record of `values` under `key`: their TensorHash and their tiled root in rows of
// `tile_cols` floats (engine::StageTensorGrid; the sender's StageContext::TileColsOf).
protocol::StageTransfer SignStageTensor(const protocol::StageTensorKey& key,
                                        std::span<const float> values, const KeyPair& sender,
                                        uint32_t tile_cols = 0);
// CheckReceivedTensor and CheckReceivedTiles of `values` against `record` (both its hashes).
Status CheckStageTensorValues(const protocol::StageTransfer& record, std::span<const float> values);
// VerifyStageTransfer against chain[key.from_stage], the record tiled as ctx.TileColsOf its size,
// then CheckStageTensorValues.
Status CheckStageTensor(const protocol::StageTransfer& record, std::span<const float> values,
                        const StageContext& ctx);

}  // namespace meshlearn::ledger

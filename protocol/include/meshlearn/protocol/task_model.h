// The task model: every fact of a network task that more than one party derives, defined once.
//
// Bit-exact re-execution only works if the solver, the verifiers, the whistleblowers, both
// referees (the genesis referee in node/ and the ledger's RefereeStepTx), the auditor, the
// in-process reference (`meshlearn diloco`) and the submitter's CLI all derive the same H, k,
// unit streams, learning-rate scales and segment boundaries. Each of them calls the functions
// below and derives none of these facts itself.
//
//   ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Parse(task_text, "task.toml"));
//   ML_ASSIGN_OR_RETURN(NetworkSpec net, NetworkSpec::FromConfig(cfg));   // the one parser
//   UnitWork w = UnitWorkOf(net, task_seed, content_id, round, shard);    // what a unit trains
//   for (int64_t s : HashedSteps(w.inner_steps, w.checkpoint_interval)) ...  // its state hashes
//   SegmentSteps seg = SegmentStepsOf(net.inner_steps, net.checkpoint_interval, j);
//
// The [network] table of a task file says how a training task is cut into rounds and work units
// and how the round results are combined (docs/architecture.md, "One task, end to end", steps 2
// and 5). The rest of the file ([task], [data], [model], [optimizer], [train]) is the engine's
// TaskSpec; its [optimizer] is the inner optimizer each unit runs.
//
//   [network]
//   rounds = 12               # outer (DiLoCo) rounds
//   units_per_round = 4       # work units per round (data shards)
//   inner_steps = 50          # H: inner optimizer steps per unit
//   checkpoint_interval = 10  # k: state hash committed every k steps (verification segments);
//                             # 1..inner_steps, default inner_steps (one segment)
//   aggregation = "mean"      # mean | trimmed_mean | median | centered_clip | krum
//   trim_fraction = 0.125     # trimmed_mean
//   clip_radius = 0.0         # centered_clip (0: automatic)
//   krum_select = 1           # krum
//   outer_lr = 0.7            # DiLoCo outer Nesterov SGD
//   outer_momentum = 0.9
//   outer_nesterov = true
//   inner_lr_final = 1.0      # inner lr factor of the last round; rounds decay linearly to it
//   verification_window_blocks = 5  # blocks after a round's aggregate in which a whistleblower
//                             # may still challenge its units (docs/verification.md)
//   verification = "exact"    # exact (state hashes must match) | tolerance (hardware without
//                             # bitwise reproducibility: distances within profiled thresholds)
//   tolerance_rel_l2_ppm = 0  # tolerance mode; 0: profiled by `task submit`
//   tolerance_cosine_gap_ppb = 0
//   assurance = "economic"    # economic | full | target: how much of the work is replayed
//                             # (protocol/verification.h PlanCheck; docs/submitters.md)
//   target_escape_ppm = 10000 # target: at most this chance (per 10^6) that one corrupted
//                             # segment escapes its check
//   budget = 1000000          # tokens escrowed by the submitter
//   price_cap = 100           # highest price per GFLOP accepted from a solver
//   stages = 1                # pipeline stages per replica (issue 15; 1: no pipeline). Each unit
//                             # of a round is a replica; [train] micro_batches is M.
//   cut = [0, 1, 3, 5, 6]     # optional: stage s holds layers [cut[s], cut[s+1]) (a GPT's
//                             # blocks); without it engine::ChooseCut balances FLOPs and memory
//
// Every value is validated; errors name the file, the key and the fix. All functions are pure
// and thread-safe; NetworkSpec::Load reads the file through the Env it is given and nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshlearn/base/config.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/types.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::protocol {

inline constexpr int64_t kMaxPipelineStages = 256;

struct NetworkSpec {
  uint32_t rounds = 0;
  uint32_t units_per_round = 0;
  uint32_t inner_steps = 0;
  // k. FromConfig gives 1..inner_steps; a file that leaves it out gets inner_steps (only the
  // start and the end of a unit are hashed: one segment). That default lives in FromConfig alone,
  // so every reader of a task file (quote, submit, devnet, diloco, the nodes' bundles, the
  // ledger's referee) and the ledger's TaskParams see the same k.
  uint32_t checkpoint_interval = 0;
  AggregationConfig aggregation;
  OuterOptimizerConfig outer;
  // The inner optimizer's learning rate in round r is lr x InnerLrScale(r): 1 in round 0,
  // falling linearly to inner_lr_final in the last round (integer ratio, exact in double).
  double inner_lr_final = 1.0;
  double InnerLrScale(uint32_t round) const;
  uint64_t verification_window_blocks = 5;
  bool tolerance_mode = false;
  uint32_t tolerance_rel_l2_ppm = 0;      // 0: profile at submission
  uint32_t tolerance_cosine_gap_ppb = 0;  // 0: profile at submission
  AssuranceLevel assurance;               // economic unless the file says
  uint64_t budget = 0;
  uint64_t price_cap = 0;
  // Pipeline-parallel replicas (issue 15): each unit trained as `stages` stages. `cut` (empty:
  // chosen by engine::ChooseCut) has stages + 1 increasing bounds from 0; its last bound and the
  // stage count against the model are checked by engine::TaskPipelineCut. Not yet run by the
  // network: `task submit` refuses stages > 1; `meshlearn diloco` computes the result.
  uint32_t stages = 1;
  std::vector<int64_t> cut;

  // Parses the [network] table of `cfg` (the whole task file). A missing table, a missing
  // required key (rounds, units_per_round, inner_steps), an unknown key and a value out of range
  // are InvalidArgument naming "network.<key>".
  static Result<NetworkSpec> FromConfig(const ConfigFile& cfg);
  static Result<NetworkSpec> Load(Env* env, const std::string& path);
};

// Facts of a network task that come from its model and data rather than from the [network]
// table (node::ComputeTaskFacts computes them from a trainer; the ledger's TaskParams carry them).
struct TaskFacts {
  uint64_t num_params = 0;
  uint64_t model_bytes = 0;  // 4 x num_params
  // What a node needs to train one whole (unsplit) unit: node::UnitMemoryBytes, engine::CutCosts
  // of the whole model as one stage at the task's batch, seq_len and micro_batches (weights,
  // gradients, optimizer moments, activations). TaskParams::memory_bytes, which the ledger's
  // scheduler places units by (protocol::RequiredMemoryBytes) and the node refuses units by.
  uint64_t memory_bytes = 0;
  uint64_t flops_per_sample = 0;  // node::EstimateFlopsPerSample
  uint64_t num_examples = 0;      // training examples (token windows: tokens)
  uint32_t batch_size = 0;
  uint64_t seed = 0;
  // The id the unit streams are derived from: engine::TaskContentId of the task, a hash of its
  // name, seed and model. Units use UnitId{content_id, round, shard}, never the ledger's task
  // id, so a network run and the in-process reference train on the same streams, and the ledger
  // derives the same id from the bundle alone.
  Hash256 content_id;
  // The Merkle root over the training examples (engine::DataTree, node/step_witness.h
  // TaskDataRoot): TaskParams::data_root, which lets the ledger execute a disputed step itself.
  // Declared for every task, whatever its model's size (a verifying chain refuses an exact-mode
  // task without one). A token task: the root over its train stream's pages
  // (engine::TokenPageTree), which proves the tokens a disputed tile reads, with
  // data_page_tokens = engine::kTokenPageTokens. Computing it hashes the training set once.
  Hash256 data_root;
  uint32_t data_page_tokens = 0;  // TaskParams::data_page_tokens
  // A pipeline task (stages > 1), from its cut (node::StageTermsOf): per stage, the memory a
  // node needs to run it and its training FLOPs of one step (TaskParams::stage_memory_bytes and
  // stage_flops, which the ledger places stages by), and the bytes a step moves across each
  // boundary (engine::CutBoundaryBytes; TaskParams::stage_boundary_bytes, the link cost it pairs
  // the stages' nodes by). Empty for one stage, and for a cut the [network] table cannot make
  // (node::AddPipelineTerms then names the fault to the submitter, and a node refuses the task).
  std::vector<uint64_t> stage_memory_bytes;
  std::vector<uint64_t> stage_flops;
  std::vector<uint64_t> stage_boundary_bytes;
  // A pipeline task: what its aggregator's evaluator holds (the whole model's weights and one
  // evaluation forward's activations: node::StageTermsOf, engine::EstimateEvaluationMemory);
  // TaskParams::eval_memory_bytes. 0 for one stage.
  uint64_t eval_memory_bytes = 0;
};

// The work of one unit: what the solver trains and every checking party replays.
struct UnitWork {
  uint64_t stream = 0;              // the unit's stream id (UnitSeed)
  int64_t inner_steps = 0;          // H
  int64_t checkpoint_interval = 0;  // k; 0 = only the start and the end are hashed
  double lr_scale = 1.0;            // inner learning-rate factor of this unit's round
};

// The id of unit (round, shard): UnitId{content_id, round, shard} (see TaskFacts::content_id).
UnitId RoundUnitId(const Hash256& content_id, uint32_t round, uint32_t shard);

// The work of unit (round, shard): its stream, H, k and the round's inner-rate factor.
UnitWork UnitWorkOf(const NetworkSpec& net, uint64_t task_seed, const Hash256& content_id,
                    uint32_t round, uint32_t shard);
inline UnitWork UnitWorkOf(const NetworkSpec& net, const TaskFacts& facts, uint32_t round,
                           uint32_t shard) {
  return UnitWorkOf(net, facts.seed, facts.content_id, round, shard);
}

// Steps after which a unit of `inner_steps` steps with checkpoint interval `k` hashes its state:
// 0, k, 2k, ... below H, and H (once, even where k divides H). k = 0 hashes 0 and H only, as
// k = H does. The unit's commitment is the Merkle root over these states' hashes; segment j runs
// from the state after HashedSteps[j] to the state after HashedSteps[j + 1], and there are
// SegmentCount(H, k) (verification.h) segments.
std::vector<int64_t> HashedSteps(int64_t inner_steps, int64_t k);

// Segment `segment` of a unit: it replays from the state after `first_step` to the state after
// `last_step` (HashedSteps[segment], HashedSteps[segment + 1]). REQUIRES: segment <
// SegmentCount(inner_steps, k).
struct SegmentSteps {
  uint64_t first_step = 0;
  uint64_t last_step = 0;
};
SegmentSteps SegmentStepsOf(uint64_t inner_steps, uint64_t k, uint32_t segment);

}  // namespace meshlearn::protocol

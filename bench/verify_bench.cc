// verify_bench: what sampled verification costs, and how often a cheater gets through, at the
// default VerificationParams, against verification by replication (every unit run twice: 100%
// overhead, escape 0). Targets (issue 6): overhead < 10% and escape < 1% for a solver faking 10%
// of its steps.
//
//   verify_bench [--benchmarks=economics,simulate,replay] [--task=examples/fashion-mlp.toml]
//                [--solvers=4] [--tasks=20000] [--repeats=2]
//
// The parameters are the chain's defaults (ledger::ChainParams: its VerificationParams,
// verifiers_per_unit, slash_multiple). The task shape comes from --task's [network] table: H, k,
// and units per solver = rounds x units_per_round / --solvers. One JSON object per line:
// economics  computed (protocol/economics.h) for a long-lived node at the steady state (checked
//            with the floor probability): verifier overhead, and per cheating pattern (lazy; 10%
//            of steps spread at random; 10% in one segment) the detection per unit, the escape
//            probability over a task and the expected gain of cheating, at the chain's slash
//            multiple.
// simulate   the same cheaters through --tasks simulated tasks with the ledger's real draws
//            (SelectedForVerification, SegmentsToReplay; SimulateSolver): measured against
//            computed, with the standard error of the measurement.
// replay     real compute: one unit of the task (node::UnitExecutor, H steps) against
//            node::ReplaySegment of each of its segments from the solver's checkpoints (plus the
//            checkpoint's decoding), best of --repeats. measured_overhead = p V (replay + load) /
//            unit, the same as the computed p V r / S but with the measured segment/unit ratio.
// referee    (not in the default list) the tile referee (issue 16), one line per model (the
//            fashion MLP of --task, examples/fashion-cnn.toml, and examples/code-gpt-10m.toml at
//            batch 8 x 256): parameters;
//            commitment_fraction, what training pays per step: the state's hash, its tiled
//            commitment (engine/checkpoint.h's StateHash: every tensor's tiled root), once per
//            checkpoint_interval steps, over an untraced step's time (state_hash_step_fraction:
//            the same if every step were hashed);
//            trace_commit_fraction, what one traced step costs more than a plain one (OpTrace's
//            tiled roots of every operator output, paid by the two parties of a dispute for the
//            one disputed step; medians of --referee-steps steps); and where the tile
//            rule covers the model's operators (engine/tile_rule.h; covered_operators of
//            computed_operators): the turns to reach a tile, the largest witness of a covered
//            operator's tile (EncodeTileWitness bytes; bound 256 KiB) and the ledger's time to
//            rule it (RuleTile), checked to give the traced tile.
// summary    last line: the headline numbers, replication's, and whether the targets are met.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/node/network_task.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/economics.h"

#include "bench_util.h"

namespace {

using namespace meshlearn;
using namespace meshlearn::protocol;
using nlohmann::json;

double Seconds(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string SourceDir() {
  for (std::string d : {std::string("."), std::string(".."), std::string(MESHLEARN_SOURCE_DIR)}) {
    if (std::filesystem::exists(d + "/examples/fashion-mlp.toml")) return d;
  }
  return MESHLEARN_SOURCE_DIR;
}

[[noreturn]] void Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "verify_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

struct Pattern {
  const char* name;
  CheatPattern cheat;
};
const Pattern kPatterns[] = {
    {"lazy", {.faked_fraction = 1.0}},
    {"spread10", {.faked_fraction = 0.1, .spread = CheatSpread::kCheatSpreadSteps}},
    {"segment10", {.faked_fraction = 0.1, .spread = CheatSpread::kCheatSpreadSegments}},
};

json ParamsJson(const VerificationParams& p, uint32_t slash_multiple, const TaskShape& shape) {
  return {{"trusted_after", p.trusted_after},
          {"floor_permille", p.floor_permille},
          {"segments_per_check", p.segments_per_check},
          {"forced_error_per_million", p.forced_error_per_million},
          {"slash_multiple", slash_multiple},
          {"units_per_solver", shape.units_per_solver},
          {"inner_steps", shape.inner_steps},
          {"checkpoint_interval", shape.checkpoint_interval},
          {"verifiers_per_unit", shape.verifiers_per_unit}};
}

// Real compute of one unit and of its segment replays.
struct ReplayTiming {
  double unit_s = 0;               // UnitExecutor::Run, no checkpoints
  double unit_checkpointed_s = 0;  // the same, saving a checkpoint at every hashed step (a solver)
  double replay_s = 0;             // mean over segments of ReplaySegment
  double load_s = 0;               // mean over segments of decoding the start checkpoint (0: none)
  int threads = 0;
};

ReplayTiming TimeReplay(const std::string& task_path, const TaskShape& shape, int repeats) {
  Result<engine::TaskSpec> spec = engine::TaskSpec::Load(Env::Default(), task_path);
  if (!spec.ok()) Fail(task_path, spec.status());
  Result<std::unique_ptr<engine::Trainer>> trainer = engine::Trainer::Create(Env::Default(), *spec);
  if (!trainer.ok()) Fail("trainer", trainer.status());
  engine::Trainer* tr = trainer->get();
  const std::vector<float> global = tr->FlatParams();
  const UnitId unit{Blake2b("verify_bench"), 0, 0};
  const node::UnitWork work{.stream = UnitSeed(spec->seed, unit),
                            .inner_steps = static_cast<int64_t>(shape.inner_steps),
                            .checkpoint_interval = static_cast<int64_t>(shape.checkpoint_interval),
                            .lr_scale = 1.0};
  const uint32_t segments = SegmentCount(shape.inner_steps, shape.checkpoint_interval);
  ReplayTiming t;
  t.threads = engine::GetKernelConfig().threads;
  t.unit_s = t.unit_checkpointed_s = 1e30;
  std::vector<double> replay(segments, 1e30), load(segments, 0.0);
  MemEnv env;
  std::vector<Hash256> leaves;
  for (int rep = 0; rep < repeats; ++rep) {
    node::UnitExecutor ex(tr);
    const double plain = Seconds([&] {
      Result<node::UnitOutcome> out = ex.Run(global, work);
      if (!out.ok()) Fail("unit", out.status());
    });
    t.unit_s = std::min(t.unit_s, plain);
    node::UnitRunOptions opts;
    opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                             double) -> Status {
      return engine::SaveCheckpoint(&env, "ckpt-" + std::to_string(step), st);
    };
    const double checkpointed = Seconds([&] {
      Result<node::UnitOutcome> out = ex.Run(global, work, opts);
      if (!out.ok()) Fail("unit with checkpoints", out.status());
      leaves = out->state_hashes;
    });
    t.unit_checkpointed_s = std::min(t.unit_checkpointed_s, checkpointed);
    for (uint32_t seg = 0; seg < segments; ++seg) {
      std::unique_ptr<engine::TrainState> start;
      if (seg > 0) {
        const std::string name = "ckpt-" + std::to_string(seg * shape.checkpoint_interval);
        const double secs = Seconds([&] {
          Result<engine::TrainState> st = engine::LoadCheckpoint(&env, name);
          if (!st.ok()) Fail("load " + name, st.status());
          start = std::make_unique<engine::TrainState>(std::move(*st));
        });
        load[seg] = rep == 0 ? secs : std::min(load[seg], secs);
      }
      Result<node::SegmentReplay> r = Status(StatusCode::kInternal, "not run");
      const double s = Seconds(
          [&] { r = node::ReplaySegment(tr, global, work, seg, start.get(), &leaves[seg]); });
      replay[seg] = std::min(replay[seg], s);
      if (!r.ok()) Fail("replay", r.status());
      if (r->end_hash != leaves[seg + 1]) {
        std::fprintf(stderr, "verify_bench: segment %u of honest work did not replay to its leaf\n",
                     seg);
        std::exit(1);
      }
    }
  }
  for (uint32_t seg = 0; seg < segments; ++seg) {
    t.replay_s += replay[seg] / segments;
    t.load_s += load[seg] / segments;
  }
  return t;
}

uint32_t CeilLog2(uint64_t n) {
  return n <= 1 ? 0 : static_cast<uint32_t>(64 - __builtin_clzll(n - 1));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The referee case for the task at `path` (see the top of this file).
json RefereeCase(const std::string& path, int steps, uint32_t checkpoint_interval) {
  Result<engine::TaskSpec> spec = engine::TaskSpec::Load(Env::Default(), path);
  if (!spec.ok()) Fail(path, spec.status());
  Result<engine::TaskData> data = engine::LoadTaskData(Env::Default(), *spec);
  if (!data.ok()) Fail(path, data.status());
  const bool classification = !data->tokens && data->train.size() > 0;
  std::unique_ptr<engine::DataTree> tree;
  if (classification) tree = std::make_unique<engine::DataTree>(data->train);
  Result<std::unique_ptr<engine::Trainer>> created = engine::Trainer::Create(*spec, *data);
  if (!created.ok()) Fail(path, created.status());
  engine::Trainer& tr = **created;
  engine::TrainState& st = tr.state();
  tr.Step();  // warm-up
  std::vector<double> plain, traced, commit;
  for (int i = 0; i < steps; ++i) plain.push_back(Seconds([&] { tr.Step(); }));
  engine::OpTrace trace;
  for (int i = 0; i < steps; ++i) {
    trace.Clear();
    st.model->set_op_trace(&trace);
    traced.push_back(Seconds([&] { tr.Step(); }));
    st.model->set_op_trace(nullptr);
    commit.push_back(trace.record_seconds());
  }
  uint64_t tiles = 0;
  for (size_t i = 0; i < trace.size(); ++i) tiles += static_cast<uint64_t>(trace.grid(i).count());
  const double step_s = Median(plain), commit_s = Median(commit);
  // What training pays without a dispute: the state hash at each checkpoint (StateHash, what the
  // chain holds: every tensor's tiled root, then one hash over them), once per
  // checkpoint_interval steps. The operator trace is computed only by the two parties of a
  // dispute, replaying the one disputed step from their checkpoint.
  std::vector<double> state_tiled;
  for (int i = 0; i < steps; ++i) {
    state_tiled.push_back(Seconds([&] { engine::StateHash(st); }));
  }
  const double tiled_s = Median(state_tiled);
  const double per_step = tiled_s / (checkpoint_interval * step_s);
  json j = {{"bench", "verify_referee"},
            {"model", spec->name},
            {"parameters", st.model->NumParameters()},
            {"batch", spec->batch_size},
            {"threads", engine::GetKernelConfig().threads},
            {"operators", trace.size()},
            {"tiles", tiles},
            {"step_seconds", step_s},
            {"traced_step_seconds", Median(traced)},
            {"trace_commit_seconds", commit_s},
            {"trace_commit_fraction", commit_s / step_s},
            {"checkpoint_interval", checkpoint_interval},
            {"state_hash_seconds", tiled_s},
            {"state_hash_step_fraction", tiled_s / step_s},
            {"commitment_fraction", per_step},
            {"target_commitment_fraction", 0.10}};
  Result<engine::TilePlan> plan =
      engine::PlanStepTiles(spec->model, st.optimizer->spec(), spec->batch_size, spec->seq_len);
  if (!plan.ok()) {
    j["tile_rule"] = plan.status().message();
    j["largest_witness_bytes"] = nullptr;
    return j;
  }
  // One more step, its outputs kept: the largest witness over every computed operator (its
  // tile 0; a reduction at block 1, which carries a partial sum) and the ledger ruling it.
  const int64_t before = st.step;
  const Hash256 state_in = engine::StateHash(st);
  const engine::Batch batch = tr.BatchForStep(before);
  trace.Clear();
  trace.set_keep_values(true);
  st.model->set_op_trace(&trace);
  engine::StepOnBatch(st, batch, engine::DropoutSeed(spec->seed, spec->stream));
  st.model->set_op_trace(nullptr);
  ledger::TileRuleContext ctx;
  ctx.plan = *plan;
  ctx.seed = spec->seed;
  ctx.stream = spec->stream;
  ctx.plan.dropout_seed = engine::DropoutSeed(ctx.seed, ctx.stream);
  std::unique_ptr<engine::TokenPageTree> pages;  // a token task's data leaves
  if (classification) {
    ctx.num_examples = static_cast<uint64_t>(data->train.size());
    ctx.data_root = tree->root();
  } else {
    pages = std::make_unique<engine::TokenPageTree>(data->train_tokens.tokens);
    ctx.num_examples = static_cast<uint64_t>(pages->num_tokens());
    ctx.data_root = pages->root();
  }
  int64_t covered = 0, computed = 0;
  size_t largest = 0;
  std::string largest_op;
  uint32_t turns = 0;
  double rule_s = 0;
  bool rule_matches = true;
  Hash256 chain = state_in;
  for (size_t op = 0; op < plan->ops.size(); ++op) {
    const engine::TileOp& o = plan->ops[op];
    const Hash256 c_before = chain;
    chain = OperatorChainHash(chain, trace.hash(op));
    if (o.kind == engine::TileOpKind::kTileOpState) continue;
    ++computed;
    if (o.kind == engine::TileOpKind::kTileOpOpaque) continue;
    ++covered;
    const int64_t blocks = engine::ReductionBlocks(*plan, static_cast<int64_t>(op));
    const int64_t block = blocks > 1 ? 1 : 0;
    turns = std::max(turns, CeilLog2(checkpoint_interval) + 1 + CeilLog2(plan->ops.size()) + 1 +
                                CeilLog2(o.grid.count()) + CeilLog2(blocks));
    RefereeTask task;
    task.whole_step = false;
    task.tile = true;
    task.step = static_cast<uint64_t>(before) + 1;
    task.operator_index = static_cast<uint32_t>(op + 1);
    task.tile_index = 0;
    task.tile_count = static_cast<uint64_t>(o.grid.count());
    task.reduction_blocks = static_cast<uint32_t>(blocks);
    task.block = static_cast<uint32_t>(block);
    task.state_input = state_in;
    task.input = c_before;
    Result<ledger::TileWitness> built = ledger::BuildTileWitness(
        ctx, task, trace, batch, classification ? &data->train : nullptr, tree.get(), pages.get());
    if (!built.ok()) Fail("BuildTileWitness " + o.name, built.status());
    const ledger::TileWitness& w = *built;
    if (block > 0) task.partial_input = engine::TileHash(w.partial);
    // The traced tile, or (a reduction block before the last) the next partial sum.
    Hash256 want =
        MerkleLeafHash(engine::TileHash(engine::ExtractTile(trace.values(op), o.grid, 0)));
    if (blocks > 0 && block + 1 < blocks) {
      Result<std::vector<std::vector<float>>> partials =
          engine::ReductionChain(*plan, static_cast<int64_t>(op), 0, before, trace, batch);
      if (!partials.ok()) Fail("reduction chain", partials.status());
      want = engine::TileHash((*partials)[static_cast<size_t>(block) + 1]);
    }
    const size_t bytes = ledger::EncodeTileWitness(w).size();
    Result<Hash256> ruled = Hash256{};
    const double secs = Seconds([&] { ruled = ledger::RuleTile(ctx, task, w); });
    if (!ruled.ok()) Fail("RuleTile " + o.name, ruled.status());
    rule_matches = rule_matches && *ruled == want;
    if (bytes > largest) {
      largest = bytes;
      largest_op = o.name;
      rule_s = secs;
    }
  }
  j["tile_rule"] = covered == computed ? "covered" : "partly covered";
  j["covered_operators"] = covered;
  j["computed_operators"] = computed;
  j["turns_to_tile"] = turns;
  j["largest_witness_bytes"] = largest;
  j["largest_witness_operator"] = largest_op;
  j["witness_bound_bytes"] = ledger::kMaxTileWitnessBytes;
  j["ledger_rule_seconds"] = rule_s;
  j["rule_matches_trace"] = rule_matches;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> benches = {"economics", "simulate", "replay"};
  std::string task_path = SourceDir() + "/examples/fashion-mlp.toml";
  uint32_t solvers = 4;
  uint64_t tasks = 20'000;
  int repeats = 2;
  int referee_steps = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--benchmarks=", 0) == 0) {
      benches = bench::SplitList(a.substr(13));
    } else if (a.rfind("--task=", 0) == 0) {
      task_path = a.substr(7);
    } else if (a.rfind("--solvers=", 0) == 0) {
      solvers = static_cast<uint32_t>(std::max(1, std::atoi(a.c_str() + 10)));
    } else if (a.rfind("--tasks=", 0) == 0) {
      tasks = std::max<uint64_t>(1, std::strtoull(a.c_str() + 8, nullptr, 10));
    } else if (a.rfind("--repeats=", 0) == 0) {
      repeats = std::max(1, std::atoi(a.c_str() + 10));
    } else if (a.rfind("--referee-steps=", 0) == 0) {
      referee_steps = std::max(1, std::atoi(a.c_str() + 16));
    } else {
      std::fprintf(stderr,
                   "usage: verify_bench [--benchmarks=economics,simulate,replay,referee] "
                   "[--task=examples/fashion-mlp.toml] [--solvers=4] [--tasks=20000] "
                   "[--repeats=2] [--referee-steps=3]\n");
      return 2;
    }
  }
  auto wants = [&](const char* b) {
    return std::find(benches.begin(), benches.end(), b) != benches.end();
  };
  if (Status s = engine::ConfigureFromEnv(); !s.ok()) Fail("environment", s);
  Result<node::NetworkSpec> net = node::NetworkSpec::Load(Env::Default(), task_path);
  if (!net.ok()) Fail(task_path, net.status());
  const ledger::ChainParams chain;
  const VerificationParams params = chain.Verification();
  const uint32_t slash = chain.slash_multiple;
  TaskShape shape;
  shape.units_per_solver = std::max<uint32_t>(1, net->rounds * net->units_per_round / solvers);
  shape.inner_steps = net->inner_steps;
  shape.checkpoint_interval = net->checkpoint_interval;
  shape.verifiers_per_unit = chain.verifiers_per_unit;

  const EconomicsReport headline = AnalyzeEconomics(params, slash, shape, kPatterns[1].cheat);
  double measured_escape = -1;
  if (wants("economics")) {
    for (const Pattern& p : kPatterns) {
      const EconomicsReport r = AnalyzeEconomics(params, slash, shape, p.cheat);
      const SolverOutlook fresh = AnalyzeSolver(params, slash, shape, p.cheat, Reputation{});
      std::printf("%s\n", json{{"bench", "verify_economics"},
                               {"pattern", p.name},
                               {"params", ParamsJson(params, slash, shape)},
                               {"segments", r.segments},
                               {"check_permille", r.check_permille},
                               {"saved_share", r.saved_share},
                               {"detect_if_checked", r.detect_if_checked},
                               {"detect_per_unit", r.detect_per_unit},
                               {"escape_task", r.escape_task},
                               {"escape_task_new_node", fresh.escape},
                               {"gain_per_unit", r.gain_per_unit},
                               {"gain_task", r.gain_task},
                               {"min_slash_multiple", r.min_slash_multiple},
                               {"overhead", r.overhead},
                               {"new_node_overhead", r.new_node_overhead},
                               {"forced_error_rerun", r.forced_error_rerun}}
                              .dump()
                              .c_str());
      std::fflush(stdout);
    }
  }
  if (wants("simulate")) {
    uint64_t seed = 1;
    for (const Pattern& p : kPatterns) {
      const EconomicsReport r = AnalyzeEconomics(params, slash, shape, p.cheat);
      SimulatedSolver s;
      const double secs = Seconds([&] {
        s = SimulateSolver(params, slash, shape, p.cheat, SteadyStateReputation(), tasks, seed++);
      });
      const double escape = static_cast<double>(s.tasks_escaped) / s.tasks;
      const double d = static_cast<double>(s.cheated_caught) / s.cheated;
      const double mean = s.gain_sum / s.tasks;
      const double sd = std::sqrt(std::max(0.0, s.gain_sq_sum / s.tasks - mean * mean));
      if (p.cheat.faked_fraction == kPatterns[1].cheat.faked_fraction &&
          p.cheat.spread == kPatterns[1].cheat.spread) {
        measured_escape = escape;
      }
      std::printf("%s\n",
                  json{{"bench", "verify_simulate"},
                       {"pattern", p.name},
                       {"tasks", s.tasks},
                       {"units", s.units},
                       {"escape_measured", escape},
                       {"escape_computed", r.escape_task},
                       {"escape_stderr", std::sqrt(r.escape_task * (1 - r.escape_task) / s.tasks)},
                       {"detect_per_unit_measured", d},
                       {"detect_per_unit_computed", r.detect_per_unit},
                       {"gain_task_measured", mean},
                       {"gain_task_computed", r.gain_task},
                       {"gain_task_stderr", sd / std::sqrt(static_cast<double>(s.tasks))},
                       {"replayed_over_solver_steps", static_cast<double>(s.replayed_steps) /
                                                          static_cast<double>(s.solver_steps)},
                       {"flagged_honest_units", s.units_flagged - s.cheated_caught},
                       {"seconds", secs}}
                      .dump()
                      .c_str());
      std::fflush(stdout);
    }
  }
  double measured_overhead = -1;
  if (wants("replay")) {
    const ReplayTiming t = TimeReplay(task_path, shape, repeats);
    const double per_check = (t.replay_s + t.load_s) / t.unit_s;  // one segment, measured
    const double computed_per_check =
        static_cast<double>(headline.segments_replayed) / headline.segments;
    const double p = headline.check_permille / 1000.0;
    measured_overhead = p * shape.verifiers_per_unit * headline.segments_replayed * per_check;
    std::printf("%s\n", json{{"bench", "verify_replay"},
                             {"task", std::filesystem::path(task_path).filename().string()},
                             {"threads", t.threads},
                             {"inner_steps", shape.inner_steps},
                             {"checkpoint_interval", shape.checkpoint_interval},
                             {"unit_seconds", t.unit_s},
                             {"unit_with_checkpoints_seconds", t.unit_checkpointed_s},
                             {"segment_replay_seconds", t.replay_s},
                             {"checkpoint_load_seconds", t.load_s},
                             {"segment_over_unit_measured", per_check},
                             {"segment_over_unit_computed", computed_per_check},
                             {"check_permille", headline.check_permille},
                             {"overhead_measured", measured_overhead},
                             {"overhead_computed", headline.overhead},
                             {"new_node_overhead_measured",
                              headline.new_node_overhead * per_check / computed_per_check}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  if (wants("referee")) {
    for (const std::string& p : {task_path, SourceDir() + "/examples/fashion-cnn.toml",
                                 SourceDir() + "/examples/code-gpt-10m.toml"}) {
      std::printf("%s\n", RefereeCase(p, referee_steps, net->checkpoint_interval).dump().c_str());
      std::fflush(stdout);
    }
  }
  const double overhead = measured_overhead >= 0 ? measured_overhead : headline.overhead;
  std::printf("%s\n", json{{"bench", "verify_summary"},
                           {"overhead", overhead},
                           {"overhead_is", measured_overhead >= 0 ? "measured" : "computed"},
                           {"forced_error_rerun", headline.forced_error_rerun},
                           {"escape_spread10_computed", headline.escape_task},
                           {"escape_spread10_measured",
                            measured_escape >= 0 ? json(measured_escape) : json(nullptr)},
                           {"replication_overhead", 1.0},
                           {"replication_escape", 0.0},
                           {"overhead_vs_replication", overhead / 1.0},
                           {"target_overhead", 0.10},
                           {"target_escape", 0.01},
                           {"meets_targets", overhead + headline.forced_error_rerun < 0.10 &&
                                                 headline.escape_task < 0.01 &&
                                                 (measured_escape < 0 || measured_escape < 0.01)}}
                          .dump()
                          .c_str());
  return 0;
}

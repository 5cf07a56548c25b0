#include "meshlearn/protocol/task_model.h"

#include <algorithm>

#include "meshlearn/protocol/decompose.h"

namespace meshlearn::protocol {

Result<NetworkSpec> NetworkSpec::FromConfig(const ConfigFile& cfg) {
  ML_ASSIGN_OR_RETURN(ConfigFile n, cfg.GetTable("network"));
  ML_RETURN_IF_ERROR(n.CheckKnownKeys(
      {"rounds", "units_per_round", "inner_steps", "checkpoint_interval", "aggregation",
       "trim_fraction", "clip_radius", "clip_iterations", "krum_select", "krum_byzantine",
       "outer_lr", "outer_momentum", "outer_nesterov", "inner_lr_final",
       "verification_window_blocks", "verification", "tolerance_rel_l2_ppm",
       "tolerance_cosine_gap_ppb", "assurance", "target_escape_ppm", "budget", "price_cap",
       "stages", "cut"}));
  NetworkSpec s;
  ML_ASSIGN_OR_RETURN(int64_t rounds, n.GetInt("rounds", {.min = 1, .max = 100000}));
  ML_ASSIGN_OR_RETURN(int64_t units, n.GetInt("units_per_round", {.min = 1, .max = 4096}));
  ML_ASSIGN_OR_RETURN(int64_t h, n.GetInt("inner_steps", {.min = 1, .max = 1000000}));
  // Default H: only the start and the end of a unit are hashed (one segment). This is the one
  // place the default is decided (NetworkSpec::checkpoint_interval); an explicit 0 is refused,
  // since the ledger wants k >= 1 and "0 means H" would be a second spelling of the default.
  ML_ASSIGN_OR_RETURN(int64_t k, n.GetInt("checkpoint_interval", h, {.min = 1, .max = h}));
  s.rounds = static_cast<uint32_t>(rounds);
  s.units_per_round = static_cast<uint32_t>(units);
  s.inner_steps = static_cast<uint32_t>(h);
  s.checkpoint_interval = static_cast<uint32_t>(k);

  ML_ASSIGN_OR_RETURN(std::string rule,
                      n.GetEnum("aggregation",
                                {"mean", "trimmed_mean", "median", "centered_clip", "krum"},
                                std::string("mean")));
  ML_ASSIGN_OR_RETURN(s.aggregation.rule, ParseAggregationRule(rule));
  ML_ASSIGN_OR_RETURN(s.aggregation.trim_fraction,
                      n.GetDouble("trim_fraction", 0.125, {.min = 0, .max = 0.5, .max_exclusive = true}));
  ML_ASSIGN_OR_RETURN(s.aggregation.clip_radius, n.GetDouble("clip_radius", 0.0, {.min = 0}));
  ML_ASSIGN_OR_RETURN(int64_t iters, n.GetInt("clip_iterations", 3, {.min = 1, .max = 100}));
  s.aggregation.clip_iterations = static_cast<uint32_t>(iters);
  ML_ASSIGN_OR_RETURN(int64_t select, n.GetInt("krum_select", 1, {.min = 1, .max = units}));
  s.aggregation.krum_select = static_cast<uint32_t>(select);
  ML_ASSIGN_OR_RETURN(int64_t byz, n.GetInt("krum_byzantine", -1, {.min = -1, .max = units}));
  s.aggregation.krum_byzantine = static_cast<int32_t>(byz);
  Status agg = ValidateAggregationConfig(s.aggregation);
  if (!agg.ok()) return n.Error("aggregation", "is not valid: " + agg.message());

  ML_ASSIGN_OR_RETURN(double lr, n.GetDouble("outer_lr", 0.7, {.min = 0, .max = 10, .min_exclusive = true}));
  ML_ASSIGN_OR_RETURN(double mom, n.GetDouble("outer_momentum", 0.9, {.min = 0, .max = 1, .max_exclusive = true}));
  ML_ASSIGN_OR_RETURN(s.outer.nesterov, n.GetBool("outer_nesterov", true));
  s.outer.lr = static_cast<float>(lr);
  s.outer.momentum = static_cast<float>(mom);

  ML_ASSIGN_OR_RETURN(s.inner_lr_final, n.GetDouble("inner_lr_final", 1.0,
                                                    {.min = 0, .max = 1, .min_exclusive = true}));
  ML_ASSIGN_OR_RETURN(int64_t window, n.GetInt("verification_window_blocks", 5,
                                               {.min = 0, .max = 100000}));
  s.verification_window_blocks = static_cast<uint64_t>(window);
  ML_ASSIGN_OR_RETURN(std::string mode, n.GetEnum("verification", {"exact", "tolerance"},
                                                  std::string("exact")));
  s.tolerance_mode = mode == "tolerance";
  ML_ASSIGN_OR_RETURN(int64_t l2, n.GetInt("tolerance_rel_l2_ppm", 0, {.min = 0, .max = 1000000}));
  ML_ASSIGN_OR_RETURN(int64_t cos, n.GetInt("tolerance_cosine_gap_ppb", 0,
                                            {.min = 0, .max = 1000000000}));
  if (!s.tolerance_mode && (l2 != 0 || cos != 0)) {
    return n.Error("tolerance_rel_l2_ppm", "is set but verification is \"exact\"; set "
                                           "verification = \"tolerance\" or remove it");
  }
  s.tolerance_rel_l2_ppm = static_cast<uint32_t>(l2);
  s.tolerance_cosine_gap_ppb = static_cast<uint32_t>(cos);
  ML_ASSIGN_OR_RETURN(std::string assurance, n.GetEnum("assurance", {"economic", "full", "target"},
                                                       std::string("economic")));
  s.assurance.kind = assurance == "full"     ? Assurance::kAssuranceFull
                     : assurance == "target" ? Assurance::kAssuranceTarget
                                             : Assurance::kAssuranceEconomic;
  if (s.assurance.kind == Assurance::kAssuranceTarget) {
    if (!n.Has("target_escape_ppm")) {
      return n.Error("assurance", "is \"target\" but target_escape_ppm is missing; add e.g. "
                                  "target_escape_ppm = 10000 (at most a 1% chance that one "
                                  "corrupted segment escapes)");
    }
    ML_ASSIGN_OR_RETURN(int64_t t, n.GetInt("target_escape_ppm", {.min = 1, .max = 999999}));
    s.assurance.target_escape_ppm = static_cast<uint32_t>(t);
  } else if (n.Has("target_escape_ppm")) {
    return n.Error("target_escape_ppm", "is set but assurance is \"" + assurance +
                                            "\"; set assurance = \"target\" or remove it");
  }
  ML_ASSIGN_OR_RETURN(int64_t budget, n.GetInt("budget", 0, {.min = 0}));
  ML_ASSIGN_OR_RETURN(int64_t cap, n.GetInt("price_cap", 0, {.min = 0}));
  s.budget = static_cast<uint64_t>(budget);
  s.price_cap = static_cast<uint64_t>(cap);

  // Pipeline stages (issue 15). The bounds against the model (the last one is the model's layer
  // count; every stage non-empty) are the engine's check (engine::TaskPipelineCut).
  ML_ASSIGN_OR_RETURN(int64_t stages,
                      n.GetInt("stages", 1, {.min = 1, .max = kMaxPipelineStages}));
  s.stages = static_cast<uint32_t>(stages);
  if (n.Has("cut")) {
    ML_ASSIGN_OR_RETURN(s.cut, n.GetIntArray("cut"));
    if (s.cut.size() != static_cast<size_t>(stages) + 1) {
      return n.Error("cut", "lists " + std::to_string(s.cut.size()) +
                                " bounds but network.stages = " + std::to_string(stages) +
                                " needs " + std::to_string(stages + 1) +
                                " (0, the first layer of each later stage, the layer count); fix "
                                "one or remove cut to let the cut be chosen");
    }
    if (s.cut.front() != 0) {
      return n.Error("cut", "must start at 0 (stage 0 holds the first layer), got " +
                                std::to_string(s.cut.front()));
    }
    for (size_t i = 1; i < s.cut.size(); ++i) {
      if (s.cut[i] <= s.cut[i - 1]) {
        return n.Error("cut", "bound " + std::to_string(i) + " (" + std::to_string(s.cut[i]) +
                                  ") must be greater than bound " + std::to_string(i - 1) + " (" +
                                  std::to_string(s.cut[i - 1]) +
                                  "): every stage holds at least one layer");
      }
    }
  }
  return s;
}

double NetworkSpec::InnerLrScale(uint32_t round) const {
  return protocol::InnerLrScale(rounds, inner_lr_final, round);
}

Result<NetworkSpec> NetworkSpec::Load(Env* env, const std::string& path) {
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Load(env, path));
  return FromConfig(cfg);
}

UnitId RoundUnitId(const Hash256& content_id, uint32_t round, uint32_t shard) {
  return UnitId{content_id, round, shard};
}

UnitWork UnitWorkOf(const NetworkSpec& net, uint64_t task_seed, const Hash256& content_id,
                    uint32_t round, uint32_t shard) {
  return UnitWork{.stream = UnitSeed(task_seed, RoundUnitId(content_id, round, shard)),
                  .inner_steps = net.inner_steps,
                  .checkpoint_interval = net.checkpoint_interval,
                  .lr_scale = net.InnerLrScale(round)};
}

std::vector<int64_t> HashedSteps(int64_t inner_steps, int64_t k) {
  std::vector<int64_t> steps = {0};
  if (k > 0) {
    for (int64_t s = k; s < inner_steps; s += k) steps.push_back(s);
  }
  if (inner_steps > 0) steps.push_back(inner_steps);
  return steps;
}

SegmentSteps SegmentStepsOf(uint64_t inner_steps, uint64_t k, uint32_t segment) {
  // HashedSteps[segment] and HashedSteps[segment + 1] without building the list.
  if (k == 0) return {.first_step = 0, .last_step = inner_steps};
  const uint64_t first = static_cast<uint64_t>(segment) * k;
  return {.first_step = first, .last_step = std::min<uint64_t>(first + k, inner_steps)};
}

}  // namespace meshlearn::protocol

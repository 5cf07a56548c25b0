// The [network] table of a task file: how a training task is cut into rounds and work units and
// how the round results are combined (DESIGN.md, "One task, end to end", steps 2 and 5). The rest
// of the file ([task], [data], [model], [optimizer], [train]) is the engine's TaskSpec; its
// [optimizer] is the inner optimizer each unit runs.
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
//   budget = 1000000          # tokens escrowed by the submitter
//   price_cap = 100           # highest price per GFLOP accepted from a solver
//
// Every value is validated; errors name the file, the key and the fix.
#pragma once

#include <cstdint>
#include <string>

#include "meshlearn/base/config.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/aggregate.h"

namespace meshlearn::node {

struct NetworkSpec {
  uint32_t rounds = 0;
  uint32_t units_per_round = 0;
  uint32_t inner_steps = 0;
  uint32_t checkpoint_interval = 0;  // FromConfig: 1..inner_steps (default inner_steps)
  protocol::AggregationConfig aggregation;
  protocol::OuterOptimizerConfig outer;
  // The inner optimizer's learning rate in round r is lr x InnerLrScale(r): 1 in round 0,
  // falling linearly to inner_lr_final in the last round (integer ratio, exact in double).
  double inner_lr_final = 1.0;
  double InnerLrScale(uint32_t round) const;
  uint64_t verification_window_blocks = 5;
  bool tolerance_mode = false;
  uint32_t tolerance_rel_l2_ppm = 0;      // 0: profile at submission
  uint32_t tolerance_cosine_gap_ppb = 0;  // 0: profile at submission
  uint64_t budget = 0;
  uint64_t price_cap = 0;

  // Parses the [network] table of `cfg` (the whole task file).
  static Result<NetworkSpec> FromConfig(const ConfigFile& cfg);
  static Result<NetworkSpec> Load(Env* env, const std::string& path);
};

}  // namespace meshlearn::node

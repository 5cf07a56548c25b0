#include "meshlearn/node/local_diloco.h"

#include <cmath>
#include <limits>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/aggregate.h"

namespace meshlearn::node {

std::string_view GarbageKindName(GarbageKind kind) {
  switch (kind) {
    case GarbageKind::kGarbageNone: return "none";
    case GarbageKind::kGarbageHuge: return "huge";
    case GarbageKind::kGarbageNaN: return "nan";
    case GarbageKind::kGarbageSignFlip: return "signflip";
  }
  return "?";
}

Result<GarbageKind> ParseGarbageKind(std::string_view name) {
  for (GarbageKind k : {GarbageKind::kGarbageNone, GarbageKind::kGarbageHuge,
                        GarbageKind::kGarbageNaN, GarbageKind::kGarbageSignFlip}) {
    if (GarbageKindName(k) == name) return k;
  }
  return InvalidArgument("garbage kind '" + std::string(name) +
                         "' is unknown; use none, huge, nan or signflip");
}

void MakeGarbage(GarbageKind kind, uint64_t seed, std::vector<float>& delta) {
  Rng rng(seed, 0x6a7b);
  switch (kind) {
    case GarbageKind::kGarbageNone:
      return;
    case GarbageKind::kGarbageHuge:
      for (float& x : delta) x = (rng.NextU32() & 1) ? 1e6f : -1e6f;
      return;
    case GarbageKind::kGarbageNaN:
      for (size_t i = 0; i < delta.size(); i += 7) delta[i] = std::numeric_limits<float>::quiet_NaN();
      return;
    case GarbageKind::kGarbageSignFlip:
      for (float& x : delta) x = -10.0f * x;
      return;
  }
}

protocol::TaskSpecView MakeTaskView(const engine::Trainer& trainer, const NetworkSpec& net) {
  return MakeTaskView(trainer.task(), trainer.data(), net);
}

protocol::TaskSpecView MakeTaskView(const engine::TaskSpec& t, const engine::TaskData& data,
                                    const NetworkSpec& net) {
  protocol::TaskSpecView v;
  v.id = engine::TaskContentId(t);
  v.rounds = net.rounds;
  v.units_per_round = net.units_per_round;
  v.inner_steps = net.inner_steps;
  v.batch_size = static_cast<uint32_t>(t.batch_size);
  v.seed = t.seed;
  v.num_examples =
      static_cast<uint64_t>(data.tokens ? data.train_tokens.tokens.size() : data.train.size());
  v.price_cap_per_gflop = net.price_cap;
  return v;
}

Result<LocalDilocoResult> RunLocalDiloco(engine::Trainer* trainer, const NetworkSpec& net,
                                         const LocalDilocoOptions& options) {
  if (options.garbage_units > net.units_per_round) {
    return InvalidArgument("garbage_units " + std::to_string(options.garbage_units) +
                           " exceeds units_per_round " + std::to_string(net.units_per_round));
  }
  protocol::TaskSpecView view = MakeTaskView(*trainer, net);
  UnitExecutor executor(trainer);
  GlobalState state = InitialState(*trainer);
  const uint64_t samples = UnitSamples(*trainer, net);
  LocalDilocoResult result;

  for (uint32_t r = 0; r < net.rounds; ++r) {
    std::vector<UnitOutcome> outcomes;
    outcomes.reserve(net.units_per_round);
    double loss_sum = 0;
    uint32_t honest = 0;
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      UnitWork work = protocol::UnitWorkOf(net, view.seed, view.id, r, i);
      ML_ASSIGN_OR_RETURN(UnitOutcome out, executor.Run(state.weights, work));
      bool garbage = i + options.garbage_units >= net.units_per_round && options.garbage_units > 0;
      if (garbage) {
        MakeGarbage(options.garbage, work.stream, out.delta);
      } else {
        loss_sum += out.mean_loss;
        ++honest;
      }
      outcomes.push_back(std::move(out));
      if (options.on_unit) options.on_unit(r, i);
    }
    std::vector<RoundDelta> deltas;
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      deltas.push_back({.shard = i, .delta = outcomes[i].delta});
    }
    ML_ASSIGN_OR_RETURN(protocol::AggregateResult agg,
                        ApplyRound(&state, deltas, net, view.id, r, samples));
    const std::vector<float>& global = state.weights;

    RoundReport report;
    report.round = r;
    report.train_loss = honest > 0 ? static_cast<float>(loss_sum / honest) : 0.0f;
    report.global_hash = HashFloats(global);
    report.rejected_units = static_cast<uint32_t>(agg.rejected.size());
    if (options.eval_every_round || r + 1 == net.rounds) {
      ML_RETURN_IF_ERROR(trainer->SetFlatParams(global));
      report.eval = trainer->Evaluate();
    }
    if (options.on_round) options.on_round(report);
    result.rounds.push_back(report);
  }
  result.final_hash = HashFloats(state.weights);
  result.final_weights = std::move(state.weights);
  return result;
}

}  // namespace meshlearn::node

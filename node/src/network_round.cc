#include "meshlearn/node/network_round.h"

#include <string>
#include <utility>
#include <vector>

#include "meshlearn/net/blob.h"
#include "meshlearn/protocol/decompose.h"

namespace meshlearn::node {

uint64_t UnitSamples(const engine::TaskSpec& task, const NetworkSpec& net) {
  return static_cast<uint64_t>(net.inner_steps) *
         static_cast<uint64_t>(engine::SamplesPerStep(task));
}

uint64_t UnitSamples(const engine::Trainer& trainer, const NetworkSpec& net) {
  return UnitSamples(trainer.task(), net);
}

Result<protocol::AggregateResult> ApplyRound(GlobalState* state, std::span<const RoundDelta> deltas,
                                             const NetworkSpec& net, const Hash256& content_id,
                                             uint32_t round, uint64_t samples_per_unit) {
  std::vector<protocol::Contribution> contributions;
  contributions.reserve(deltas.size());
  for (const RoundDelta& d : deltas) {
    CHECK_EQ(d.delta.size(), state->weights.size());
    contributions.push_back({.unit = protocol::RoundUnitId(content_id, round, d.shard),
                             .samples = samples_per_unit,
                             .delta = d.delta});
  }
  ML_ASSIGN_OR_RETURN(protocol::AggregateResult agg,
                      protocol::Aggregate(contributions, net.aggregation));
  protocol::OuterStep(state->weights, state->momentum, agg.delta, net.outer);
  return agg;
}

Hash256 StateBlobId(const GlobalState& state) {
  return net::BuildManifest(EncodeGlobalState(state)).id().hash;
}

Status CheckBundleMatchesLedger(const TaskFacts& facts, const NetworkSpec& net,
                                const nlohmann::json& task) {
  if (!task.contains("params") || !task["params"].is_object()) {
    return InvalidArgument("the ledger's task record has no params");
  }
  const nlohmann::json& p = task["params"];
  ledger::TaskParams params;
  for (auto [key, field] : {std::pair{"stages", &params.stages},
                            {"rounds", &params.rounds},
                            {"units_per_round", &params.units_per_round},
                            {"inner_steps", &params.inner_steps},
                            {"checkpoint_interval", &params.checkpoint_interval},
                            {"batch_size", &params.batch_size}}) {
    const uint64_t v = p.value(key, uint64_t{field == &params.stages ? 1u : 0u});
    if (v > UINT32_MAX) {
      return InvalidArgument(std::string("the ledger's params.") + key + " = " + std::to_string(v) +
                             " does not fit 32 bits");
    }
    *field = static_cast<uint32_t>(v);
  }
  params.num_examples = p.value("num_examples", uint64_t{0});
  params.seed = p.value("seed", uint64_t{0});
  params.model_bytes = p.value("model_bytes", uint64_t{0});
  params.memory_bytes = p.value("memory_bytes", uint64_t{0});
  params.eval_memory_bytes = p.value("eval_memory_bytes", uint64_t{0});
  params.data_page_tokens = p.value("data_page_tokens", uint32_t{0});
  // A pipeline's per-stage and per-boundary lists, all compared below.
  for (const auto& [key, list] :
       {std::pair{"stage_memory_bytes", &params.stage_memory_bytes},
        std::pair{"stage_flops", &params.stage_flops},
        std::pair{"stage_boundary_bytes", &params.stage_boundary_bytes}}) {
    if (!p.contains(key) || !p[key].is_array()) continue;
    for (const nlohmann::json& b : p[key]) {
      if (!b.is_number_unsigned()) {
        return InvalidArgument(std::string("the ledger's params.") + key + " holds " + b.dump() +
                               ", not a count");
      }
      list->push_back(b.get<uint64_t>());
    }
  }
  if (p.contains("data_root") && p["data_root"].is_string()) {
    ML_ASSIGN_OR_RETURN(params.data_root,
                        Hash256::FromHex(p["data_root"].get<std::string>(), "params.data_root"));
  }
  return CheckBundleMatchesLedger(facts, net, params);
}

Status CheckBundleMatchesLedger(const TaskFacts& facts, const NetworkSpec& net,
                                const ledger::TaskParams& p) {
  const ledger::TaskParams bundle = MakeTaskParams(facts, net, Hash256{});
  struct Field {
    const char* key;
    uint64_t want;  // the bundle's
    uint64_t got;   // the ledger's
  };
  const Field fields[] = {
      {"stages", bundle.stages, p.stages},
      {"rounds", bundle.rounds, p.rounds},
      {"units_per_round", bundle.units_per_round, p.units_per_round},
      {"inner_steps", bundle.inner_steps, p.inner_steps},
      {"checkpoint_interval", bundle.checkpoint_interval, p.checkpoint_interval},
      {"batch_size", bundle.batch_size, p.batch_size},
      {"num_examples", bundle.num_examples, p.num_examples},
      {"seed", bundle.seed, p.seed},
      {"model_bytes", bundle.model_bytes, p.model_bytes}};
  for (const auto& [key, want, got] : fields) {
    if (got != want) {
      return InvalidArgument(std::string("the task bundle says ") + key + " = " +
                             std::to_string(want) + " but the ledger's params." + key + " = " +
                             std::to_string(got) +
                             "; the submitter published an inconsistent task, refusing it");
    }
  }
  // The memory a whole unit needs: the scheduler places units by it, so a node that computed
  // another need from the bundle (UnitMemoryBytes) would refuse units the ledger thinks fit, or
  // take ones it cannot hold. Zero: none declared (protocol::RequiredMemoryBytes' fallback).
  if (p.memory_bytes != 0 && p.memory_bytes != bundle.memory_bytes) {
    return InvalidArgument(
        "the task bundle's model needs memory_bytes = " + std::to_string(bundle.memory_bytes) +
        " for a unit (weights, gradients, optimizer moments, activations: "
        "UnitMemoryBytes) but the ledger's params.memory_bytes = " +
        std::to_string(p.memory_bytes) +
        "; the submitter published an inconsistent task, refusing it");
  }
  // What a pipeline task's aggregator holds of the whole model: the scheduler draws aggregators
  // by it (protocol::AggregatorMemoryBytes), so a node drawn by another need than its own
  // evaluator's (StageTermsOf) could be one that cannot hold it. Zero: none declared (the
  // aggregator is then placed by memory_bytes, a whole unit's training need, which holds it).
  if (p.eval_memory_bytes != 0 && p.eval_memory_bytes != bundle.eval_memory_bytes) {
    return InvalidArgument(
        "the task bundle's model needs eval_memory_bytes = " +
        std::to_string(bundle.eval_memory_bytes) +
        " to evaluate a pipeline round's state (weights and one evaluation forward's "
        "activations: engine::EstimateEvaluationMemory) but the ledger's params.eval_memory_bytes "
        "= " +
        std::to_string(p.eval_memory_bytes) +
        "; the submitter published an inconsistent task, refusing it");
  }
  // A pipeline's terms from its cut (StageTermsOf): the ledger places the stages by their memory
  // and FLOPs and pairs their nodes by the bytes a step moves across each boundary, so a task
  // that declared other terms than its cut gives was placed by needs no node of it computes (a
  // stage on a node too small for it, or links weighed by a wrong cost).
  auto list = [](const std::vector<uint64_t>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(v[i]);
    return out + "]";
  };
  struct ListField {
    const char* key;
    const char* what;
    const std::vector<uint64_t>& want;  // the bundle's
    const std::vector<uint64_t>& got;   // the ledger's
  };
  const ListField lists[] = {
      {"stage_memory_bytes", "needs per stage (engine::CutCosts of its cut)",
       bundle.stage_memory_bytes, p.stage_memory_bytes},
      {"stage_flops", "trains per stage a step (engine::CutCosts of its cut)", bundle.stage_flops,
       p.stage_flops},
      {"stage_boundary_bytes",
       "moves a step across its stage boundaries (engine::CutBoundaryBytes of its cut)",
       bundle.stage_boundary_bytes, p.stage_boundary_bytes}};
  for (const ListField& f : lists) {
    if (f.got != f.want) {
      return InvalidArgument(std::string("the task bundle's pipeline ") + f.what + ": " + f.key +
                             " = " + list(f.want) +
                             " (none when network.stages and network.cut do not cut its model) "
                             "but the ledger's params." +
                             f.key + " = " + list(f.got) +
                             "; the submitter published an inconsistent task, refusing it");
    }
  }
  // The data root: the ledger checks a disputed step's examples against it (RefereeStepTx), so
  // work on data that does not give it could never be refereed. Zero: none declared.
  if (!p.data_root.IsZero() && p.data_root != facts.data_root) {
    return InvalidArgument(
        "the submitter's data_root does not match the data in the bundle: the ledger's "
        "params.data_root = " +
        p.data_root.ToHex() + " but the bundle's training data gives " +
        (facts.data_root.IsZero() ? std::string("no data root") : facts.data_root.ToHex()) +
        (facts.data_page_tokens != 0 ? " (the root over this node's token pages: its corpus is "
                                       "not the task's)"
                                     : "") +
        "; refusing it");
  }
  if (!p.data_root.IsZero() && p.data_page_tokens != facts.data_page_tokens) {
    return InvalidArgument(
        "the ledger's params.data_page_tokens = " + std::to_string(p.data_page_tokens) +
        " but the bundle's data gives " + std::to_string(facts.data_page_tokens) +
        (facts.data_page_tokens != 0 ? " (a token task)" : " (examples)") + "; refusing it");
  }
  return Status::Ok();
}

}  // namespace meshlearn::node

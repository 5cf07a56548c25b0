#include "meshlearn/node/adversary.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/protocol/aggregate.h"

namespace meshlearn::node {

namespace {

constexpr std::string_view kNames[] = {"none",       "lazy",     "noisy",        "wrong_data",
                                       "copy",       "stale",    "rubber_stamp", "wrong_result",
                                       "noisy_last", "targeted", "drift",        "wrong_example"};

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Adds kTargetedShift to every weight of output class 0: row 0 of the last rank-2 parameter and
// element 0 of the last rank-1 parameter (a classifier's output layer).
void ShiftClassZero(engine::TrainState& st) {
  std::vector<engine::Param>& params = st.model->params();
  bool weight = false, bias = false;
  for (auto it = params.rbegin(); it != params.rend() && !(weight && bias); ++it) {
    engine::Tensor& t = it->value;
    if (!weight && t.shape().size() == 2) {
      for (int64_t j = 0; j < t.dim(1); ++j) t.data()[j] += kTargetedShift;
      weight = true;
    } else if (!bias && t.shape().size() == 1) {
      t.data()[0] += kTargetedShift;
      bias = true;
    }
  }
}

enum class Poison : uint8_t { kNone, kNoise, kShiftClassZero };

void Finish(UnitOutcome& out, std::span<const float> global, std::vector<float> local,
            double loss_sum, const UnitWork& work, engine::Trainer* trainer) {
  out.commitment = MerkleRoot(out.state_hashes);
  out.delta = protocol::PseudoGradient(global, local);
  out.delta_hash = HashFloats(out.delta);
  out.mean_loss = static_cast<float>(loss_sum / static_cast<double>(work.inner_steps));
  out.samples = static_cast<uint64_t>(work.inner_steps) *
                static_cast<uint64_t>(trainer->samples_per_step());
}

// The loop of UnitExecutor::Run with the cheats: `skip_odd` (lazy) runs only the even steps,
// `poison` is applied to the weights after step `poison_after` (> 0), `data_stream` is the stream
// whose batches it trains on (its states are labelled with work.stream all the same), step
// `forge_step` (> 0; wrong_example) reads its batch forged (ForgeExample).
Result<UnitOutcome> CheatRun(engine::Trainer* trainer, std::span<const float> global,
                             const UnitWork& work, const UnitRunOptions& options, bool skip_odd,
                             int64_t poison_after, uint64_t data_stream,
                             Poison poison = Poison::kNoise, int64_t forge_step = 0) {
  if (work.inner_steps <= 0) {
    return InvalidArgument("unit inner_steps must be > 0, got " + std::to_string(work.inner_steps));
  }
  ML_RETURN_IF_ERROR(trainer->StartUnit(data_stream, global, work.lr_scale));
  engine::TrainState& st = trainer->state();
  st.stream = work.stream;  // Step draws batches from the trainer's sampler, not from this
  UnitOutcome out;
  out.hashed_steps = HashedSteps(work.inner_steps, work.checkpoint_interval);
  size_t next_hash = 0;
  double loss_sum = 0;
  float last_loss = 0;
  for (int64_t s = 0; s <= work.inner_steps; ++s) {
    if (next_hash < out.hashed_steps.size() && out.hashed_steps[next_hash] == s) {
      out.state_hashes.push_back(engine::StateHash(st));
      ++next_hash;
      if (options.on_checkpoint && s > 0 && s < work.inner_steps) {
        ML_RETURN_IF_ERROR(options.on_checkpoint(s, st, out.state_hashes, loss_sum));
      }
    }
    if (s == work.inner_steps) break;
    if (options.should_stop && options.should_stop()) {
      return Unavailable("unit stopped at step " + std::to_string(s) + " of " +
                         std::to_string(work.inner_steps));
    }
    if (skip_odd && s % 2 == 1) {
      st.step = s + 1;  // pretend
    } else if (s + 1 == forge_step) {
      engine::Batch batch = trainer->BatchForStep(st.step);
      ForgeExample(batch);
      last_loss = trainer->StepOn(batch);
    } else {
      last_loss = trainer->Step();
    }
    if (poison_after > 0 && s + 1 == poison_after) {
      if (poison == Poison::kNoise) PerturbParams(st.model->params(), work.stream);
      if (poison == Poison::kShiftClassZero) ShiftClassZero(st);
    }
    loss_sum += last_loss;
    if (options.on_step) options.on_step(s + 1, last_loss);
  }
  Finish(out, global, trainer->FlatParams(), loss_sum, work, trainer);
  return out;
}

}  // namespace

void PerturbParams(std::vector<engine::Param>& params, uint64_t stream) {
  uint64_t x = stream ^ 0x6E6F697379ULL;
  for (engine::Param& p : params) {
    float* v = p.value.data();
    for (int64_t i = 0; i < p.value.size(); ++i) {
      double u = static_cast<double>(SplitMix64(x) >> 11) * 0x1.0p-53;  // [0, 1)
      v[i] += static_cast<float>((u * 2.0 - 1.0) * 1e-3);
    }
  }
}

int64_t PoisonAfterSteps(int64_t inner_steps) { return std::max<int64_t>(1, inner_steps / 2); }

void ForgeExample(engine::Batch& batch) {
  if (!batch.tokens.empty()) {
    batch.tokens[0] = batch.tokens[0] == 0 ? 1 : 0;
    return;
  }
  batch.inputs.data()[0] += 1.0f;
}

int64_t ForgedExampleStep(int64_t inner_steps) { return PoisonAfterSteps(inner_steps); }

bool CheatsAsSolver(Adversary a) { return a != Adversary::kNone && a != Adversary::kRubberStamp; }

bool CheatsAsVerifier(Adversary a) { return a == Adversary::kRubberStamp; }

bool LiesInDisputes(Adversary a, bool defender) {
  return defender ? CheatsAsSolver(a) : a == Adversary::kWrongExample;
}

std::string_view AdversaryName(Adversary a) {
  size_t i = static_cast<size_t>(a);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::string AdversaryChoices() {
  std::string s;
  for (size_t i = 1; i < std::size(kNames); ++i) {
    if (!s.empty()) s += ", ";
    s += "\"" + std::string(kNames[i]) + "\"";
  }
  return s;
}

Result<Adversary> ParseAdversary(std::string_view name) {
  if (name.empty()) return Adversary::kNone;
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (name == kNames[i]) return static_cast<Adversary>(i);
  }
  return InvalidArgument("adversary \"" + std::string(name) + "\" is not one of " +
                         AdversaryChoices() + " (or \"none\")");
}

Result<UnitOutcome> RunAdversaryUnit(Adversary adv, engine::Trainer* trainer,
                                     std::span<const float> global, const UnitWork& work,
                                     const UnitRunOptions& options, const AdversaryInputs& in) {
  switch (adv) {
    case Adversary::kNone:
    case Adversary::kRubberStamp: {
      UnitExecutor ex(trainer);
      return ex.Run(global, work, options);
    }
    case Adversary::kLazy:
      return CheatRun(trainer, global, work, options, /*skip_odd=*/true, 0, work.stream);
    case Adversary::kNoisyLast:
      if (!in.last_round) {
        UnitExecutor ex(trainer);
        return ex.Run(global, work, options);
      }
      [[fallthrough]];
    case Adversary::kNoisy:
    case Adversary::kDrift:  // a whole unit's states are consecutive: drift is noisy there
      return CheatRun(trainer, global, work, options, false, PoisonAfterSteps(work.inner_steps),
                      work.stream);
    case Adversary::kTargeted:
      return CheatRun(trainer, global, work, options, false, PoisonAfterSteps(work.inner_steps),
                      work.stream, Poison::kShiftClassZero);
    case Adversary::kWrongExample:
      return CheatRun(trainer, global, work, options, false, 0, work.stream, Poison::kNone,
                      ForgedExampleStep(work.inner_steps));
    case Adversary::kWrongData: {
      uint64_t other = in.other_stream;
      if (other == 0 || other == work.stream) {
        uint64_t x = work.stream;
        other = SplitMix64(x);
      }
      return CheatRun(trainer, global, work, options, false, 0, other);
    }
    case Adversary::kCopy: {
      ML_ASSIGN_OR_RETURN(UnitOutcome out,
                          CheatRun(trainer, global, work, options, true, 0, work.stream));
      if (!in.peer_delta.empty()) {
        if (in.peer_delta.size() != global.size()) {
          return InvalidArgument("copy: the borrowed delta has " +
                                 std::to_string(in.peer_delta.size()) + " values, the model " +
                                 std::to_string(global.size()));
        }
        out.delta.assign(in.peer_delta.begin(), in.peer_delta.end());
        out.delta_hash = HashFloats(out.delta);
      }
      return out;
    }
    case Adversary::kWrongResult: {
      // Honest work, poisoned result: the sign-flipped delta (it pushes the model the other way).
      UnitExecutor ex(trainer);
      ML_ASSIGN_OR_RETURN(UnitOutcome out, ex.Run(global, work, options));
      for (float& d : out.delta) d = -d;
      out.delta_hash = HashFloats(out.delta);
      return out;
    }
    case Adversary::kStale: {
      if (in.earlier != nullptr && in.earlier->delta.size() == global.size() &&
          in.earlier->state_hashes.size() ==
              HashedSteps(work.inner_steps, work.checkpoint_interval).size()) {
        return *in.earlier;
      }
      return CheatRun(trainer, global, work, options, true, 0, work.stream);
    }
  }
  return InvalidArgument("unknown adversary");
}

engine::OpTrace SkippedUpdateTrace(const engine::TilePlan& plan, const engine::OpTrace& honest) {
  engine::OpTrace out;
  out.set_keep_values(true);
  for (size_t i = 0; i < honest.size(); ++i) {
    const engine::TileOp& op = plan.ops.at(i);
    // An update's output: the parameter or moment as it was before the step.
    const int64_t before = engine::UpdatedStateOperand(op);
    const size_t from = before >= 0 ? static_cast<size_t>(before) : i;
    out.Record(honest.name(i), honest.values(from), honest.grid(i).rows, honest.grid(i).cols);
  }
  return out;
}

}  // namespace meshlearn::node

// One disputed training step, computed from its witness (ledger::StepWitness, RefereeStepTx):
// the computation the ledger runs to rule, shared with the nodes that build witnesses so both
// check and compute exactly the same thing (docs/verification.md, "Referee").
#pragma once

#include <cstdint>
#include <string>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

// The state hash after `step` (1-based) of a classification unit with stream `stream` trained at
// `lr_scale` of `spec` (the task bundle's), from witness `w`: its state must hash to `agreed`
// (the state after step - 1), its examples must be the batch of that step (BatchIndices over
// `num_examples`, in batch order) each proven against `data_root`; then one
// engine::StepOnBatch. InvalidArgument naming the first input that does not check (`where`
// prefixes every message); FailedPrecondition for a token task. Deterministic.
Result<Hash256> RunStepWitness(const engine::TaskSpec& spec, uint64_t stream, double lr_scale,
                               uint64_t num_examples, const Hash256& data_root, uint64_t step,
                               const Hash256& agreed, const StepWitness& w,
                               const std::string& where);

}  // namespace meshlearn::ledger

// The training state, its canonical hash, and checkpoint / model files (safetensors).
//
// StateHash() is what verifiers compare: two parties that trained the same work unit from the
// same checkpoint agree on it exactly when their parameters, optimizer moments and step are
// bit-identical. It covers, in this order (all integers u64 little-endian):
//   domain "meshlearn.train_state.v1"; step; seed; stream;
//   for each parameter (model order), then each optimizer state tensor (Optimizer::State order):
//     name length, name bytes, rank, each dimension, byte length, raw float32 bytes.
//
// Files: a checkpoint holds every parameter under its own name, every optimizer state tensor
// ("optim.m.<param>", ...), and __metadata__ {"format": "meshlearn.checkpoint.v1", "step",
// "seed", "stream", "model" (ModelSpec JSON), "optimizer" (OptimizerSpec JSON), "state_hash"}.
// A model file is the same without optimizer state ("format": "meshlearn.model.v1"); PyTorch
// loads either with safetensors.torch.load_file / torch's own reader. A pipeline stage's state
// (a part of the model, Model::CreatePart) saves its own tensors and "part_begin", "part_end";
// loading builds the same part (pipeline.h: Stage::Restore).
//
//   TrainState st = ...;
//   Hash256 h = StateHash(st);
//   ML_RETURN_IF_ERROR(SaveCheckpoint(env, "ckpt.safetensors", st));
//   ML_ASSIGN_OR_RETURN(TrainState back, LoadCheckpoint(env, "ckpt.safetensors"));
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/optim.h"

namespace meshlearn::engine {

// Everything that determines the next training step. The data position and dropout masks are
// pure functions of (seed, stream, step), so these three integers are the RNG counters.
struct TrainState {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;  // may be null (a bare model)
  int64_t step = 0;                      // number of completed optimizer steps
  uint64_t seed = 0;                     // task seed (init, data order, dropout)
  uint64_t stream = 0;                   // work-unit stream id (data order, dropout)
};

// The canonical hash of the training state (see the top of this file).
Hash256 StateHash(TrainState& state);
// The same without the optimizer state: what a model file's "state_hash" covers.
Hash256 ModelStateHash(TrainState& state);

inline constexpr char kCheckpointFormat[] = "meshlearn.checkpoint.v1";
inline constexpr char kModelFormat[] = "meshlearn.model.v1";

// Writes the full state (with optimizer) atomically. `extra` metadata entries are added (the
// vocabulary of a text task: hf_gpt2.h).
Status SaveCheckpoint(Env* env, const std::string& path, TrainState& state,
                      const std::map<std::string, std::string>& extra = {});
// The bytes SaveCheckpoint writes, without a file (a pipeline stage keeps one per step in memory
// for its verifiers: one copy of the state beside the serialized bytes, not a file's copies).
std::string CheckpointBytes(TrainState& state,
                            const std::map<std::string, std::string>& extra = {});
// Writes parameters only (plus metadata), atomically. `extra` metadata entries are added.
Status SaveModel(Env* env, const std::string& path, TrainState& state,
                 const std::map<std::string, std::string>& extra = {});
// Reads a checkpoint or a model file; the optimizer is restored when the file has one. Every
// tensor must be present with the right shape and no unknown tensor may be present.
Result<TrainState> LoadCheckpoint(Env* env, const std::string& path);

}  // namespace meshlearn::engine

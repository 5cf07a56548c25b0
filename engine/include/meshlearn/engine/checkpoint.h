// The training state, its canonical hash, and checkpoint / model files (safetensors).
//
// StateHash() is what verifiers compare: two parties that trained the same work unit from the
// same checkpoint agree on it exactly when their parameters, optimizer moments and step are
// bit-identical. A training state (with an optimizer) is committed tile by tile, so that one
// tile of one tensor of an agreed state can be proven against its hash alone (a dispute over the
// step's input state, docs/verification.md, "Tiles"): StateHashOfRoots(step, seed, stream, the
// tiled root (tile.h's TensorRoot, in the tensor's TileGrid::ForShape grid) of each parameter
// (model order) and then each optimizer state tensor (Optimizer::State order)) =
//   BLAKE2b("meshlearn.train_state.v2", step, seed, stream, the number of tensors,
//           MerkleRoot(those roots))                        (integers u64 little-endian).
// Those roots are exactly the "in.<name>" operator outputs a traced step records first, and the
// parameter and moment outputs it records last (op_trace.h), so the state hashes before and
// after a step follow from its operator outputs.
// A bare model (no optimizer) and ModelStateHash keep the flat form, "meshlearn.train_state.v1":
// step; seed; stream; for each parameter: name length, name bytes, rank, each dimension, byte
// length, raw float32 bytes (what model files and weights hashes have always held).
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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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
// The tiled root of every parameter, then of every optimizer state tensor (none without an
// optimizer): what StateHash commits to.
std::vector<Hash256> StateTensorRoots(TrainState& state);
// The state hash of a state at `step` whose tensors have the tiled roots `tensor_roots` (in
// StateTensorRoots order); StateHash(st) == StateHashOfRoots(st.step, st.seed, st.stream,
// StateTensorRoots(st)) for a state with an optimizer.
Hash256 StateHashOfRoots(int64_t step, uint64_t seed, uint64_t stream,
                         std::span<const Hash256> tensor_roots);
// The flat form of the whole training state, "meshlearn.train_state.v1" with every optimizer
// state tensor after the parameters: what StateHash was before the tiled commitment. Old
// checkpoint files hold it, and tests that pin the bits of a computation pin it (a change of
// the commitment must not move them).
Hash256 FlatStateHash(TrainState& state);
// Whether `stored_hex` (a file's "state_hash") is the state's hash, in the current form or in
// the flat form a checkpoint written before the tiled commitment holds.
bool StateHashMatches(TrainState& state, const std::string& stored_hex);
// The same without the optimizer state: what a model file's "state_hash" covers.
Hash256 ModelStateHash(TrainState& state);

inline constexpr char kCheckpointFormat[] = "meshlearn.checkpoint.v1";
inline constexpr char kModelFormat[] = "meshlearn.model.v1";

// Writes the full state (with optimizer) atomically. `extra` metadata entries are added (the
// vocabulary of a text task: hf_gpt2.h).
Status SaveCheckpoint(Env* env, const std::string& path, TrainState& state,
                      const std::map<std::string, std::string>& extra = {});
// The bytes SaveCheckpoint writes, without a file (built from the state's tensors directly).
std::string CheckpointBytes(TrainState& state,
                            const std::map<std::string, std::string>& extra = {});
// The same bytes handed to `sink` a piece at a time (the header, then each tensor's data straight
// from the state): never a copy of the state in memory. A pipeline stage writes its checkpoint of
// every step to a file this way for its verifiers (node/stage_evidence.h). `sink`'s first error
// is returned.
Status WriteCheckpoint(TrainState& state, const std::function<Status(std::string_view)>& sink,
                       const std::map<std::string, std::string>& extra = {});
// Writes parameters only (plus metadata), atomically. `extra` metadata entries are added.
Status SaveModel(Env* env, const std::string& path, TrainState& state,
                 const std::map<std::string, std::string>& extra = {});
// Reads a checkpoint or a model file; the optimizer is restored when the file has one. Every
// tensor must be present with the right shape and no unknown tensor may be present.
// ReadCheckpoint of the file's bytes.
Result<TrainState> LoadCheckpoint(Env* env, const std::string& path);

// Bytes [offset, offset + out.size()) of a file into `out`; an error when they cannot be had.
using ReadAtFn = std::function<Status(uint64_t offset, std::span<char> out)>;
// LoadCheckpoint of a file of `size` bytes read in pieces through `read`: its header, then each
// tensor's bytes straight into the state's tensor, never the file (nor any tensor twice) in
// memory. A verifier loads a stage's checkpoint this way as it fetches it (node/stage_evidence.h).
// `name` stands for the file in errors. A file that does not parse, names another model, lacks a
// tensor or has one more, or whose tensors do not hash to its "state_hash" is DataLoss; the first
// error of `read` is returned as it is (a caller tells a fault of the source from a bad file).
Result<TrainState> ReadCheckpoint(uint64_t size, const ReadAtFn& read, const std::string& name);
// `bytes` read in place (no copy of them): ReadCheckpoint(bytes.size(), a memcpy from them).
Result<TrainState> ReadCheckpoint(std::string_view bytes, const std::string& name);

}  // namespace meshlearn::engine

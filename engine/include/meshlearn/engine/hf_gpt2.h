// A GPT's vocabulary stored with the model, and the Hugging Face GPT-2 layout of a meshlearn GPT.
//
// Vocabulary. A text task's model is byte level: token id i is the byte vocab[i] (the corpus's
// distinct bytes, sorted). `meshlearn train` stores it in the model and checkpoint files'
// __metadata__ under "vocab" as a JSON array of byte values ("[10,32,33,...]").
//
// Hugging Face layout: a directory that `transformers.GPT2LMHeadModel.from_pretrained(DIR)` and
// tools/hf_gpt2_check.py load, and that meshlearn reads back (eval, generate, train --resume):
//
//   DIR/model.safetensors   transformer.wte.weight (V, C), transformer.wpe.weight (n_positions, C),
//                           transformer.h.{i}.ln_1.{weight,bias} (C),
//                           transformer.h.{i}.attn.c_attn.{weight (C, 3C), bias (3C)},
//                           transformer.h.{i}.attn.c_proj.{weight (C, C), bias (C)},
//                           transformer.h.{i}.ln_2.{weight,bias},
//                           transformer.h.{i}.mlp.c_fc.{weight (C, 4C), bias (4C)},
//                           transformer.h.{i}.mlp.c_proj.{weight (4C, C), bias (C)},
//                           transformer.ln_f.{weight,bias}
//                           Weights of Conv1D layers are [in, out] (y = x @ W + b): meshlearn's
//                           [out, in] matrices transposed, bit for bit. lm_head is tied to wte and
//                           not stored. __metadata__: "format": "pt" (transformers requires it),
//                           "meshlearn.step", "meshlearn.seed", "meshlearn.stream" and
//                           "meshlearn.state_hash" (ModelStateHash), absent in files made
//                           elsewhere.
//   DIR/config.json         GPT2Config: vocab_size, n_positions, n_embd, n_layer, n_head,
//                           activation_function "gelu_new" (GELU, tanh form), layer_norm_epsilon
//                           1e-5, tie_word_embeddings true, dropouts 0.
//   DIR/vocab.json          ["\n", " ", "!", ...]: token id -> its character; a byte >= 0x80 is the
//                           character U+0080..U+00FF of the same number (Latin-1), so every entry
//                           is one character and stands for one byte.
//   DIR/optimizer.safetensors  (when written from a checkpoint) the optimizer moments under
//                           "optim.m.<HF name>" / "optim.v.<HF name>", laid out as their
//                           parameters above, with meshlearn's checkpoint metadata (optimizer
//                           spec, step, seed, stream, state_hash = StateHash): `train --resume DIR`
//                           continues bit for bit.
//
// Reading checks everything and names the file and the field: config.json fields that are
// missing, of the wrong type, out of range or of another architecture (activation_function,
// layer_norm_epsilon, n_inner, tie_word_embeddings, ...); vocab.json entries that are not one
// character U+0000..U+00FF, repeat, or outnumber vocab_size; tensors missing, of the wrong shape
// or dtype, or unknown (lm_head.weight is accepted when equal to wte; the attn.bias /
// attn.masked_bias buffers older transformers versions save are ignored); a state hash that does
// not match.
//
//   ML_RETURN_IF_ERROR(SaveHfGpt2(env, "out/hf", state, vocab));
//   ML_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(env, "out/hf"));   // or a .safetensors file
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"

namespace meshlearn::engine {

inline constexpr char kVocabMetadataKey[] = "vocab";
// "[10,32,...]"
std::string VocabToJson(const std::vector<uint8_t>& vocab);
// Errors (naming `what`) unless a JSON array of distinct integers in [0, 255].
Result<std::vector<uint8_t>> VocabFromJson(const std::string& json, const std::string& what);

inline constexpr char kHfModelFile[] = "model.safetensors";
inline constexpr char kHfConfigFile[] = "config.json";
inline constexpr char kHfVocabFile[] = "vocab.json";
inline constexpr char kHfOptimizerFile[] = "optimizer.safetensors";

// A model read from a meshlearn file or a Hugging Face directory.
struct LoadedModel {
  TrainState state;            // optimizer set when the file(s) hold one
  std::vector<uint8_t> vocab;  // token id -> byte; empty when none is stored (token-file tasks)
  bool hf = false;             // read from a Hugging Face GPT-2 directory
};

// Writes DIR/model.safetensors, config.json, vocab.json (atomically each; DIR is created) and,
// when state.optimizer is set, DIR/optimizer.safetensors. REQUIRES: a GPT model. An empty
// `vocab` writes vocab.json as the identity on bytes 0..vocab_size-1 when vocab_size <= 256, and
// is refused otherwise.
Status SaveHfGpt2(Env* env, const std::string& dir, TrainState& state,
                  const std::vector<uint8_t>& vocab);
// Reads a directory written by SaveHfGpt2 or by transformers' save_pretrained (safetensors).
Result<LoadedModel> LoadHfGpt2(Env* env, const std::string& dir);

// A directory (Hugging Face layout, recognised by its config.json) or a meshlearn model or
// checkpoint file (LoadCheckpoint plus its "vocab" metadata).
Result<LoadedModel> LoadModel(Env* env, const std::string& path);

// The Hugging Face name of a meshlearn GPT parameter, and whether its matrix is stored transposed
// ([in, out]); "" for a name that is not a GPT parameter.
std::string HfGpt2Name(const std::string& name, bool* transposed);

}  // namespace meshlearn::engine

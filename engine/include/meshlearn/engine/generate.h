// Sampling text from a trained GPT, deterministically: the same model, prompt and options give the
// same tokens on every machine, thread count and SIMD path.
//
// Each new token: the context (prompt + tokens so far, cropped to the last block_size) is run
// through the model; the last position's logits l_i, for the ids i < `id_limit` (the ids that have
// a character), are turned into the next token:
//   temperature == 0: the first index of the largest logit (greedy).
//   otherwise: z_i = l_i / temperature (double); with top_k > 0 only the k largest z_i (ties: the
//   lower id) remain; w_i = Exp(float(z_i - max z)) (the engine's own Exp, never libm); u is
//   uniform in [0, 1) with 53 bits from Philox(seed; token index n) (PhiloxUniform, domain 3);
//   the token is the first id (ascending) whose running sum of w (double, in id order) exceeds
//   u * sum(w), else the last remaining id.
// The logits are the engine's (bit-identical everywhere) and every step after them is a fixed
// sequence of IEEE operations, so the text is a pure function of (model, prompt, options).
//
//   SampleOptions o{.tokens = 200, .temperature = 0.8, .top_k = 20, .seed = 7};
//   ML_ASSIGN_OR_RETURN(std::vector<int32_t> ids, SampleTokens(model, prompt_ids, 172, o));
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshlearn/base/status.h"
#include "meshlearn/engine/model.h"

namespace meshlearn::engine {

struct SampleOptions {
  int64_t tokens = 200;      // how many to generate, >= 1
  double temperature = 1.0;  // >= 0; 0 = greedy
  int64_t top_k = 0;         // >= 0; 0 = all ids
  uint64_t seed = 0;
};

// The generated ids (not the prompt). Errors: a model that is not a GPT, an empty prompt, prompt
// ids outside [0, id_limit), options out of range (naming the option).
Result<std::vector<int32_t>> SampleTokens(Model& model, std::span<const int32_t> prompt,
                                          int64_t id_limit, const SampleOptions& options);

}  // namespace meshlearn::engine

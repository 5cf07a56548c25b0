// Test helper: the smallest token task the whole-network tests run, a GPT on a generated text (a
// token task, its data root over the train stream's token pages), so that a sim can play a
// dispute over a step that reads tokens (the embedding lookup) in seconds.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>

#include "meshlearn/base/env.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/base/status.h"

namespace meshlearn::node::testing {

// Writes `dir`/corpus.txt (sentences of 30 words, some 6,000 characters; 16 distinct
// characters: the vocabulary) and returns the task TOML: a 1-block GPT (2 heads, n_embd 16,
// sequences of 16 tokens, 4 a step, AdamW) with a [network] table of `rounds` x `units` units of
// `inner_steps` steps, a checkpoint every `k`. Its data path is absolute in `env`.
inline Result<std::string> WriteTinyGptTask(Env* env, const std::string& dir, uint64_t seed,
                                            uint32_t rounds, uint32_t units, uint32_t inner_steps,
                                            uint32_t k) {
  ML_RETURN_IF_ERROR(env->CreateDirs(dir));
  static constexpr const char* kWords[] = {
      "a",     "cat",  "sat",  "on",   "the",  "mat",   "and",   "ate",   "hot",  "eel",
      "dance", "tide", "ten",  "nest", "seed", "cast",  "dense", "scent", "then", "tense",
      "east",  "mane", "name", "one",  "done", "token", "model", "loss",  "mean", "slate"};
  Rng rng(seed, 11);
  std::string text;
  while (text.size() < 6000) {
    const int words = 3 + static_cast<int>(rng.Uniform(8));
    for (int w = 0; w < words; ++w) {
      if (w > 0) text += ' ';
      text += kWords[rng.Uniform(std::size(kWords))];
    }
    text += ".\n";
  }
  const std::string path = JoinPath(dir, "corpus.txt");
  ML_RETURN_IF_ERROR(env->WriteFileAtomic(path, text));
  return "# tiny GPT test task\n[task]\nname = \"tiny-gpt-sim\"\nseed = " + std::to_string(seed) +
         "\n\n[data]\nformat = \"text\"\npath = \"" + path +
         "\"\n\n[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
         "\n[optimizer]\nkind = \"adamw\"\nlr = 0.003\nweight_decay = 0.0\n\n[train]\nsteps = 1\n"
         "batch_size = 4\n\n[network]\nrounds = " +
         std::to_string(rounds) + "\nunits_per_round = " + std::to_string(units) +
         "\ninner_steps = " + std::to_string(inner_steps) +
         "\ncheckpoint_interval = " + std::to_string(k) +
         "\naggregation = \"mean\"\ninner_lr_final = 0.5\nbudget = 100000000\nprice_cap = 1000\n";
}

}  // namespace meshlearn::node::testing

// The outputs of one training step, operator by operator: what the dispute game's second phase
// bisects (DESIGN.md, "One task, end to end", step 7).
//
// When a Model has an OpTrace attached, Forward, Backward and Trainer::Step append, in a fixed
// order that depends only on the model spec, the BLAKE2b hash of every operator's output: each
// layer's activations, the per-sample losses, each gradient with respect to an activation and to
// a parameter, and finally every parameter after the optimizer update. Two honest runs of the same
// step record identical lists; the first index where two lists differ names the first operator
// that computed something different, and the referee needs to recompute only that one.
//
//   OpTrace trace;
//   trainer->state().model->set_op_trace(&trace);
//   trainer->Step();
//   trainer->state().model->set_op_trace(nullptr);
//   trace.size(); trace.name(i); trace.hash(i);
//
// Recording costs one hash pass over every output (a few percent of a step); nothing is recorded
// when no trace is attached.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/hash.h"

namespace meshlearn::engine {

class OpTrace {
 public:
  void Clear() {
    names_.clear();
    hashes_.clear();
  }
  // Appends the hash of `values` (little-endian float32 bytes, with the name as domain).
  void Record(std::string name, std::span<const float> values);

  size_t size() const { return hashes_.size(); }
  const std::string& name(size_t i) const { return names_[i]; }
  const Hash256& hash(size_t i) const { return hashes_[i]; }
  const std::vector<Hash256>& hashes() const { return hashes_; }

 private:
  std::vector<std::string> names_;
  std::vector<Hash256> hashes_;
};

// Index of the first operator whose hash differs, or -1 when the two traces are equal. A trace
// that is a strict prefix of the other differs at its end.
int64_t FirstDifference(const OpTrace& a, const OpTrace& b);

}  // namespace meshlearn::engine

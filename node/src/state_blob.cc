#include "meshlearn/node/state_blob.h"

namespace meshlearn::node {

GlobalState InitialState(const engine::Trainer& trainer) {
  GlobalState s;
  s.weights = trainer.FlatParams();
  s.momentum.assign(s.weights.size(), 0.0f);
  return s;
}

}  // namespace meshlearn::node

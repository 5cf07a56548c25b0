// One pipeline stage's training step on its own node (issue 15). RunStageStep and what it needs
// (StageContext, StageLink, the tensor encoding and signing) live in the ledger's core
// (ledger/stage_step.h), which executes them to rule a stage dispute; the node calls the same
// functions, re-exported here. What stays in node/: the stages of one replica in one process.
//
//   StageContext ctx{task, round, replica, chain};
//   MemoryStageNetwork net(ctx, keys);                    // or an HttpStageLink per node
//   Result<StageStepOutcome> r = RunStageStep(*stage, ctx, batch, dropout_seed, *net.link(s));
//
// Thread-safety: one thread per Stage; a MemoryStageNetwork's links may be used from one thread
// each, concurrently.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "meshlearn/ledger/stage_step.h"

namespace meshlearn::node {

using ledger::CheckStageTensor;
using ledger::RunStageStep;
using ledger::SignStageTensor;
using ledger::StageContext;
using ledger::StageLink;
using ledger::StageStepOutcome;
using ledger::StageTensorBytes;
using ledger::StageTensorFromBytes;

// The stages of one replica in one process: a mailbox per key, shared by S links. A Receive
// waits for its tensor (forever: every stage runs in its own thread and sends what the others
// need). For tests, and the one-machine run of a pipeline.
class MemoryStageNetwork {
 public:
  // keys[s] signs stage s's tensors; ctx.chain[s] must be keys[s]'s public key.
  MemoryStageNetwork(StageContext ctx, std::vector<KeyPair> keys);
  ~MemoryStageNetwork();
  StageLink* link(int stage);
  // Every record sent so far, in the order sent.
  std::vector<protocol::StageTransfer> sent() const;

 private:
  class Link;
  struct Box {
    protocol::StageTransfer record;
    std::vector<float> values;
  };
  StageContext ctx_;
  std::vector<KeyPair> keys_;
  std::vector<std::unique_ptr<Link>> links_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<protocol::StageTensorKey, Box> boxes_;
  std::vector<protocol::StageTransfer> sent_;
};

}  // namespace meshlearn::node

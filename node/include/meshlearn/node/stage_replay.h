// A verifier's replay of one pipeline stage's step (issue 15; docs/verification.md "Pipeline
// stages"): ReplayStageStep and StageFindingLeaf live in the ledger's core
// (ledger/stage_replay.h), which runs them to rule a stage dispute (RefereeStageStepTx); the node
// calls the same functions, re-exported here.
#pragma once

#include "meshlearn/ledger/stage_replay.h"

namespace meshlearn::node {

using ledger::ReplayStageStep;
using ledger::StageFault;
using ledger::StageFaultName;
using ledger::StageFindingLeaf;
using ledger::StageReplayResult;
using ledger::StageReplaySetup;
using ledger::StageUnservedLeaf;

}  // namespace meshlearn::node

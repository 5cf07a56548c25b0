// Replaying drawn segments of a committed unit, for the verifier and the whistleblower (not a
// public header; docs/verification.md).
//
// The leaves (on chain with the commit) must hash to the commitment. Each segment j is replayed
// from the solver's served checkpoint at its start (which must hash to leaf j), or from the unit's
// start when the solver serves none usable; it is clean when it ends on leaf j + 1 (exact mode)
// or within the task's tolerance of the solver's end state (tolerance mode, compared as the
// referee does). The first mismatching segment ends the check. A unit whose segments were clean
// is then checked for result binding: the state after step H must hash to the last leaf and give
// the committed result. Files go to the check's directory: the solver's checkpoints it fetched,
// and the committed final state when the result is wrong (final.safetensors, the ProveResult
// witness).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshlearn/node/unit_executor.h"
#include "meshlearn/node/unit_service.h"
#include "node_context.h"
#include "records.h"

namespace meshlearn::node {

// What replaying some segments of a checked unit found.
struct SegmentFinding {
  std::vector<Hash256> leaves;  // the solver's committed leaves (checked against its commitment)
  bool mismatch = false;
  uint32_t segment = 0;  // the first segment whose replay ends elsewhere than its committed leaf
  Hash256 start;         // committed leaves around it
  Hash256 solver_end;
  Hash256 replayed_end;  // where the replay ended
  // The solver's checkpoint the replay of `segment` started from (checked against its leaf);
  // empty: the replay started from the unit's start.
  std::string checkpoint;
  ResultCheck result = ResultCheck::kNotShown;

  // As the verdict and challenge journals keep it.
  journal::Finding Record() const;
};

// Replays `segments` of the checked unit `c`; files under `dir`.
Result<SegmentFinding> CheckSegments(NodeContext& node, const CheckAssignment& c,
                                     const std::vector<uint32_t>& segments,
                                     const std::string& dir);

// Where a stage unit's check keeps, when it found the stage's result wrong, the stage's commit of
// its last step and its checkpoint after it (ProveResult's witness).
inline constexpr char kStageFinalCommitFile[] = "stage_final.commit";
inline constexpr char kStageFinalStateFile[] = "stage_final.safetensors";

// A stage unit's check (a pipeline task; docs/verification.md "Pipeline stages"): each drawn
// step (a "segment" of the check, protocol::StageCheckLeaves) replayed with CheckStageStep from
// what the stage node serves, after CheckStageContinuity; the first step whose StageFindingLeaf is
// not the committed step leaf is the mismatch, its replayed_end that finding leaf (a drawn step's
// previous step when that step's commit, read for the continuity check, is not served: its
// `unserved` claim, on a step that may not have been drawn). `leaves` are the check's
// (c.leaves: the stage's commitment, then its step leaves), checked against c.commitment. When
// no step mismatches, the result too: the stage's state after its last step (from that step's
// replay, run now when it was not drawn) gives StageResultBlobId; not c.result_hash is
// `result` kWrong, with what ProveResult sends kept in node.VerifyDir(c).
Result<SegmentFinding> CheckStageSteps(NodeContext& node, const CheckAssignment& c,
                                       const std::vector<uint32_t>& steps);

}  // namespace meshlearn::node

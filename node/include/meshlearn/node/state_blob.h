// The two float blobs of network training, global state and delta: their codec is
// protocol/state_blob.h (the ledger checks them too); this header names it in node:: and adds
// the round-0 state of a task.
//
//   Bytes blob = EncodeGlobalState(weights, momentum);
//   ML_ASSIGN_OR_RETURN(GlobalState s, DecodeGlobalState(blob, trainer->FlatParams().size()));
//   GlobalState s0 = InitialState(*trainer);   // round 0: init + zeros
#pragma once

#include "meshlearn/engine/train.h"
#include "meshlearn/protocol/state_blob.h"

namespace meshlearn::node {

using protocol::DecodeDelta;
using protocol::DecodeGlobalState;
using protocol::EncodeDelta;
using protocol::EncodeGlobalState;
using protocol::GlobalState;
using protocol::kBlobMagicSize;
using protocol::kDeltaMagic;
using protocol::kGlobalStateMagic;
using protocol::kMaxStateFloats;

// Round 0's state of a task: the trainer's initial parameters (from the task seed; call before
// any training) and a zero momentum buffer.
GlobalState InitialState(const engine::Trainer& trainer);

}  // namespace meshlearn::node

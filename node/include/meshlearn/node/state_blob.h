// The two float blobs of network training, global state and delta: their codec is
// protocol/state_blob.h (the ledger checks them too); this header names it in node:: and adds
// the round-0 state of a task.
//
//   Bytes blob = EncodeGlobalState(weights, momentum);
//   ML_ASSIGN_OR_RETURN(GlobalState s, DecodeGlobalState(blob, trainer->FlatParams().size()));
//   GlobalState s0 = InitialState(*trainer);   // round 0: init + zeros
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "meshlearn/engine/train.h"
#include "meshlearn/net/blob_store.h"
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

// A global state's weights (`size` floats), read in parts: read(offset, out) fills `out` with
// weights [offset, offset + out.size()). REQUIRES: the range is within `size`.
struct GlobalWeightsReader {
  uint64_t size = 0;
  std::function<Status(uint64_t offset, std::span<float> out)> read;
};
// Over weights in memory. `weights` must outlive the reader.
GlobalWeightsReader WeightsReader(std::span<const float> weights);
// Over the weights of the global state blob `id` in `store`, its header checked first
// (GlobalStateCount: magic, `expected_n` floats, size): each read takes only the chunks that hold
// its part (BlobStore::ReadRange), so a pipeline stage node takes its stage's slices without the
// whole state in memory. The blob must stay in the store while the reader is used (pinned).
Result<GlobalWeightsReader> BlobWeightsReader(net::BlobStore* store, const net::BlobId& id,
                                              uint64_t expected_n);

}  // namespace meshlearn::node

// The two float blobs of network training (docs/protocol.md):
//
//   global state blob (round r's starting point):
//     "MLGS1" | u64 n | n float32 weights | n float32 outer momentum      (little endian)
//   delta blob (a solver's pseudo-gradient, global - local):
//     "MLDL1" | u64 n | n float32
//
// Both are stored as content-addressed blobs (net/blob.h); their blob ids go on the ledger
// (TaskParams::initial_state, CommitUnit::result_hash, CommitAggregate::state_hash). Decoding
// trusts nothing: the magic, the count (against kMaxStateFloats and, when given, the model's
// parameter count) and the exact byte length are checked, so a truncated blob or one with
// trailing bytes is refused with an error that says which. Values are not checked: a delta may
// hold NaN or huge values (the aggregation rules deal with those, see protocol/aggregate.h).
//
//   Bytes blob = EncodeGlobalState(weights, momentum);
//   ML_ASSIGN_OR_RETURN(GlobalState s, DecodeGlobalState(blob, num_params));
//
// All functions are pure and thread-safe. In protocol/ because the ledger checks these blobs
// too (a ProveResult recomputes a delta's blob id); node/state_blob.h adds InitialState.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/status.h"

namespace meshlearn::protocol {

inline constexpr char kGlobalStateMagic[] = "MLGS1";  // 5 bytes on the wire (no NUL)
inline constexpr char kDeltaMagic[] = "MLDL1";
inline constexpr size_t kBlobMagicSize = 5;
// 2^30 floats = 4 GiB of weights: far above any model we train; bounds allocations.
inline constexpr uint64_t kMaxStateFloats = 1ull << 30;

struct GlobalState {
  std::vector<float> weights;
  std::vector<float> momentum;  // DiLoCo outer momentum buffer, same size
  bool operator==(const GlobalState&) const = default;
};

// REQUIRES: weights.size() == momentum.size().
Bytes EncodeGlobalState(std::span<const float> weights, std::span<const float> momentum);
inline Bytes EncodeGlobalState(const GlobalState& s) {
  return EncodeGlobalState(s.weights, s.momentum);
}
// `expected_n` 0: any count (up to kMaxStateFloats); otherwise the count must equal it.
Result<GlobalState> DecodeGlobalState(ByteSpan blob, uint64_t expected_n = 0);
// A global state blob of `blob_size` bytes read in parts: its float count n from its first bytes
// `head` (at least kGlobalStateHeaderSize), checked as DecodeGlobalState checks a whole blob
// (magic, count, size). Weight i is the little-endian float at byte kGlobalStateHeaderSize + 4 i;
// the momentum follows the n weights. A pipeline stage node reads its stage's slices this way.
inline constexpr size_t kGlobalStateHeaderSize = kBlobMagicSize + 8;
Result<uint64_t> GlobalStateCount(ByteSpan head, uint64_t blob_size, uint64_t expected_n = 0);

Bytes EncodeDelta(std::span<const float> delta);
// A delta blob of n floats in pieces: EncodeDeltaHeader(n), then DeltaFloatBytes of the floats in
// order (EncodeDelta is exactly these). A hash of a delta never encoded whole
// (ledger::StageResultBlobId) is built from them.
Bytes EncodeDeltaHeader(uint64_t n);
ByteSpan DeltaFloatBytes(std::span<const float> floats);
Result<std::vector<float>> DecodeDelta(ByteSpan blob, uint64_t expected_n = 0);

}  // namespace meshlearn::protocol

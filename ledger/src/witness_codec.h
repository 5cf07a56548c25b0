// The pieces every witness a transaction carries encodes the same way (tx.cc's step, segment and
// result witnesses, referee_tile.cc's TileWitness, stage_referee.cc's StageStepWitness): float
// vectors, Merkle proofs, examples with their proofs, token pages with theirs. One wire format,
// one set of bounds (a count is also bounded by the bytes left, Decoder::GetCount).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

inline constexpr uint32_t kMaxWitnessItems = 1u << 16;      // examples, pages
inline constexpr uint32_t kMaxWitnessProofDepth = 64;       // Merkle proof siblings

void PutWitnessFloats(Encoder& e, const std::vector<float>& v);
Status GetWitnessFloats(Decoder& d, std::vector<float>* v, std::string_view field);
void PutMerkleProof(Encoder& e, const MerkleProof& p);
Status GetMerkleProof(Decoder& d, MerkleProof* p, std::string_view field);
void PutWitnessExamples(Encoder& e, const std::vector<StepWitnessExample>& examples);
Status GetWitnessExamples(Decoder& d, std::vector<StepWitnessExample>* examples);
void PutWitnessPages(Encoder& e, const std::vector<TileWitnessPage>& pages);
Status GetWitnessPages(Decoder& d, std::vector<TileWitnessPage>* pages);
// Tiles with their proofs (a TileWitness's, a stage evidence piece's): at most `max` of them, each
// at least `min_bytes` on the wire.
void PutWitnessTiles(Encoder& e, const std::vector<TileWitnessTile>& tiles);
Status GetWitnessTiles(Decoder& d, std::vector<TileWitnessTile>* tiles, uint32_t max,
                       uint32_t min_bytes);
// A witness's leading magic string: InvalidArgument naming `what` when it is another (`hint`, if
// any, appended to the message).
Status GetWitnessMagic(Decoder& d, std::string_view what, std::string_view magic,
                       std::string_view hint = {});
// Whether `bytes` start with `magic` (which kind of witness a transaction carries).
bool HasWitnessMagic(ByteSpan bytes, std::string_view magic);

}  // namespace meshlearn::ledger

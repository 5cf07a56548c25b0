// How the protocol turns a hash into a number, and the draws that a node makes for itself.
//
// Every draw in meshlearn is a domain-separated BLAKE2b hash of what it depends on, read as an
// integer (FirstU64) and, where a sequence is needed, used as an Rng seed. Reading the first 8
// bytes little-endian makes the value independent of the host's byte order, so every party that
// replays a draw (the ledger's followers, the nodes, the auditor) gets the same number.
#pragma once

#include <cstdint>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"

namespace meshlearn::protocol {

// The first 8 bytes of `h` as a little-endian integer.
inline uint64_t FirstU64(const Hash256& h) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | h.bytes[static_cast<size_t>(i)];
  return v;
}

// A whistleblower's own draws for unit `index` of `task_id`, settled at `commit_height`
// (docs/verification.md, "Whistleblowers"). They are keyed by the node's secret key seed, so no
// solver can predict which of its units a given whistleblower re-checks, and a restarted node
// draws the same again.
// WhistleSampleDraw is uniform in [0, 1) (53 bits): the node re-checks the unit when it is below
// its sample rate. WhistleSegment is the segment it replays. REQUIRES: num_segments > 0.
double WhistleSampleDraw(ByteSpan node_secret, const Hash256& task_id, uint64_t index,
                         uint64_t commit_height);
uint32_t WhistleSegment(ByteSpan node_secret, const Hash256& task_id, uint64_t index,
                        uint64_t commit_height, uint32_t num_segments);

}  // namespace meshlearn::protocol

#include "meshlearn/protocol/draw.h"

#include "meshlearn/base/check.h"

namespace meshlearn::protocol {

double WhistleSampleDraw(ByteSpan node_secret, const Hash256& task_id, uint64_t index,
                         uint64_t commit_height) {
  const uint64_t v = FirstU64(Hasher("meshlearn.node.whistle_sample.v1")
                                  .Update(node_secret)
                                  .Update(task_id)
                                  .UpdateU64(index)
                                  .UpdateU64(commit_height)
                                  .Finish());
  return static_cast<double>(v >> 11) * 0x1.0p-53;
}

uint32_t WhistleSegment(ByteSpan node_secret, const Hash256& task_id, uint64_t index,
                        uint64_t commit_height, uint32_t num_segments) {
  CHECK_GT(num_segments, 0u);
  return static_cast<uint32_t>(FirstU64(Hasher("meshlearn.node.whistle_segment.v1")
                                            .Update(node_secret)
                                            .Update(task_id)
                                            .UpdateU64(index)
                                            .UpdateU64(commit_height)
                                            .Finish()) %
                               num_segments);
}

}  // namespace meshlearn::protocol

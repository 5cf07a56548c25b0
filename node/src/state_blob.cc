#include "meshlearn/node/state_blob.h"

#include <algorithm>
#include <cstring>

namespace meshlearn::node {

GlobalWeightsReader WeightsReader(std::span<const float> weights) {
  return {.size = weights.size(), .read = [weights](uint64_t offset, std::span<float> out) {
            CHECK(offset <= weights.size() && out.size() <= weights.size() - offset);
            std::copy_n(weights.begin() + static_cast<std::ptrdiff_t>(offset), out.size(),
                        out.begin());
            return Status::Ok();
          }};
}

Result<GlobalWeightsReader> BlobWeightsReader(net::BlobStore* store, const net::BlobId& id,
                                              uint64_t expected_n) {
  ML_ASSIGN_OR_RETURN(net::Manifest m, store->GetManifest(id));
  const uint64_t head_size = std::min<uint64_t>(m.total_size, protocol::kGlobalStateHeaderSize);
  ML_ASSIGN_OR_RETURN(Bytes head, store->ReadRange(id, 0, head_size));
  ML_ASSIGN_OR_RETURN(const uint64_t n, protocol::GlobalStateCount(head, m.total_size, expected_n));
  return GlobalWeightsReader{
      .size = n, .read = [store, id, n](uint64_t offset, std::span<float> out) -> Status {
        CHECK(offset <= n && out.size() <= n - offset);
        ML_ASSIGN_OR_RETURN(
            Bytes bytes,
            store->ReadRange(id, protocol::kGlobalStateHeaderSize + 4 * offset, 4 * out.size()));
        if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());  // little-endian
        return Status::Ok();
      }};
}

GlobalState InitialState(const engine::Trainer& trainer) {
  GlobalState s;
  s.weights = trainer.FlatParams();
  s.momentum.assign(s.weights.size(), 0.0f);
  return s;
}

}  // namespace meshlearn::node

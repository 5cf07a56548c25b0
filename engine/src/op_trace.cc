#include "meshlearn/engine/op_trace.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace meshlearn::engine {

void OpTrace::Record(std::string name, std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "hashes are over little-endian bytes");
  Hasher h("meshlearn.engine.op");
  h.Update(name);
  h.UpdateU64(values.size());
  h.Update(ByteSpan(reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)));
  names_.push_back(std::move(name));
  hashes_.push_back(h.Finish());
}

int64_t FirstDifference(const OpTrace& a, const OpTrace& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a.hash(i) != b.hash(i)) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

}  // namespace meshlearn::engine

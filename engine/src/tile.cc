#include "meshlearn/engine/tile.h"

#include <algorithm>
#include <bit>

#include "meshlearn/base/check.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/threadpool.h"

namespace meshlearn::engine {
namespace {

constexpr char kTileDomain[] = "meshlearn.engine.tile";

ByteSpan FloatBytes(const float* p, int64_t n) {
  static_assert(std::endian::native == std::endian::little, "tiles hash little-endian floats");
  return ByteSpan(reinterpret_cast<const uint8_t*>(p), static_cast<size_t>(n) * sizeof(float));
}

}  // namespace

TileGrid TileGrid::For(int64_t rows, int64_t cols) {
  CHECK_GE(rows, 1);
  CHECK_GE(cols, 0);
  TileGrid g;
  g.rows = rows;
  g.cols = cols;
  if (rows == 1) {
    g.tile_rows = 1;
    g.tile_cols = kTileFlat;
  } else {
    g.tile_rows = kTileRows;
    g.tile_cols = kTileCols;
  }
  return g;
}

TileGrid TileGrid::ForShape(const Shape& shape) {
  if (shape.size() <= 1) return For(1, shape.empty() ? 1 : shape[0]);
  int64_t rest = 1;
  for (size_t i = 1; i < shape.size(); ++i) rest *= shape[i];
  return For(shape[0], rest);
}

TileGrid::Rect TileGrid::TileRect(int64_t t) const {
  CHECK_GE(t, 0);
  CHECK_LT(t, count());
  const int64_t ct = col_tiles();
  Rect r;
  r.r0 = (t / ct) * tile_rows;
  r.r1 = std::min(rows, r.r0 + tile_rows);
  r.c0 = (t % ct) * tile_cols;
  r.c1 = std::min(cols, r.c0 + tile_cols);
  return r;
}

Hash256 TileHash(std::span<const float> tile) {
  Hasher h(kTileDomain);
  h.Update(FloatBytes(tile.data(), static_cast<int64_t>(tile.size())));
  return h.Finish();
}

Hash256 TileHashAt(std::span<const float> tensor, const TileGrid& g, int64_t t) {
  CHECK_EQ(static_cast<int64_t>(tensor.size()), g.size());
  const TileGrid::Rect r = g.TileRect(t);
  Hasher h(kTileDomain);
  // Row by row: the same bytes as TileHash(ExtractTile(...)), without the copy.
  for (int64_t row = r.r0; row < r.r1; ++row) {
    h.Update(FloatBytes(tensor.data() + row * g.cols + r.c0, r.c1 - r.c0));
  }
  return h.Finish();
}

std::vector<Hash256> TileHashes(std::span<const float> tensor, const TileGrid& g) {
  std::vector<Hash256> hashes(static_cast<size_t>(g.count()));
  ParallelFor(g.count(), GetKernelConfig().threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) hashes[static_cast<size_t>(t)] = TileHashAt(tensor, g, t);
  });
  return hashes;
}

Hash256 TensorRoot(std::span<const float> tensor, const TileGrid& g) {
  return MerkleRoot(TileHashes(tensor, g));
}

std::vector<float> ExtractTile(std::span<const float> tensor, const TileGrid& g, int64_t t) {
  CHECK_EQ(static_cast<int64_t>(tensor.size()), g.size());
  const TileGrid::Rect r = g.TileRect(t);
  std::vector<float> out;
  out.reserve(static_cast<size_t>(r.numel()));
  for (int64_t row = r.r0; row < r.r1; ++row) {
    const float* p = tensor.data() + row * g.cols;
    out.insert(out.end(), p + r.c0, p + r.c1);
  }
  return out;
}

}  // namespace meshlearn::engine

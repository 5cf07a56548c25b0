// Tiled tensor commitments: a tensor is committed as the Merkle root (base/merkle.h) over the
// hashes of fixed-size tiles, so one tile can be opened and proven on its own (DESIGN.md, "One
// task, end to end", step 7; docs/verification.md, "Tiles").
//
// A tensor is viewed as a row-major matrix rows x cols (a parameter or activation of shape
// (d0, d1, ...) as d0 x d1*...; a vector as 1 x n). Its tiles:
//   - a matrix (rows > 1): blocks of kTileRows x kTileCols (32 x 32 = 1024 floats, 4 KiB), in
//     row-major order of blocks; the blocks of the last row/column are cut short;
//   - a vector (rows == 1): runs of kTileFlat = 1024 floats.
// Why 32 x 32: a matmul output tile depends on a row block of the input (32 x C) and a row block
// of the weight (32 x C); at 4 bytes a float that is 256 C bytes, under the 256 KiB witness bound
// for C <= 1000 with room for the Merkle proofs (the fashion MLP's widest input, C = 784, gives a
// 200 KiB footprint). Square tiles keep both halves of a matmul footprint equally small; a long
// reduction that still does not fit narrows into the reduction order instead (tile_rule.h).
//
// A tile's hash is BLAKE2b("meshlearn.engine.tile", the tile's floats in row-major order, as
// little-endian bytes); the tensor's root is MerkleRoot(tile hashes in tile order).
//
//   TileGrid g = TileGrid::For(rows, cols);
//   std::vector<Hash256> hashes = TileHashes(values, g);
//   Hash256 root = MerkleRoot(hashes);                 // what OpTrace records
//   MerkleProof p = MerkleProve(hashes, t);            // opens tile t
//   MerkleVerify(root, TileHash(ExtractTile(values, g, t)), p);
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/engine/tensor.h"

namespace meshlearn::engine {

inline constexpr int64_t kTileRows = 32;
inline constexpr int64_t kTileCols = 32;
inline constexpr int64_t kTileFlat = 1024;

// The tiling of one rows x cols tensor.
struct TileGrid {
  int64_t rows = 1;
  int64_t cols = 0;
  int64_t tile_rows = 1;
  int64_t tile_cols = kTileFlat;

  // The engine's tiling of a rows x cols tensor (see the top of this file). REQUIRES: rows >= 1,
  // cols >= 0.
  static TileGrid For(int64_t rows, int64_t cols);
  // A tensor of `shape` viewed as shape[0] x (the rest); rank <= 1 is a vector.
  static TileGrid ForShape(const Shape& shape);

  int64_t size() const { return rows * cols; }
  int64_t row_tiles() const { return (rows + tile_rows - 1) / tile_rows; }
  int64_t col_tiles() const { return cols == 0 ? 0 : (cols + tile_cols - 1) / tile_cols; }
  int64_t count() const { return row_tiles() * col_tiles(); }

  // The element rectangle [r0, r1) x [c0, c1) of tile t. REQUIRES: 0 <= t < count().
  struct Rect {
    int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
    int64_t numel() const { return (r1 - r0) * (c1 - c0); }
  };
  Rect TileRect(int64_t t) const;
  // The tile holding element (r, c).
  int64_t TileAt(int64_t r, int64_t c) const {
    return (r / tile_rows) * col_tiles() + c / tile_cols;
  }

  bool operator==(const TileGrid&) const = default;
};

// BLAKE2b("meshlearn.engine.tile", floats).
Hash256 TileHash(std::span<const float> tile);
// The hash of tile t of `tensor` (tensor.size() == g.size()), without copying it.
Hash256 TileHashAt(std::span<const float> tensor, const TileGrid& g, int64_t t);
// Every tile's hash, in tile order. Tiles are hashed in parallel on the engine's thread pool (the
// result does not depend on the thread count).
std::vector<Hash256> TileHashes(std::span<const float> tensor, const TileGrid& g);
// MerkleRoot(TileHashes(tensor, g)).
Hash256 TensorRoot(std::span<const float> tensor, const TileGrid& g);
// Tile t's values, row-major within the tile.
std::vector<float> ExtractTile(std::span<const float> tensor, const TileGrid& g, int64_t t);

}  // namespace meshlearn::engine

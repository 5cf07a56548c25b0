// float32 tensors for the training engine: an explicit shape, row-major, contiguous.
//
// Two types:
//  * Tensor owns its storage (parameters, gradients, optimizer moments, datasets). Copyable.
//  * TensorView is a non-owning (pointer, shape) pair: activations living in an Arena, a reshape
//    or flatten of a Tensor. A view never outlives the storage it points into.
//
//   Tensor w({256, 784});                 // zero-filled
//   TensorView v = w.view().Reshape({256 * 784});
//   Arena arena; TensorView act = arena.Alloc({64, 256});   // valid until arena.Reset()
//
// Nothing here is thread-safe; kernels (kernels.h) receive raw pointers from .data().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshlearn/base/check.h"

namespace meshlearn::engine {

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape {}).
int64_t NumElements(const Shape& shape);

// Sets p[0, n) to +0.0f, on the kernels' threads (GetKernelConfig().threads) when n is large: a
// training step zeroes hundreds of MB of gradient buffers, which on one thread would be a serial
// part of every step.
void ZeroFloats(float* p, int64_t n);

// For element-wise work over arrays of `total` elements in all (ParallelForArrays, threadpool.h):
// the kernels' threads, or 1 below the size at which a pool wake-up costs more than a second
// thread saves; and the pieces the arrays are cut into (a multiple of every SIMD width).
int ElementwiseThreads(int64_t total);
inline constexpr int64_t kElementPiece = 1024;
// "(64, 1, 28, 28)".
std::string ShapeToString(const Shape& shape);

// A non-owning view of contiguous float32 data.
class TensorView {
 public:
  TensorView() = default;
  TensorView(float* data, Shape shape) : data_(data), shape_(std::move(shape)) {}

  float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t size() const { return NumElements(shape_); }

  // Same data, another shape. REQUIRES: same number of elements.
  TensorView Reshape(Shape shape) const;
  // (d0, d1, ...) -> (d0, d1*d2*...).
  TensorView Flatten2d() const;

 private:
  float* data_ = nullptr;
  Shape shape_;
};

// An owning, zero-initialised float32 tensor.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(std::move(shape)), data_(NumElements(shape_), 0.0f) {}
  Tensor(Shape shape, std::vector<float> data);  // REQUIRES: data.size() == NumElements(shape)

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  const Shape& shape() const { return shape_; }
  int64_t size() const { return static_cast<int64_t>(data_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }
  std::vector<float>& vec() { return data_; }
  const std::vector<float>& vec() const { return data_; }

  TensorView view() { return TensorView(data_.data(), shape_); }
  void Zero();

 private:
  Shape shape_;
  std::vector<float> data_;
};

// A bump allocator for the activations of one step. Alloc() hands out 64-byte-aligned views that
// stay valid until Reset(); memory is kept across Reset() so steady-state steps do not allocate.
// Allocated memory is NOT zeroed (kernels write every output element).
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  TensorView Alloc(Shape shape);
  // Raw int32 storage (argmax indices, token ids), same lifetime rules.
  int32_t* AllocInt32(int64_t n);
  // Like Alloc, and zero-filled (gradient buffers that backward kernels accumulate into).
  TensorView AllocZeroed(Shape shape);
  void Reset();
  int64_t capacity_bytes() const;

 private:
  void* AllocBytes(int64_t bytes);

  struct Block {
    std::unique_ptr<std::byte[]> mem;
    int64_t size = 0;
    int64_t used = 0;
  };
  std::vector<Block> blocks_;
  size_t current_ = 0;
};

}  // namespace meshlearn::engine

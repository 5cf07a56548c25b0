#include "meshlearn/engine/tensor.h"

#include <algorithm>
#include <cstring>

#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/threadpool.h"

namespace meshlearn::engine {

void ZeroFloats(float* p, int64_t n) {
  // Chunks of 256 KB, threaded from two chunks: in a training step the pool's workers are still
  // polling for the next region, so starting one costs a few microseconds, while the Fashion CNN's
  // backward buffers of 0.8-1.6 MB (below the old 2 MB threshold) were zeroed on one thread while
  // the other waited.
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int threads = GetKernelConfig().threads;
  if (threads <= 1 || n < 2 * kChunk) {
    if (n > 0) std::memset(p, 0, static_cast<size_t>(n) * 4);
    return;
  }
  ParallelFor((n + kChunk - 1) / kChunk, threads, [&](int64_t c0, int64_t c1) {
    const int64_t lo = c0 * kChunk, hi = std::min(n, c1 * kChunk);
    std::memset(p + lo, 0, static_cast<size_t>(hi - lo) * 4);
  });
}

int ElementwiseThreads(int64_t total) {
  return total >= (int64_t{1} << 15) ? GetKernelConfig().threads : 1;
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

TensorView TensorView::Reshape(Shape shape) const {
  CHECK_EQ(NumElements(shape), size()) << ShapeToString(shape_) << " -> " << ShapeToString(shape);
  return TensorView(data_, std::move(shape));
}

TensorView TensorView::Flatten2d() const {
  CHECK_GE(rank(), 1);
  return Reshape({shape_[0], shape_[0] == 0 ? 0 : size() / shape_[0]});
}

Tensor::Tensor(Shape shape, std::vector<float> data)
    : shape_(std::move(shape)), data_(std::move(data)) {
  CHECK_EQ(static_cast<int64_t>(data_.size()), NumElements(shape_));
}

void Tensor::Zero() { ZeroFloats(data_.data(), static_cast<int64_t>(data_.size())); }

void* Arena::AllocBytes(int64_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  while (current_ < blocks_.size()) {
    Block& b = blocks_[current_];
    if (b.size - b.used >= bytes) {
      void* p = b.mem.get() + b.used;
      b.used += bytes;
      return p;
    }
    ++current_;
  }
  Block b;
  b.size = std::max<int64_t>(bytes, int64_t{16} << 20);
  // operator new[] on std::byte is only 16-aligned; over-allocate and align the base by hand.
  b.mem.reset(new std::byte[b.size + 64]);
  int64_t misalign = reinterpret_cast<uintptr_t>(b.mem.get()) % 64;
  int64_t offset = misalign ? 64 - misalign : 0;
  b.used = offset + bytes;
  b.size += offset;
  blocks_.push_back(std::move(b));
  current_ = blocks_.size() - 1;
  return blocks_.back().mem.get() + offset;
}

TensorView Arena::Alloc(Shape shape) {
  int64_t n = NumElements(shape);
  return TensorView(static_cast<float*>(AllocBytes(n * 4)), std::move(shape));
}

TensorView Arena::AllocZeroed(Shape shape) {
  TensorView v = Alloc(std::move(shape));
  ZeroFloats(v.data(), v.size());
  return v;
}

int32_t* Arena::AllocInt32(int64_t n) { return static_cast<int32_t*>(AllocBytes(n * 4)); }

void Arena::Reset() {
  // Keep blocks; start again from the first. Alignment offsets stay at the front of block 0.
  for (Block& b : blocks_) {
    int64_t misalign = reinterpret_cast<uintptr_t>(b.mem.get()) % 64;
    b.used = misalign ? 64 - misalign : 0;
  }
  current_ = 0;
}

int64_t Arena::capacity_bytes() const {
  int64_t n = 0;
  for (const Block& b : blocks_) n += b.size;
  return n;
}

}  // namespace meshlearn::engine

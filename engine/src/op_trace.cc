#include "meshlearn/engine/op_trace.h"

#include <algorithm>
#include <chrono>

#include "meshlearn/base/check.h"

namespace meshlearn::engine {

void OpTrace::Record(std::string name, std::span<const float> values) {
  Record(std::move(name), values, 1, static_cast<int64_t>(values.size()));
}

void OpTrace::Record(std::string name, const Tensor& t) {
  const TileGrid g = TileGrid::ForShape(t.shape());
  Record(std::move(name), {t.data(), static_cast<size_t>(t.size())}, g.rows, g.cols);
}

void OpTrace::Record(std::string name, std::span<const float> values, int64_t rows, int64_t cols) {
  CHECK_EQ(static_cast<int64_t>(values.size()), rows * cols) << name;
  const auto t0 = std::chrono::steady_clock::now();
  const TileGrid grid = TileGrid::For(rows, cols);
  names_.push_back(name_prefix_.empty() ? std::move(name) : name_prefix_ + name);
  hashes_.push_back(TensorRoot(values, grid));
  record_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  grids_.push_back(grid);
  if (keep_values_) {
    values_.resize(hashes_.size() - 1);
    values_.emplace_back(values.begin(), values.end());
  }
}

void OpTrace::Append(OpTrace&& other) {
  if (keep_values_) {
    CHECK(other.keep_values_ || other.size() == 0) << "OpTrace::Append: values not kept";
    values_.resize(hashes_.size());
    for (std::vector<float>& v : other.values_) values_.push_back(std::move(v));
  }
  for (size_t i = 0; i < other.size(); ++i) {
    names_.push_back(std::move(other.names_[i]));
    hashes_.push_back(other.hashes_[i]);
    grids_.push_back(other.grids_[i]);
  }
  record_seconds_ += other.record_seconds_;
  other.Clear();
}

std::span<const float> OpTrace::values(size_t i) const {
  CHECK_LT(i, values_.size()) << "OpTrace::values: set_keep_values(true) before recording";
  return values_[i];
}

int64_t FirstDifference(const OpTrace& a, const OpTrace& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a.hash(i) != b.hash(i)) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

}  // namespace meshlearn::engine

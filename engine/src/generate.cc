#include "meshlearn/engine/generate.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "meshlearn/engine/data.h"
#include "meshlearn/engine/math.h"

namespace meshlearn::engine {
namespace {

constexpr uint32_t kDomainSample = 3;  // data.cc uses 1 (permutations) and 2 (windows)

}  // namespace

Result<std::vector<int32_t>> SampleTokens(Model& model, std::span<const int32_t> prompt,
                                          int64_t id_limit, const SampleOptions& o) {
  const ModelSpec& spec = model.spec();
  if (spec.kind != "gpt") {
    return InvalidArgument("sampling needs a GPT model; this is a " + spec.kind + " model");
  }
  if (o.tokens < 1) {
    return InvalidArgument("--tokens must be >= 1, got " + std::to_string(o.tokens));
  }
  if (!(o.temperature >= 0.0) || o.temperature > 1e6) {
    return InvalidArgument("--temperature must be >= 0 (0 = greedy), got " +
                           std::to_string(o.temperature));
  }
  if (o.top_k < 0) return InvalidArgument("--top-k must be >= 0, got " + std::to_string(o.top_k));
  const int64_t V = spec.gpt.vocab_size;
  const int64_t limit = std::min(id_limit, V);
  if (limit < 1) return InvalidArgument("the model has no token ids to sample");
  if (prompt.empty()) return InvalidArgument("--prompt must not be empty");
  for (int32_t id : prompt) {
    if (id < 0 || id >= limit) {
      return InvalidArgument("prompt token " + std::to_string(id) + " is outside [0, " +
                             std::to_string(limit) + ")");
    }
  }
  std::vector<int32_t> ctx(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(o.tokens));
  const int64_t block = spec.gpt.block_size;
  std::vector<double> z(static_cast<size_t>(limit));
  std::vector<int32_t> order(static_cast<size_t>(limit));
  std::vector<char> keep(static_cast<size_t>(limit));
  for (int64_t n = 0; n < o.tokens; ++n) {
    const int64_t T = std::min<int64_t>(block, static_cast<int64_t>(ctx.size()));
    Batch b;
    b.size = 1;
    b.seq_len = T;
    b.tokens.assign(ctx.end() - T, ctx.end());
    b.targets.assign(static_cast<size_t>(T), 0);
    model.Forward(b, ForwardOptions{});
    const float* row = model.logits().data() + (T - 1) * V;
    int32_t next = 0;
    if (o.temperature == 0.0) {
      for (int32_t i = 1; i < limit; ++i) {
        if (row[i] > row[next]) next = i;
      }
    } else {
      for (int64_t i = 0; i < limit; ++i) z[i] = static_cast<double>(row[i]) / o.temperature;
      std::fill(keep.begin(), keep.end(), 1);
      if (o.top_k > 0 && o.top_k < limit) {
        std::iota(order.begin(), order.end(), 0);
        // Largest first, the lower id first among equals: a total order, so any sort agrees.
        std::sort(order.begin(), order.end(),
                  [&](int32_t a, int32_t c) { return z[a] != z[c] ? z[a] > z[c] : a < c; });
        for (int64_t r = o.top_k; r < limit; ++r) keep[order[r]] = 0;
      }
      double zmax = 0;
      bool first = true;
      for (int64_t i = 0; i < limit; ++i) {
        if (keep[i] && (first || z[i] > zmax)) {
          zmax = z[i];
          first = false;
        }
      }
      std::vector<double> w(static_cast<size_t>(limit), 0.0);
      double sum = 0;
      for (int64_t i = 0; i < limit; ++i) {
        if (!keep[i]) continue;
        w[i] = static_cast<double>(Exp(static_cast<float>(z[i] - zmax)));
        sum += w[i];
      }
      const uint64_t bits =
          PhiloxUniform(o.seed, kDomainSample, 0, static_cast<uint64_t>(n), 0, uint64_t{1} << 53);
      const double target = static_cast<double>(bits) * 0x1p-53 * sum;
      double run = 0;
      next = -1;
      int32_t last = 0;
      for (int32_t i = 0; i < limit; ++i) {
        if (!keep[i]) continue;
        last = i;
        run += w[i];
        if (run > target) {
          next = i;
          break;
        }
      }
      if (next < 0) next = last;
    }
    out.push_back(next);
    ctx.push_back(next);
  }
  return out;
}

}  // namespace meshlearn::engine

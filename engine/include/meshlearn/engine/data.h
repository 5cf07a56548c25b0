// Training data: readers for IDX (MNIST family, optionally gzip), .npy arrays, uint16 token files
// (nanoGPT style) and plain text (character level), and the deterministic batch samplers.
//
// Determinism: the samples of step s are a pure function of (seed, stream, s). A verifier given
// the task seed, the work unit's stream id and a step range recomputes exactly the samples the
// solver used; no list of indices has to be trusted or shipped.
//  * Classification: sample j of step s is position p = s*B + j of an endless sequence of epochs;
//    epoch e = p / N is a Fisher-Yates permutation of [0, N) drawn from Philox(seed; stream, e).
//  * Tokens: window b of step s starts at a uniform offset in [0, N - T - 1] drawn from
//    Philox(seed; stream, s, b) (torch.randint in nanoGPT); targets are the window shifted by one.
//
// Every reader validates its input (magic numbers, header fields, sizes, value ranges) and names
// the file and the problem in its error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/tensor.h"

namespace meshlearn::engine {

// Labelled samples: x is (N, ...) float32, y is (N) class ids in [0, num_classes).
struct ClassificationData {
  Tensor x;
  std::vector<int32_t> y;
  int64_t num_classes = 0;
  int64_t size() const { return static_cast<int64_t>(y.size()); }
};

// A token stream (ids in [0, vocab_size)).
struct TokenData {
  std::vector<int32_t> tokens;
  int64_t vocab_size = 0;
};

// gzip (by magic bytes) or plain: returns the decompressed bytes. Limit guards against bombs.
Result<std::string> MaybeGunzip(std::string bytes, const std::string& name,
                                uint64_t limit = uint64_t{4} << 30);

// IDX files: images (magic 0x00000803, N x rows x cols uint8) and labels (0x00000801, N uint8).
// x = ((pixel / 255) - mean) / std, shaped (N, 1, rows, cols).
Result<ClassificationData> LoadIdx(Env* env, const std::string& images, const std::string& labels,
                                   float mean, float std);

// A .npy array (format 1.0/2.0, C order, little-endian float32 / uint8 / int32).
struct NpyArray {
  std::string dtype;  // "f4", "u1", "i4"
  Shape shape;
  std::string bytes;
  // Element i as float (any dtype).
  float AsFloat(int64_t i) const;
  int64_t AsInt(int64_t i) const;  // REQUIRES: integer dtype
};
Result<NpyArray> ParseNpy(std::string_view bytes, const std::string& name);
Result<NpyArray> LoadNpy(Env* env, const std::string& path);
// x from a float32/uint8 array (N, ...) (uint8 scaled by 1/255), y from a uint8/int32 array (N).
// Then x = (x - mean) / std.
Result<ClassificationData> LoadNpyPair(Env* env, const std::string& x_path,
                                       const std::string& y_path, float mean, float std);

// Flat little-endian uint16 token file (nanoGPT's train.bin).
Result<TokenData> LoadTokens(Env* env, const std::string& path, int64_t vocab_size);

// Character-level text: the vocabulary is the sorted set of distinct bytes of `text`.
struct CharVocab {
  std::vector<uint8_t> chars;  // id -> byte
  int32_t id_of[256];          // byte -> id, -1 if absent
};
CharVocab BuildCharVocab(std::string_view text);
std::vector<int32_t> EncodeChars(const CharVocab& vocab, std::string_view text);

// Deterministic classification batches (see the top of this file). Caches the current epoch's
// permutation; results never depend on the order of calls.
class BatchSampler {
 public:
  BatchSampler(uint64_t seed, uint64_t stream, int64_t n, int64_t batch);
  // Dataset indices of the samples of step `step`.
  std::vector<int64_t> Indices(int64_t step);
  // Fisher-Yates permutation of epoch e.
  static std::vector<int64_t> Permutation(uint64_t seed, uint64_t stream, int64_t epoch, int64_t n);

 private:
  const std::vector<int64_t>& Perm(int64_t epoch);
  uint64_t seed_, stream_;
  int64_t n_, batch_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_;
};

// Offsets of the B windows of step `step`. REQUIRES: n_tokens >= T + 1.
std::vector<int64_t> WindowStarts(uint64_t seed, uint64_t stream, int64_t step, int64_t B,
                                  int64_t n_tokens, int64_t T);

// Uniform integer in [0, n) from Philox(seed; a, b, c, domain), unbiased by rejection.
uint64_t PhiloxUniform(uint64_t seed, uint32_t domain, uint64_t stream, uint64_t a, uint64_t b,
                       uint64_t n);

// Batch assembly. `reuse`: a tensor whose storage becomes the batch's inputs when it holds as many
// floats as they need (a training loop hands back the previous step's inputs: a fresh tensor is
// zero-filled on one thread before the rows are copied in, ~1% of the Fashion MLP's 2-thread step
// while the other thread waits); otherwise the inputs are a new tensor. Only the storage is
// reused: every input is overwritten.
Batch MakeClassificationBatch(const ClassificationData& d, const std::vector<int64_t>& indices,
                              Tensor reuse = Tensor());
Batch MakeTokenBatch(const TokenData& d, const std::vector<int64_t>& starts, int64_t T);

}  // namespace meshlearn::engine

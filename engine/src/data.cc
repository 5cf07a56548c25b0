#include "meshlearn/engine/data.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/threadpool.h"

namespace meshlearn::engine {
namespace {

uint32_t ReadBE32(const unsigned char* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

Result<std::string> ReadMaybeGz(Env* env, const std::string& path) {
  Result<std::string> raw = env->ReadFile(path);
  if (!raw.ok()) return raw.status();
  // A gzip file may say anything about its size: stop decompressing at half the memory this
  // machine has (or 4 GiB), instead of in std::bad_alloc.
  const uint64_t limit = std::min<uint64_t>(uint64_t{4} << 30, AvailableMemoryBytes() / 2);
  return MaybeGunzip(std::move(*raw), path, limit);
}

}  // namespace

Result<std::string> MaybeGunzip(std::string bytes, const std::string& name, uint64_t limit) {
  if (bytes.size() < 2 || static_cast<unsigned char>(bytes[0]) != 0x1f ||
      static_cast<unsigned char>(bytes[1]) != 0x8b) {
    return bytes;  // not gzip
  }
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return Internal(name + ": inflateInit2 failed");
  std::string out;
  out.resize(std::max<size_t>(bytes.size() * 4, 1 << 16));
  zs.next_in = reinterpret_cast<Bytef*>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  int rc = Z_OK;
  size_t produced = 0;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= limit) {
        inflateEnd(&zs);
        return DataLoss(name + ": decompressed data exceeds " + std::to_string(limit) + " bytes");
      }
      out.resize(std::min<uint64_t>(out.size() * 2, limit));
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - produced, 1u << 30));
    uInt before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    produced += before - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      inflateEnd(&zs);
      return DataLoss(name + ": corrupt gzip data (" + std::string(zs.msg ? zs.msg : "zlib error") +
                      ")");
    }
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      inflateEnd(&zs);
      return DataLoss(name + ": gzip data is truncated");
    }
  }
  inflateEnd(&zs);
  out.resize(produced);
  return out;
}

Result<ClassificationData> LoadIdx(Env* env, const std::string& images, const std::string& labels,
                                   float mean, float std) {
  ML_ASSIGN_OR_RETURN(std::string img, ReadMaybeGz(env, images));
  ML_ASSIGN_OR_RETURN(std::string lab, ReadMaybeGz(env, labels));
  auto ip = reinterpret_cast<const unsigned char*>(img.data());
  auto lp = reinterpret_cast<const unsigned char*>(lab.data());
  if (img.size() < 16 || ReadBE32(ip) != 0x00000803) {
    return DataLoss(images + ": not an IDX image file (expected magic 0x00000803: uint8, 3 dims)");
  }
  if (lab.size() < 8 || ReadBE32(lp) != 0x00000801) {
    return DataLoss(labels + ": not an IDX label file (expected magic 0x00000801: uint8, 1 dim)");
  }
  const uint64_t n = ReadBE32(ip + 4), rows = ReadBE32(ip + 8), cols = ReadBE32(ip + 12);
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || n == 0) {
    return DataLoss(images + ": implausible dimensions " + std::to_string(n) + "x" +
                    std::to_string(rows) + "x" + std::to_string(cols));
  }
  if (img.size() != 16 + n * rows * cols) {
    return DataLoss(images + ": header says " + std::to_string(n) + " images of " +
                    std::to_string(rows) + "x" + std::to_string(cols) + " (" +
                    std::to_string(16 + n * rows * cols) + " bytes) but the file has " +
                    std::to_string(img.size()) + " bytes (truncated?)");
  }
  const uint64_t nl = ReadBE32(lp + 4);
  if (nl != n) {
    return DataLoss(labels + ": has " + std::to_string(nl) + " labels but " + images + " has " +
                    std::to_string(n) + " images");
  }
  if (lab.size() != 8 + n) {
    return DataLoss(labels + ": header says " + std::to_string(n) + " labels but the file has " +
                    std::to_string(lab.size() - 8) + " bytes of data (truncated?)");
  }
  ClassificationData d;
  d.x =
      Tensor({static_cast<int64_t>(n), 1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)});
  float* x = d.x.data();
  const unsigned char* px = ip + 16;
  for (uint64_t i = 0; i < n * rows * cols; ++i) {
    x[i] = (static_cast<float>(px[i]) / 255.0f - mean) / std;
  }
  d.y.resize(n);
  int64_t max_label = 0;
  for (uint64_t i = 0; i < n; ++i) {
    d.y[i] = lp[8 + i];
    max_label = std::max<int64_t>(max_label, d.y[i]);
  }
  d.num_classes = max_label + 1;
  return d;
}

float NpyArray::AsFloat(int64_t i) const {
  if (dtype == "f4") {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  return static_cast<float>(AsInt(i));
}

int64_t NpyArray::AsInt(int64_t i) const {
  if (dtype == "u1") return static_cast<unsigned char>(bytes[i]);
  CHECK(dtype == "i4") << dtype;
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

Result<NpyArray> ParseNpy(std::string_view b, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return DataLoss(name + ": not a valid .npy file: " + what);
  };
  if (b.size() < 10 || b.substr(0, 6) != "\x93NUMPY") return bad("missing \\x93NUMPY magic");
  const int major = static_cast<unsigned char>(b[6]);
  size_t header_len, start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(b[8]) | static_cast<unsigned char>(b[9]) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) return bad("truncated header");
    header_len = 0;
    for (int k = 3; k >= 0; --k)
      header_len = header_len << 8 | static_cast<unsigned char>(b[8 + k]);
    start = 12;
  } else {
    return bad("unsupported format version " + std::to_string(major));
  }
  if (header_len > b.size() - start) return bad("header length runs past the end of the file");
  std::string h(b.substr(start, header_len));
  // The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (N,
  // 784), }
  auto field = [&](const std::string& key) -> std::string {
    size_t k = h.find("'" + key + "'");
    if (k == std::string::npos) return "";
    size_t colon = h.find(':', k);
    if (colon == std::string::npos) return "";
    size_t v = h.find_first_not_of(' ', colon + 1);
    if (v == std::string::npos) return "";
    if (h[v] == '(') {
      size_t e = h.find(')', v);
      return e == std::string::npos ? "" : h.substr(v, e - v + 1);
    }
    size_t e = h.find_first_of(",}", v);
    return e == std::string::npos ? "" : h.substr(v, e - v);
  };
  NpyArray a;
  std::string descr = field("descr");
  if (descr == "'<f4'")
    a.dtype = "f4";
  else if (descr == "'|u1'" || descr == "'<u1'")
    a.dtype = "u1";
  else if (descr == "'<i4'")
    a.dtype = "i4";
  else {
    return bad("unsupported dtype " + (descr.empty() ? std::string("(missing)") : descr) +
               "; convert with arr.astype(np.float32) / np.uint8 / np.int32");
  }
  std::string fortran = field("fortran_order");
  if (fortran != "False") {
    return bad("array is not C-ordered (fortran_order " + fortran +
               "); save np.ascontiguousarray(arr)");
  }
  std::string shape = field("shape");
  if (shape.size() < 2 || shape.front() != '(') return bad("missing or malformed shape");
  uint64_t count = 1;
  std::string inner = shape.substr(1, shape.size() - 2);
  size_t pos = 0;
  while (pos < inner.size()) {
    size_t comma = inner.find(',', pos);
    std::string tok =
        inner.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? inner.size() : comma + 1;
    size_t f = tok.find_first_not_of(' ');
    if (f == std::string::npos) continue;
    tok = tok.substr(f, tok.find_last_not_of(' ') - f + 1);
    if (tok.empty() || tok.find_first_not_of("0123456789") != std::string::npos ||
        tok.size() > 12) {
      return bad("bad shape entry '" + tok + "'");
    }
    uint64_t d = std::stoull(tok);
    count *= d;
    if (count > (uint64_t{1} << 36)) return bad("array too large");
    a.shape.push_back(static_cast<int64_t>(d));
  }
  const uint64_t esize = a.dtype == "u1" ? 1 : 4;
  const uint64_t data_len = b.size() - start - header_len;
  if (data_len != count * esize) {
    return bad("shape " + ShapeToString(a.shape) + " needs " + std::to_string(count * esize) +
               " bytes of data, the file has " + std::to_string(data_len) + " (truncated?)");
  }
  a.bytes = std::string(b.substr(start + header_len));
  return a;
}

Result<NpyArray> LoadNpy(Env* env, const std::string& path) {
  ML_ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  return ParseNpy(bytes, path);
}

Result<ClassificationData> LoadNpyPair(Env* env, const std::string& x_path,
                                       const std::string& y_path, float mean, float std) {
  ML_ASSIGN_OR_RETURN(NpyArray xa, LoadNpy(env, x_path));
  ML_ASSIGN_OR_RETURN(NpyArray ya, LoadNpy(env, y_path));
  if (xa.shape.empty() || xa.dtype == "i4") {
    return DataLoss(x_path + ": inputs must be float32 or uint8 with shape (N, ...), got " +
                    xa.dtype + " " + ShapeToString(xa.shape));
  }
  if (ya.shape.size() != 1 || ya.dtype == "f4") {
    return DataLoss(y_path + ": labels must be uint8 or int32 with shape (N), got " + ya.dtype +
                    " " + ShapeToString(ya.shape));
  }
  if (ya.shape[0] != xa.shape[0]) {
    return DataLoss(y_path + ": has " + std::to_string(ya.shape[0]) + " labels but " + x_path +
                    " has " + std::to_string(xa.shape[0]) + " samples");
  }
  ClassificationData d;
  d.x = Tensor(xa.shape);
  const bool u8 = xa.dtype == "u1";
  for (int64_t i = 0; i < d.x.size(); ++i) {
    float v = u8 ? xa.AsFloat(i) / 255.0f : xa.AsFloat(i);
    d.x[i] = (v - mean) / std;
  }
  d.y.resize(ya.shape[0]);
  int64_t max_label = 0;
  for (int64_t i = 0; i < ya.shape[0]; ++i) {
    int64_t v = ya.AsInt(i);
    if (v < 0 || v > 1000000) {
      return DataLoss(y_path + ": label " + std::to_string(v) + " at index " + std::to_string(i) +
                      " is out of range [0, 1000000]");
    }
    d.y[i] = static_cast<int32_t>(v);
    max_label = std::max(max_label, v);
  }
  d.num_classes = max_label + 1;
  return d;
}

Result<TokenData> LoadTokens(Env* env, const std::string& path, int64_t vocab_size) {
  ML_ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  if (bytes.size() % 2 != 0) {
    return DataLoss(path + ": token file has an odd number of bytes (" +
                    std::to_string(bytes.size()) + "); expected little-endian uint16 tokens");
  }
  TokenData d;
  d.vocab_size = vocab_size;
  d.tokens.resize(bytes.size() / 2);
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    int32_t t = static_cast<unsigned char>(bytes[2 * i]) |
                static_cast<unsigned char>(bytes[2 * i + 1]) << 8;
    if (t >= vocab_size) {
      return DataLoss(path + ": token " + std::to_string(t) + " at index " + std::to_string(i) +
                      " is >= vocab_size " + std::to_string(vocab_size));
    }
    d.tokens[i] = t;
  }
  return d;
}

CharVocab BuildCharVocab(std::string_view text) {
  CharVocab v;
  bool seen[256] = {};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  for (int c = 0; c < 256; ++c) {
    v.id_of[c] = -1;
    if (seen[c]) {
      v.id_of[c] = static_cast<int32_t>(v.chars.size());
      v.chars.push_back(static_cast<uint8_t>(c));
    }
  }
  return v;
}

std::vector<int32_t> EncodeChars(const CharVocab& vocab, std::string_view text) {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (char c : text) {
    int32_t id = vocab.id_of[static_cast<unsigned char>(c)];
    out.push_back(id < 0 ? 0 : id);
  }
  return out;
}

uint64_t PhiloxUniform(uint64_t seed, uint32_t domain, uint64_t stream, uint64_t a, uint64_t b,
                       uint64_t n) {
  CHECK_GT(n, 0u);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (uint32_t attempt = 0;; ++attempt) {
    std::array<uint32_t, 4> r = Philox4x32(
        {static_cast<uint32_t>(a), static_cast<uint32_t>(b), static_cast<uint32_t>(stream),
         domain ^ (static_cast<uint32_t>(stream >> 32) << 8)},
        {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32) ^ (attempt * 0x9E3779B9u)});
    uint64_t x = uint64_t{r[0]} << 32 | r[1];
    if (x < limit) return x % n;
    x = uint64_t{r[2]} << 32 | r[3];
    if (x < limit) return x % n;
  }
}

namespace {
constexpr uint32_t kDomainPermutation = 1;
constexpr uint32_t kDomainWindow = 2;
}  // namespace

BatchSampler::BatchSampler(uint64_t seed, uint64_t stream, int64_t n, int64_t batch)
    : seed_(seed), stream_(stream), n_(n), batch_(batch) {
  CHECK_GT(n, 0);
  CHECK_GT(batch, 0);
}

std::vector<int64_t> BatchSampler::Permutation(uint64_t seed, uint64_t stream, int64_t epoch,
                                               int64_t n) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  // Fisher-Yates from the top: swap i with a uniform j in [0, i].
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(PhiloxUniform(seed, kDomainPermutation, stream,
                                                   static_cast<uint64_t>(i),
                                                   static_cast<uint64_t>(epoch), i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

const std::vector<int64_t>& BatchSampler::Perm(int64_t epoch) {
  if (epoch != cached_epoch_) {
    cached_ = Permutation(seed_, stream_, epoch, n_);
    cached_epoch_ = epoch;
  }
  return cached_;
}

std::vector<int64_t> BatchSampler::Indices(int64_t step) {
  std::vector<int64_t> out(batch_);
  for (int64_t j = 0; j < batch_; ++j) {
    int64_t p = step * batch_ + j;
    out[j] = Perm(p / n_)[p % n_];
  }
  return out;
}

std::vector<int64_t> WindowStarts(uint64_t seed, uint64_t stream, int64_t step, int64_t B,
                                  int64_t n_tokens, int64_t T) {
  CHECK_GE(n_tokens, T + 1);
  std::vector<int64_t> out(B);
  for (int64_t b = 0; b < B; ++b) {
    out[b] =
        static_cast<int64_t>(PhiloxUniform(seed, kDomainWindow, stream, static_cast<uint64_t>(step),
                                           static_cast<uint64_t>(b), n_tokens - T));
  }
  return out;
}

Batch MakeClassificationBatch(const ClassificationData& d, const std::vector<int64_t>& indices,
                              Tensor reuse) {
  Batch b;
  b.size = static_cast<int64_t>(indices.size());
  Shape s = d.x.shape();
  const int64_t per = d.x.size() / s[0];
  s[0] = b.size;
  b.inputs = reuse.size() == NumElements(s) ? Tensor(s, std::move(reuse.vec())) : Tensor(s);
  b.targets.resize(b.size);
  for (int64_t j = 0; j < b.size; ++j) b.targets[j] = d.y[indices[j]];
  // A serial part of every step otherwise (the batch's rows are scattered over the data set).
  ParallelFor(b.size, ElementwiseThreads(b.size * per), [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      std::memcpy(b.inputs.data() + j * per, d.x.data() + indices[j] * per, per * sizeof(float));
    }
  });
  return b;
}

Batch MakeTokenBatch(const TokenData& d, const std::vector<int64_t>& starts, int64_t T) {
  Batch b;
  b.size = static_cast<int64_t>(starts.size());
  b.seq_len = T;
  b.tokens.resize(b.size * T);
  b.targets.resize(b.size * T);
  for (int64_t j = 0; j < b.size; ++j) {
    for (int64_t t = 0; t < T; ++t) {
      b.tokens[j * T + t] = d.tokens[starts[j] + t];
      b.targets[j * T + t] = d.tokens[starts[j] + t + 1];
    }
  }
  return b;
}

}  // namespace meshlearn::engine

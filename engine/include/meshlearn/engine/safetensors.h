// safetensors files (https://github.com/huggingface/safetensors): how meshlearn stores models and
// checkpoints, so PyTorch and Hugging Face tools read them directly.
//
// Layout: u64 little-endian N | N bytes of JSON header | data. The header maps each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section) and
// may hold "__metadata__": {string: string}.
//
// The writer is canonical: tensors sorted by name, packed in that order, header padded with spaces
// to a multiple of 8 bytes. The same tensors and metadata always give the same bytes.
//
// The reader trusts nothing: header length within the file, valid JSON object, known dtypes,
// non-negative shapes, offsets in range, matching the shape's byte size, non-overlapping and
// covering the data section exactly. Any violation is a DataLoss error naming the file and the
// problem; nothing is partially returned.
//
//   SafetensorsWriter w;
//   w.AddF32("fc1.weight", tensor);
//   w.SetMetadata("step", "100");
//   ML_RETURN_IF_ERROR(w.Write(Env::Default(), "model.safetensors"));
//   ML_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Read(Env::Default(),
//   "model.safetensors")); ML_ASSIGN_OR_RETURN(Tensor t, f.GetF32("fc1.weight", {256, 784}));
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/tensor.h"

namespace meshlearn::engine {

enum class DType { kF32, kI32, kU8, kI64, kF64 };
std::string_view DTypeName(DType d);  // "F32", ...
int DTypeSize(DType d);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::string bytes;  // little-endian element data, NumElements(shape) * DTypeSize(dtype) bytes
  uint64_t offset = 0;  // where that data begins in the file
  uint64_t size() const { return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype); }
};

class SafetensorsWriter {
 public:
  // kCopy: Add* copy the tensor's data. kView: they keep a pointer to it instead, which must stay
  // alive and unchanged until the last Serialize or WriteTo (a checkpoint written straight from
  // the training state's tensors, with no copy of them).
  enum class Mode { kCopy, kView };
  SafetensorsWriter() = default;
  explicit SafetensorsWriter(Mode mode) : mode_(mode) {}
  SafetensorsWriter(SafetensorsWriter&&) = default;  // an entry's view of its copy moves along
  SafetensorsWriter& operator=(SafetensorsWriter&&) = default;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void AddF32(const std::string& name, const Shape& shape, const float* data);
  void AddF32(const std::string& name, const Tensor& t) { AddF32(name, t.shape(), t.data()); }
  void AddI32(const std::string& name, const Shape& shape, const int32_t* data);
  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  // The canonical file bytes. REQUIRES: tensor names unique and not "__metadata__".
  std::string Serialize() const;
  // The same bytes handed to `sink` in order, a piece at a time (the header, then each tensor's
  // data): never the whole file in memory. The first error of `sink` is returned.
  Status WriteTo(const std::function<Status(std::string_view)>& sink) const;
  // Serialize() then Env::WriteFileAtomic (the file is either old or new after a crash).
  Status Write(Env* env, const std::string& path) const;

 private:
  struct Item {
    DType dtype = DType::kF32;
    Shape shape;
    std::string owned;       // kCopy: the data
    std::string_view bytes;  // the data: `owned`, or the caller's (kView)
  };
  void Add(const std::string& name, DType dtype, const Shape& shape, const void* data);
  // The 8-byte length, the JSON header and its padding; `data_bytes`: the tensors' bytes after.
  std::string Header(uint64_t* data_bytes) const;
  Mode mode_ = Mode::kCopy;
  std::map<std::string, Item> entries_;  // by name: the file's (sorted) order
  std::map<std::string, std::string> metadata_;
};

class SafetensorsFile {
 public:
  // Limits that protect the reader from hostile files.
  static constexpr uint64_t kMaxHeaderBytes = 100 << 20;

  // `name` stands for the file in error messages.
  static Result<SafetensorsFile> Parse(std::string_view bytes, const std::string& name);
  static Result<SafetensorsFile> Read(Env* env, const std::string& path);
  // A file read in pieces (engine::ReadCheckpoint): HeaderSize gives the bytes before the data
  // section (8 + the header's length) from the file's first 8 bytes `first8` (fewer: the file is
  // shorter) and its size; ParseHeader parses those bytes `head` with every check Parse makes,
  // copying no data: each entry's `bytes` stays empty and its `offset` says where its data is.
  // Parse is these two and a copy of each entry's data.
  static Result<uint64_t> HeaderSize(std::string_view first8, uint64_t file_size,
                                     const std::string& name);
  static Result<SafetensorsFile> ParseHeader(std::string_view head, uint64_t file_size,
                                             const std::string& name);

  const std::string& name() const { return name_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Metadata value or NotFound/DataLoss naming the file and key.
  Result<std::string> Metadata(const std::string& key) const;
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  bool Has(const std::string& name) const { return entries_.count(name) != 0; }

  // A float32 tensor; errors if absent, of another dtype, or (when `expect` is non-empty) of
  // another shape.
  Result<Tensor> GetF32(const std::string& tensor, const Shape& expect = {}) const;
  // GetF32's checks alone: the entry itself (its data read elsewhere, from its offset).
  Result<const SafetensorsEntry*> F32Entry(const std::string& tensor,
                                           const Shape& expect = {}) const;

 private:
  std::string name_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace meshlearn::engine

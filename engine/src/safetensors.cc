#include "meshlearn/engine/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include <nlohmann/json.hpp>

namespace meshlearn::engine {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
    case DType::kI64:
      return "I64";
    case DType::kF64:
      return "F64";
  }
  return "?";
}

int DTypeSize(DType d) {
  switch (d) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kU8:
      return 1;
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  return 0;
}

namespace {

bool ParseDType(const std::string& s, DType* d) {
  for (DType c : {DType::kF32, DType::kI32, DType::kU8, DType::kI64, DType::kF64}) {
    if (s == DTypeName(c)) {
      *d = c;
      return true;
    }
  }
  return false;
}

}  // namespace

void SafetensorsWriter::Add(const std::string& name, DType dtype, const Shape& shape,
                            const void* data) {
  CHECK(name != "__metadata__" && !entries_.count(name)) << name;
  Item& e = entries_[name];
  e.dtype = dtype;
  e.shape = shape;
  const std::string_view bytes(static_cast<const char*>(data),
                               static_cast<size_t>(NumElements(shape) * DTypeSize(dtype)));
  if (mode_ == Mode::kCopy) {
    e.owned.assign(bytes);
    e.bytes = e.owned;  // a map node does not move
  } else {
    e.bytes = bytes;
  }
}

void SafetensorsWriter::AddF32(const std::string& name, const Shape& shape, const float* data) {
  Add(name, DType::kF32, shape, data);
}

void SafetensorsWriter::AddI32(const std::string& name, const Shape& shape, const int32_t* data) {
  Add(name, DType::kI32, shape, data);
}

std::string SafetensorsWriter::Header(uint64_t* data_bytes) const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& [name, e] : entries_) {  // std::map: sorted by name
    header[name] = {{"dtype", std::string(DTypeName(e.dtype))},
                    {"shape", e.shape},
                    {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  out += h;
  *data_bytes = offset;
  return out;
}

std::string SafetensorsWriter::Serialize() const {
  uint64_t data_bytes = 0;
  std::string out = Header(&data_bytes);
  out.reserve(out.size() + data_bytes);
  for (const auto& [name, e] : entries_) out += e.bytes;
  return out;
}

Status SafetensorsWriter::WriteTo(const std::function<Status(std::string_view)>& sink) const {
  uint64_t data_bytes = 0;
  ML_RETURN_IF_ERROR(sink(Header(&data_bytes)));
  for (const auto& [name, e] : entries_) ML_RETURN_IF_ERROR(sink(e.bytes));
  return Status::Ok();
}

Status SafetensorsWriter::Write(Env* env, const std::string& path) const {
  return env->WriteFileAtomic(path, Serialize());
}

Result<uint64_t> SafetensorsFile::HeaderSize(std::string_view first8, uint64_t file_size,
                                             const std::string& name) {
  auto bad = [&](const std::string& what) {
    return DataLoss(name + ": not a valid safetensors file: " + what);
  };
  if (file_size < 8 || first8.size() < 8) {
    return bad("file is " + std::to_string(file_size) +
               " bytes, shorter than the 8-byte header length (truncated?)");
  }
  uint64_t n;
  std::memcpy(&n, first8.data(), 8);
  if (n > kMaxHeaderBytes) {
    return bad("header length " + std::to_string(n) + " exceeds the limit of " +
               std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > file_size - 8) {
    return bad("header length " + std::to_string(n) + " runs past the end of the file (" +
               std::to_string(file_size) + " bytes; truncated?)");
  }
  return 8 + n;
}

Result<SafetensorsFile> SafetensorsFile::ParseHeader(std::string_view head, uint64_t file_size,
                                                     const std::string& name) {
  auto bad = [&](const std::string& what) {
    return DataLoss(name + ": not a valid safetensors file: " + what);
  };
  ML_ASSIGN_OR_RETURN(uint64_t header_size, HeaderSize(head, file_size, name));
  if (head.size() != header_size) {
    return bad("the header is " + std::to_string(header_size) + " bytes, " +
               std::to_string(head.size()) + " were given");
  }
  const uint64_t n = header_size - 8;
  nlohmann::json header =
      nlohmann::json::parse(head.substr(8, n), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return bad("header is not valid JSON");
  if (!header.is_object()) return bad("header JSON is not an object");

  SafetensorsFile f;
  f.name_ = name;
  const uint64_t data_size = file_size - header_size;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string> range_names;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return bad("__metadata__." + m.key() + " is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + key + "'";
    if (!v.is_object()) return bad(where + " is not an object");
    for (auto m = v.begin(); m != v.end(); ++m) {
      if (m.key() != "dtype" && m.key() != "shape" && m.key() != "data_offsets") {
        return bad(where + " has unknown field '" + m.key() + "'");
      }
    }
    SafetensorsEntry e;
    e.name = key;
    if (!v.contains("dtype") || !v["dtype"].is_string()) return bad(where + ": missing dtype");
    if (!ParseDType(v["dtype"].get<std::string>(), &e.dtype)) {
      return bad(where + ": unsupported dtype '" + v["dtype"].get<std::string>() +
                 "' (supported: F32, I32, U8, I64, F64)");
    }
    if (!v.contains("shape") || !v["shape"].is_array()) return bad(where + ": missing shape");
    // Count elements with overflow checks: a hostile shape must not wrap around.
    uint64_t count = 1;
    for (const nlohmann::json& d : v["shape"]) {
      if (!d.is_number_unsigned())
        return bad(where + ": shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t{1} << 40) || (dim != 0 && count > (uint64_t{1} << 40) / dim)) {
        return bad(where + ": shape is too large");
      }
      count *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const nlohmann::json* off = v.contains("data_offsets") ? &v["data_offsets"] : nullptr;
    if (!off || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return bad(where + ": data_offsets must be [begin, end] with non-negative integers");
    }
    uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] out of range of the " + std::to_string(data_size) +
                 "-byte data section (truncated?)");
    }
    if (end - begin != count * DTypeSize(e.dtype)) {
      return bad(where + ": data_offsets span " + std::to_string(end - begin) +
                 " bytes but shape " + ShapeToString(e.shape) + " of " +
                 std::string(DTypeName(e.dtype)) + " needs " +
                 std::to_string(count * DTypeSize(e.dtype)));
    }
    e.offset = header_size + begin;
    ranges.push_back({begin, end});
    range_names.push_back(key);
    f.entries_[key] = std::move(e);
  }
  // Ranges must tile [0, data_size) exactly: no overlap, no hole, no trailing bytes.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t pos = 0;
  for (size_t i : order) {
    if (ranges[i].first < pos)
      return bad("tensor '" + range_names[i] + "' overlaps another tensor");
    if (ranges[i].first > pos) {
      return bad("bytes [" + std::to_string(pos) + ", " + std::to_string(ranges[i].first) +
                 ") of the data section belong to no tensor");
    }
    pos = ranges[i].second;
  }
  if (pos != data_size) {
    return bad(std::to_string(data_size - pos) + " trailing bytes after the last tensor");
  }
  return f;
}

Result<SafetensorsFile> SafetensorsFile::Parse(std::string_view bytes, const std::string& name) {
  ML_ASSIGN_OR_RETURN(uint64_t header_size, HeaderSize(bytes.substr(0, 8), bytes.size(), name));
  ML_ASSIGN_OR_RETURN(SafetensorsFile f,
                      ParseHeader(bytes.substr(0, header_size), bytes.size(), name));
  for (auto& [key, e] : f.entries_) {
    e.bytes = std::string(bytes.substr(e.offset, e.size()));
  }
  return f;
}

Result<SafetensorsFile> SafetensorsFile::Read(Env* env, const std::string& path) {
  Result<std::string> bytes = env->ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return Parse(*bytes, path);
}

Result<std::string> SafetensorsFile::Metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return DataLoss(name_ + ": __metadata__ has no '" + key + "'");
  return it->second;
}

Result<const SafetensorsEntry*> SafetensorsFile::F32Entry(const std::string& tensor,
                                                          const Shape& expect) const {
  auto it = entries_.find(tensor);
  if (it == entries_.end()) return DataLoss(name_ + ": missing tensor '" + tensor + "'");
  const SafetensorsEntry& e = it->second;
  if (e.dtype != DType::kF32) {
    return DataLoss(name_ + ": tensor '" + tensor + "' has dtype " +
                    std::string(DTypeName(e.dtype)) + ", expected F32");
  }
  if (!expect.empty() && e.shape != expect) {
    return DataLoss(name_ + ": tensor '" + tensor + "' has shape " + ShapeToString(e.shape) +
                    ", expected " + ShapeToString(expect));
  }
  return &e;
}

Result<Tensor> SafetensorsFile::GetF32(const std::string& tensor, const Shape& expect) const {
  ML_ASSIGN_OR_RETURN(const SafetensorsEntry* entry, F32Entry(tensor, expect));
  const SafetensorsEntry& e = *entry;
  Tensor t(e.shape);
  if (!e.bytes.empty()) std::memcpy(t.data(), e.bytes.data(), e.bytes.size());
  return t;
}

}  // namespace meshlearn::engine

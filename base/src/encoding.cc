#include "meshlearn/base/encoding.h"

#include <bit>
#include <cstring>

namespace meshlearn {

Encoder& Encoder::PutU8(uint8_t v) {
  buf_.push_back(v);
  return *this;
}
Encoder& Encoder::PutU16(uint16_t v) {
  for (int i = 0; i < 2; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}
Encoder& Encoder::PutU32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}
Encoder& Encoder::PutU64(uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}
Encoder& Encoder::PutI64(int64_t v) { return PutU64(static_cast<uint64_t>(v)); }
Encoder& Encoder::PutF32(float v) { return PutU32(std::bit_cast<uint32_t>(v)); }
Encoder& Encoder::PutBytes(ByteSpan b) {
  CHECK_LE(b.size(), kMaxEncodedLength) << "field too long to encode";
  PutU32(static_cast<uint32_t>(b.size()));
  return PutRaw(b);
}
Encoder& Encoder::PutRaw(ByteSpan b) {
  buf_.insert(buf_.end(), b.begin(), b.end());
  return *this;
}

Decoder::Decoder(ByteSpan data, std::string what) : data_(data), what_(std::move(what)) {}

Status Decoder::Need(size_t n, std::string_view field) {
  if (remaining() < n) {
    return DataLoss(what_ + ": truncated at field '" + std::string(field) + "' (needs " +
                    std::to_string(n) + " bytes at offset " + std::to_string(pos_) + ", " +
                    std::to_string(remaining()) + " left)");
  }
  return Status::Ok();
}

Status Decoder::GetRaw(uint8_t* out, size_t n, std::string_view field) {
  ML_RETURN_IF_ERROR(Need(n, field));
  std::memcpy(out, data_.data() + pos_, n);
  pos_ += n;
  return Status::Ok();
}

template <typename T>
static T LoadLE(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

Status Decoder::GetU8(uint8_t* v, std::string_view field) { return GetRaw(v, 1, field); }
Status Decoder::GetU16(uint16_t* v, std::string_view field) {
  uint8_t b[2];
  ML_RETURN_IF_ERROR(GetRaw(b, 2, field));
  *v = LoadLE<uint16_t>(b);
  return Status::Ok();
}
Status Decoder::GetU32(uint32_t* v, std::string_view field) {
  uint8_t b[4];
  ML_RETURN_IF_ERROR(GetRaw(b, 4, field));
  *v = LoadLE<uint32_t>(b);
  return Status::Ok();
}
Status Decoder::GetU64(uint64_t* v, std::string_view field) {
  uint8_t b[8];
  ML_RETURN_IF_ERROR(GetRaw(b, 8, field));
  *v = LoadLE<uint64_t>(b);
  return Status::Ok();
}
Status Decoder::GetI64(int64_t* v, std::string_view field) {
  uint64_t u;
  ML_RETURN_IF_ERROR(GetU64(&u, field));
  *v = static_cast<int64_t>(u);
  return Status::Ok();
}
Status Decoder::GetBool(bool* v, std::string_view field) {
  uint8_t b;
  ML_RETURN_IF_ERROR(GetU8(&b, field));
  if (b > 1) {
    return InvalidArgument(what_ + ": field '" + std::string(field) + "' must be 0 or 1, got " +
                           std::to_string(b));
  }
  *v = b == 1;
  return Status::Ok();
}
Status Decoder::GetF32(float* v, std::string_view field) {
  uint32_t u;
  ML_RETURN_IF_ERROR(GetU32(&u, field));
  *v = std::bit_cast<float>(u);
  return Status::Ok();
}
Status Decoder::GetBytes(Bytes* v, std::string_view field, uint32_t max_len) {
  uint32_t n;
  ML_RETURN_IF_ERROR(GetU32(&n, field));
  if (n > max_len) {
    return InvalidArgument(what_ + ": field '" + std::string(field) + "' is " +
                           std::to_string(n) + " bytes, over the limit of " +
                           std::to_string(max_len));
  }
  ML_RETURN_IF_ERROR(Need(n, field));
  v->assign(data_.begin() + pos_, data_.begin() + pos_ + n);
  pos_ += n;
  return Status::Ok();
}
Status Decoder::GetString(std::string* v, std::string_view field, uint32_t max_len) {
  uint32_t n;
  ML_RETURN_IF_ERROR(GetU32(&n, field));
  if (n > max_len) {
    return InvalidArgument(what_ + ": field '" + std::string(field) + "' is " +
                           std::to_string(n) + " bytes, over the limit of " +
                           std::to_string(max_len));
  }
  ML_RETURN_IF_ERROR(Need(n, field));
  v->assign(reinterpret_cast<const char*>(data_.data()) + pos_, n);
  pos_ += n;
  return Status::Ok();
}
Status Decoder::GetHash(Hash256* v, std::string_view field) {
  return GetRaw(v->bytes.data(), Hash256::kSize, field);
}
Status Decoder::GetPublicKey(PublicKey* v, std::string_view field) {
  return GetRaw(v->bytes.data(), PublicKey::kSize, field);
}
Status Decoder::GetSignature(Signature* v, std::string_view field) {
  return GetRaw(v->bytes.data(), Signature::kSize, field);
}
Status Decoder::GetCount(uint32_t* count, std::string_view field, uint32_t max_count,
                         size_t min_element_size) {
  ML_RETURN_IF_ERROR(GetU32(count, field));
  if (*count > max_count) {
    return InvalidArgument(what_ + ": field '" + std::string(field) + "' has " +
                           std::to_string(*count) + " elements, over the limit of " +
                           std::to_string(max_count));
  }
  if (min_element_size > 0 && *count > remaining() / min_element_size) {
    return DataLoss(what_ + ": field '" + std::string(field) + "' claims " +
                    std::to_string(*count) + " elements but only " +
                    std::to_string(remaining()) + " bytes are left");
  }
  return Status::Ok();
}

Status Decoder::Finish() const {
  if (remaining() != 0) {
    return InvalidArgument(what_ + ": " + std::to_string(remaining()) +
                           " unexpected trailing bytes after offset " + std::to_string(pos_));
  }
  return Status::Ok();
}

}  // namespace meshlearn

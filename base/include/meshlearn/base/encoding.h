// Canonical binary encoding for everything that is signed or hashed.
//
// Rules: integers are fixed-width little-endian; bytes and strings are a u32 length followed by
// the bytes; sequences are a u32 count followed by the elements; there are no maps (encode sorted
// vectors instead). One value has exactly one encoding, so hash(encode(x)) identifies x.
//
//   Encoder e;
//   e.PutU64(nonce).PutString(memo).PutBytes(payload);
//   Bytes wire = e.Take();
//
//   Decoder d(wire, "transfer");     // the name appears in errors
//   uint64_t nonce; std::string memo;
//   ML_RETURN_IF_ERROR(d.GetU64(&nonce, "nonce"));
//   ML_RETURN_IF_ERROR(d.GetString(&memo, "memo", /*max_len=*/256));
//   ML_RETURN_IF_ERROR(d.Finish());  // rejects trailing bytes
//
// Decoding never reads past the end: a truncated input, an over-long length prefix or trailing
// bytes give a DataLoss / InvalidArgument error naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

// Upper bound on any length prefix unless a field gives a smaller one.
inline constexpr uint32_t kMaxEncodedLength = 64u << 20;  // 64 MiB

class Encoder {
 public:
  Encoder& PutU8(uint8_t v);
  Encoder& PutU16(uint16_t v);
  Encoder& PutU32(uint32_t v);
  Encoder& PutU64(uint64_t v);
  Encoder& PutI64(int64_t v);
  Encoder& PutBool(bool v) { return PutU8(v ? 1 : 0); }
  Encoder& PutF32(float v);  // IEEE-754 bits, little-endian
  Encoder& PutBytes(ByteSpan b);
  Encoder& PutString(std::string_view s) { return PutBytes(AsBytes(s)); }
  Encoder& PutHash(const Hash256& h) { return PutRaw(h.span()); }
  Encoder& PutPublicKey(const PublicKey& k) { return PutRaw(k.span()); }
  Encoder& PutSignature(const Signature& s) { return PutRaw(s.span()); }
  Encoder& PutRaw(ByteSpan b);  // no length prefix: fixed-size fields only

  const Bytes& bytes() const { return buf_; }
  Bytes Take() { return std::move(buf_); }
  size_t size() const { return buf_.size(); }

 private:
  Bytes buf_;
};

class Decoder {
 public:
  // `what` names the whole input in error messages ("block 12", "transaction").
  explicit Decoder(ByteSpan data, std::string what = "input");

  Status GetU8(uint8_t* v, std::string_view field);
  Status GetU16(uint16_t* v, std::string_view field);
  Status GetU32(uint32_t* v, std::string_view field);
  Status GetU64(uint64_t* v, std::string_view field);
  Status GetI64(int64_t* v, std::string_view field);
  Status GetBool(bool* v, std::string_view field);  // only 0 or 1 are valid
  Status GetF32(float* v, std::string_view field);
  Status GetBytes(Bytes* v, std::string_view field, uint32_t max_len = kMaxEncodedLength);
  Status GetString(std::string* v, std::string_view field, uint32_t max_len = kMaxEncodedLength);
  Status GetHash(Hash256* v, std::string_view field);
  Status GetPublicKey(PublicKey* v, std::string_view field);
  Status GetSignature(Signature* v, std::string_view field);
  // A u32 element count, checked against max_count and against the bytes left (each element
  // needs at least min_element_size bytes), so a forged count cannot make us allocate.
  Status GetCount(uint32_t* count, std::string_view field, uint32_t max_count,
                  size_t min_element_size = 1);

  // OK iff every byte was consumed.
  Status Finish() const;
  size_t remaining() const { return data_.size() - pos_; }
  size_t position() const { return pos_; }

 private:
  Status Need(size_t n, std::string_view field);
  Status GetRaw(uint8_t* out, size_t n, std::string_view field);

  ByteSpan data_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace meshlearn

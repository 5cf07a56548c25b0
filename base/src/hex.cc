#include "meshlearn/base/hex.h"

#include <string>

namespace meshlearn {

std::string HexEncode(ByteSpan bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

static int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<Bytes> HexDecode(std::string_view hex, std::string_view what) {
  if (hex.size() % 2 != 0) {
    return InvalidArgument(std::string(what) + ": hex string has odd length " +
                           std::to_string(hex.size()) + "; it must be an even number of digits");
  }
  Bytes out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexValue(hex[2 * i]);
    int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument(std::string(what) + ": invalid hex character at position " +
                             std::to_string(hi < 0 ? 2 * i : 2 * i + 1) +
                             "; only 0-9 and a-f are allowed");
    }
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return out;
}

}  // namespace meshlearn

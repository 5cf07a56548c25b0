// Lower-case hexadecimal encoding of bytes.
#pragma once

#include <string>
#include <string_view>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

std::string HexEncode(ByteSpan bytes);

// Accepts upper or lower case; rejects odd length and non-hex characters. `what` names the input
// in the error ("public_key").
Result<Bytes> HexDecode(std::string_view hex, std::string_view what = "hex string");

}  // namespace meshlearn

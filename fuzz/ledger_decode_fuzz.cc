// libFuzzer target: arbitrary bytes into the ledger's transaction and block decoders. See
// ledger_decode_fuzz_body.h for the input format and the properties checked.
//
//   scripts/fuzz.sh                       # builds with clang and runs a short pass
//   build-fuzz/ledger/ledger_decode_fuzz fuzz/corpus/ledger_decode -max_total_time=60
//
// The same body runs over the committed corpus plus bounded random mutations in the default
// test suite (ledger_test, DecodeFuzzTest), so gcc builds exercise it too.
#include <cstddef>
#include <cstdint>

#include "ledger_decode_fuzz_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return meshlearn::ledger::fuzz::LedgerDecodeOneInput(data, size);
}

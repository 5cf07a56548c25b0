// libsodium's initialisation, once per process, before the first hash or signature (hash.cc,
// sign.cc). sodium_init is itself safe to call again; the static keeps it to one call.
#pragma once

#include <sodium.h>

#include "meshlearn/base/check.h"

namespace meshlearn::internal {

inline void InitSodium() {
  static const int rc = sodium_init();
  CHECK(rc >= 0) << "libsodium failed to initialise";
}

}  // namespace meshlearn::internal

// Key files and the key store.
//
// A key file is JSON holding an ed25519 seed, either in the clear or encrypted with a passphrase
// (argon2id13 key derivation + XSalsa20-Poly1305 secretbox). Every file carries a BLAKE2b checksum
// over its fields, so a corrupt file ("checksum mismatch") is told apart from a wrong passphrase
// ("decryption failed"). Files are written atomically with mode 0600; a failed load never writes.
//
//   KeyStore store(Env::Default(), "~/.meshlearn/keys");
//   ML_ASSIGN_OR_RETURN(KeyPair kp, store.Create("alice", passphrase));
//   ML_ASSIGN_OR_RETURN(KeyPair again, store.Load("alice", passphrase));
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

struct KeyInfo {
  std::string name;
  PublicKey public_key;
  bool encrypted = false;
};

// argon2id cost. Interactive (the libsodium default) for real keys; tests use the minimum.
struct KdfCost {
  uint64_t opslimit;
  uint64_t memlimit;
  static KdfCost Interactive();
  static KdfCost Minimum();
};

// `passphrase` empty => stored in the clear.
std::string EncodeKeyFile(const std::string& name, const KeyPair& kp, const std::string& passphrase,
                          KdfCost cost = KdfCost::Interactive());
// Reads the public part without a passphrase (and checks the checksum).
Result<KeyInfo> InspectKeyFile(std::string_view text, std::string_view file);
// `file` names the input in errors.
Result<KeyPair> DecodeKeyFile(std::string_view text, const std::string& passphrase,
                              std::string_view file);

class KeyStore {
 public:
  KeyStore(Env* env, std::string dir, KdfCost cost = KdfCost::Interactive());

  const std::string& dir() const { return dir_; }
  std::string PathOf(const std::string& name) const;

  // Fails with AlreadyExists rather than overwrite a key.
  Result<KeyPair> Create(const std::string& name, const std::string& passphrase);
  // Stores a given key pair (devnets derive keys from seeds).
  Status Put(const std::string& name, const KeyPair& kp, const std::string& passphrase);
  Result<KeyPair> Load(const std::string& name, const std::string& passphrase) const;
  Result<KeyInfo> Info(const std::string& name) const;
  Result<std::vector<KeyInfo>> List() const;
  // Writes a backup of the key file (still encrypted if it was) to `out_path`, mode 0600.
  Status Export(const std::string& name, const std::string& out_path) const;
  // Restores a backup under `name` (the name inside the backup when empty). Validates the
  // backup fully first; never overwrites an existing key.
  Result<KeyInfo> Import(const std::string& backup_path, const std::string& name);

  // Key names: 1-64 characters of [A-Za-z0-9_.-], not starting with '.'.
  static Status ValidateName(const std::string& name);

 private:
  Env* env_;
  std::string dir_;
  KdfCost cost_;
};

}  // namespace meshlearn

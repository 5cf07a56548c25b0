// Key files and the key store.
//
// A key file is JSON holding an ed25519 seed, either in the clear or encrypted with a passphrase
// (argon2id13 key derivation + XSalsa20-Poly1305 secretbox). Every file carries a BLAKE2b checksum
// over its fields, so a corrupt file ("checksum mismatch") is told apart from a wrong passphrase
// ("decryption failed"). Files are written atomically with mode 0600; a failed load never writes.
//
// Safety rules of the store (docs/keys.md):
//   - Creating a key (Create, Put, Import) is exclusive: the file is written under a temporary
//     name and link(2)ed to its own, so of several processes creating one name at once exactly
//     one succeeds and the others get AlreadyExists; an existing key is never replaced.
//   - Load refuses, as ssh does, a key file that other users can read or write (mode & 077) or
//     a keys directory that others can write (mode & 022), naming the chmod that fixes it.
//   - Import checks the whole backup, secret included: an encrypted backup needs its passphrase,
//     and a secret that does not give the file's public key is refused before anything is stored.
//   - List lists every readable key and reports each unreadable file apart.
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

// What KeyStore::List finds: the readable keys, and each key file it could not read with why.
struct KeyListing {
  std::vector<KeyInfo> keys;
  struct Bad {
    std::string name;
    std::string path;
    Status why;
  };
  std::vector<Bad> unreadable;
};

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
  // Fails only if the directory cannot be listed; a bad file is reported in `unreadable`.
  Result<KeyListing> List() const;
  // Writes a backup of the key file (still encrypted if it was) to `out_path`, mode 0600.
  Status Export(const std::string& name, const std::string& out_path) const;
  // Restores a backup under `name` (the name inside the backup when empty). Validates the
  // backup fully first -- decrypting an encrypted one with `passphrase` -- so a backup whose
  // secret does not match its public key is refused here, not when the key is first used.
  // Never overwrites an existing key.
  Result<KeyInfo> Import(const std::string& backup_path, const std::string& name,
                         const std::string& passphrase = "");

  // Key names: 1-64 characters of [A-Za-z0-9_.-], not starting with '.'.
  static Status ValidateName(const std::string& name);

 private:
  Env* env_;
  std::string dir_;
  KdfCost cost_;
};

}  // namespace meshlearn

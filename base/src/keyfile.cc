#include "meshlearn/base/keyfile.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/hex.h"

namespace meshlearn {
namespace {

constexpr char kFormat[] = "meshlearn-key";
constexpr int kVersion = 1;
constexpr char kCipher[] = "argon2id13+xsalsa20poly1305";

struct Fields {
  std::string name;
  std::string public_key;
  std::string encryption;  // "none" or kCipher
  std::string salt, nonce;
  uint64_t opslimit = 0, memlimit = 0;
  std::string secret;  // hex of the seed (clear) or of the ciphertext
};

Hash256 Checksum(const Fields& f) {
  Encoder e;
  e.PutString(kFormat).PutU32(kVersion).PutString(f.name).PutString(f.public_key)
      .PutString(f.encryption).PutString(f.salt).PutString(f.nonce).PutU64(f.opslimit)
      .PutU64(f.memlimit).PutString(f.secret);
  return Blake2b(e.bytes());
}

Status DeriveKey(const std::string& passphrase, ByteSpan salt, uint64_t ops, uint64_t mem,
                 uint8_t* key) {
  if (crypto_pwhash(key, crypto_secretbox_KEYBYTES, passphrase.data(), passphrase.size(),
                    salt.data(), ops, mem, crypto_pwhash_ALG_ARGON2ID13) != 0) {
    return ResourceExhausted("argon2id key derivation ran out of memory (needs " +
                             std::to_string(mem >> 20) + " MiB)");
  }
  return Status::Ok();
}

Result<Fields> ParseFields(std::string_view text, std::string_view file) {
  std::string where(file);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLoss(where + ": not a meshlearn key file (invalid JSON); restore it from a backup "
                            "made with `meshlearn keys export`");
  }
  auto str = [&](const char* k, std::string* out) -> Status {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string()) {
      return DataLoss(where + ": key file is corrupt (field '" + std::string(k) +
                      "' missing or not a string); restore it from a backup");
    }
    *out = it->get<std::string>();
    return Status::Ok();
  };
  auto num = [&](const char* k, uint64_t* out) -> Status {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number_unsigned()) {
      return DataLoss(where + ": key file is corrupt (field '" + std::string(k) +
                      "' missing or not a number); restore it from a backup");
    }
    *out = it->get<uint64_t>();
    return Status::Ok();
  };
  std::string format;
  ML_RETURN_IF_ERROR(str("format", &format));
  uint64_t version = 0;
  ML_RETURN_IF_ERROR(num("version", &version));
  if (format != kFormat) return DataLoss(where + ": not a meshlearn key file (format '" + format + "')");
  if (version != kVersion) {
    return InvalidArgument(where + ": key file version " + std::to_string(version) +
                           " is not supported by this meshlearn (supports " +
                           std::to_string(kVersion) + "); upgrade meshlearn");
  }
  Fields f;
  ML_RETURN_IF_ERROR(str("name", &f.name));
  ML_RETURN_IF_ERROR(str("public_key", &f.public_key));
  ML_RETURN_IF_ERROR(str("encryption", &f.encryption));
  ML_RETURN_IF_ERROR(str("kdf_salt", &f.salt));
  ML_RETURN_IF_ERROR(str("nonce", &f.nonce));
  ML_RETURN_IF_ERROR(num("kdf_opslimit", &f.opslimit));
  ML_RETURN_IF_ERROR(num("kdf_memlimit", &f.memlimit));
  ML_RETURN_IF_ERROR(str("secret", &f.secret));
  std::string checksum;
  ML_RETURN_IF_ERROR(str("checksum", &checksum));
  if (Checksum(f).ToHex() != checksum) {
    return DataLoss(where + ": key file is corrupt (checksum mismatch); restore it from a backup "
                            "made with `meshlearn keys export`");
  }
  if (f.encryption != "none" && f.encryption != kCipher) {
    return DataLoss(where + ": unknown encryption '" + f.encryption + "'");
  }
  return f;
}

std::string Octal(uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0%03o", mode & 0777);
  return buf;
}

// Writes `data` to a new file `path`, failing with AlreadyExists (message `exists`) if a file of
// that name is there, even when another process creates it at the same instant. On the real file
// system: the data goes to a temporary file (O_EXCL, fsync'd), which is link(2)ed to `path` --
// link never replaces an existing name -- then unlinked; a crash leaves at most a stray
// temporary, never a partial key under its own name. Other Envs (MemEnv in tests) are used by
// one thread, where check-then-write is exact.
Status WriteNewFile(Env* env, const std::string& path, std::string_view data, uint32_t mode,
                    const std::string& exists) {
  if (env != Env::Default()) {
    if (env->FileExists(path)) return AlreadyExists(exists);
    return env->WriteFileAtomic(path, data, mode);
  }
  uint8_t rnd[8];
  SecureRandomBytes(rnd);
  const std::string tmp = path + ".new-" + std::to_string(::getpid()) + "-" + HexEncode(rnd);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Internal("cannot create " + tmp + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return Internal("cannot " + what + " " + tmp + ": " + std::strerror(err));
  };
  if (::fchmod(fd, mode) != 0) return fail("chmod");
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("sync");
  if (::close(fd) != 0) {
    fd = -1;
    return fail("close");
  }
  fd = -1;
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (err == EEXIST) return AlreadyExists(exists);
    return Internal("cannot create " + path + ": " + std::strerror(err));
  }
  ::unlink(tmp.c_str());
  const std::string dir = DirName(path);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

}  // namespace

KdfCost KdfCost::Interactive() {
  return {crypto_pwhash_OPSLIMIT_INTERACTIVE, crypto_pwhash_MEMLIMIT_INTERACTIVE};
}
KdfCost KdfCost::Minimum() { return {crypto_pwhash_OPSLIMIT_MIN, crypto_pwhash_MEMLIMIT_MIN}; }

std::string EncodeKeyFile(const std::string& name, const KeyPair& kp, const std::string& passphrase,
                          KdfCost cost) {
  Fields f;
  f.name = name;
  f.public_key = kp.public_key().ToHex();
  if (passphrase.empty()) {
    f.encryption = "none";
    f.secret = HexEncode(kp.seed().bytes);
  } else {
    f.encryption = kCipher;
    uint8_t salt[crypto_pwhash_SALTBYTES];
    uint8_t nonce[crypto_secretbox_NONCEBYTES];
    SecureRandomBytes(salt);
    SecureRandomBytes(nonce);
    uint8_t key[crypto_secretbox_KEYBYTES];
    Status s = DeriveKey(passphrase, salt, cost.opslimit, cost.memlimit, key);
    CHECK(s.ok()) << s.ToString();
    uint8_t cipher[crypto_secretbox_MACBYTES + KeySeed::kSize];
    crypto_secretbox_easy(cipher, kp.seed().bytes.data(), KeySeed::kSize, nonce, key);
    sodium_memzero(key, sizeof(key));
    f.salt = HexEncode(salt);
    f.nonce = HexEncode(nonce);
    f.opslimit = cost.opslimit;
    f.memlimit = cost.memlimit;
    f.secret = HexEncode(cipher);
  }
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["name"] = f.name;
  j["public_key"] = f.public_key;
  j["encryption"] = f.encryption;
  j["kdf_salt"] = f.salt;
  j["kdf_opslimit"] = f.opslimit;
  j["kdf_memlimit"] = f.memlimit;
  j["nonce"] = f.nonce;
  j["secret"] = f.secret;
  j["checksum"] = Checksum(f).ToHex();
  return j.dump(2) + "\n";
}

Result<KeyInfo> InspectKeyFile(std::string_view text, std::string_view file) {
  ML_ASSIGN_OR_RETURN(Fields f, ParseFields(text, file));
  ML_ASSIGN_OR_RETURN(PublicKey pk, PublicKey::FromHex(f.public_key, std::string(file) + ": public_key"));
  return KeyInfo{f.name, pk, f.encryption != "none"};
}

Result<KeyPair> DecodeKeyFile(std::string_view text, const std::string& passphrase,
                              std::string_view file) {
  std::string where(file);
  ML_ASSIGN_OR_RETURN(Fields f, ParseFields(text, file));
  KeySeed seed;
  if (f.encryption == "none") {
    ML_ASSIGN_OR_RETURN(Bytes raw, HexDecode(f.secret, where + ": secret"));
    if (raw.size() != KeySeed::kSize) return DataLoss(where + ": key file is corrupt (seed size)");
    std::memcpy(seed.bytes.data(), raw.data(), KeySeed::kSize);
  } else {
    if (passphrase.empty()) {
      return PermissionDenied(where + ": key is encrypted; give its passphrase "
                                      "(--passphrase-file FILE or MESHLEARN_PASSPHRASE)");
    }
    ML_ASSIGN_OR_RETURN(Bytes salt, HexDecode(f.salt, where + ": kdf_salt"));
    ML_ASSIGN_OR_RETURN(Bytes nonce, HexDecode(f.nonce, where + ": nonce"));
    ML_ASSIGN_OR_RETURN(Bytes cipher, HexDecode(f.secret, where + ": secret"));
    if (salt.size() != crypto_pwhash_SALTBYTES || nonce.size() != crypto_secretbox_NONCEBYTES ||
        cipher.size() != crypto_secretbox_MACBYTES + KeySeed::kSize ||
        f.opslimit < crypto_pwhash_OPSLIMIT_MIN || f.memlimit < crypto_pwhash_MEMLIMIT_MIN ||
        f.opslimit > crypto_pwhash_OPSLIMIT_SENSITIVE || f.memlimit > crypto_pwhash_MEMLIMIT_SENSITIVE) {
      return DataLoss(where + ": key file is corrupt (encryption parameters)");
    }
    uint8_t key[crypto_secretbox_KEYBYTES];
    ML_RETURN_IF_ERROR(DeriveKey(passphrase, salt, f.opslimit, f.memlimit, key));
    int rc = crypto_secretbox_open_easy(seed.bytes.data(), cipher.data(), cipher.size(),
                                        nonce.data(), key);
    sodium_memzero(key, sizeof(key));
    if (rc != 0) return PermissionDenied(where + ": wrong passphrase (decryption failed)");
  }
  KeyPair kp = KeyPair::FromSeed(seed);
  sodium_memzero(seed.bytes.data(), seed.bytes.size());
  if (kp.public_key().ToHex() != f.public_key) {
    return DataLoss(where + ": key file is corrupt (secret does not match public key)");
  }
  return kp;
}

KeyStore::KeyStore(Env* env, std::string dir, KdfCost cost)
    : env_(env), dir_(ExpandHome(dir)), cost_(cost) {}

std::string KeyStore::PathOf(const std::string& name) const {
  return JoinPath(dir_, name + ".key.json");
}

Status KeyStore::ValidateName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') {
    return InvalidArgument("key name '" + name +
                           "' is invalid: use 1-64 characters of A-Z a-z 0-9 _ . - "
                           "not starting with '.'");
  }
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) {
      return InvalidArgument("key name '" + name + "' has character '" + std::string(1, c) +
                             "'; use only A-Z a-z 0-9 _ . -");
    }
  }
  return Status::Ok();
}

Result<KeyPair> KeyStore::Create(const std::string& name, const std::string& passphrase) {
  KeyPair kp = KeyPair::Generate();
  ML_RETURN_IF_ERROR(Put(name, kp, passphrase));
  return kp;
}

Status KeyStore::Put(const std::string& name, const KeyPair& kp, const std::string& passphrase) {
  ML_RETURN_IF_ERROR(ValidateName(name));
  ML_RETURN_IF_ERROR(env_->CreateDirs(dir_, 0700));
  std::string path = PathOf(name);
  const std::string exists = "key '" + name + "' already exists at " + path +
                             "; choose another name or delete the file first";
  if (env_->FileExists(path)) return AlreadyExists(exists);  // before the costly encryption
  return WriteNewFile(env_, path, EncodeKeyFile(name, kp, passphrase, cost_), 0600, exists);
}

Result<KeyPair> KeyStore::Load(const std::string& name, const std::string& passphrase) const {
  ML_RETURN_IF_ERROR(ValidateName(name));
  std::string path = PathOf(name);
  if (!env_->FileExists(path)) {
    return NotFound("no key named '" + name + "' in " + dir_ +
                    "; create one with `meshlearn keys new " + name + "`");
  }
  // As ssh does: a private key that others can read, or in a directory others can write, is
  // not used. (Envs without modes, or a directory they cannot stat, are not checked.)
  if (Result<uint32_t> mode = env_->FileMode(path); mode.ok() && (*mode & 077) != 0) {
    return PermissionDenied("key file " + path + " has mode " + Octal(*mode) +
                            ": other users can read it, so it is not used; run `chmod 600 " +
                            path + "` (and consider the key exposed if others did read it)");
  }
  if (Result<uint32_t> mode = env_->FileMode(dir_); mode.ok() && (*mode & 022) != 0) {
    return PermissionDenied("keys directory " + dir_ + " has mode " + Octal(*mode) +
                            ": other users can replace the keys in it, so they are not used; "
                            "run `chmod 700 " + dir_ + "`");
  }
  ML_ASSIGN_OR_RETURN(std::string text, env_->ReadFile(path));
  return DecodeKeyFile(text, passphrase, path);
}

Result<KeyInfo> KeyStore::Info(const std::string& name) const {
  ML_RETURN_IF_ERROR(ValidateName(name));
  std::string path = PathOf(name);
  if (!env_->FileExists(path)) return NotFound("no key named '" + name + "' in " + dir_);
  ML_ASSIGN_OR_RETURN(std::string text, env_->ReadFile(path));
  ML_ASSIGN_OR_RETURN(KeyInfo info, InspectKeyFile(text, path));
  info.name = name;
  return info;
}

Result<KeyListing> KeyStore::List() const {
  KeyListing out;
  if (!env_->FileExists(dir_)) return out;
  ML_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(dir_));
  const std::string suffix = ".key.json";
  for (const std::string& n : names) {
    if (n.size() <= suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string name = n.substr(0, n.size() - suffix.size());
    Result<KeyInfo> info = Info(name);
    if (info.ok()) {
      out.keys.push_back(std::move(*info));
    } else {
      out.unreadable.push_back({name, JoinPath(dir_, n), info.status()});
    }
  }
  return out;
}

Status KeyStore::Export(const std::string& name, const std::string& out_path) const {
  ML_RETURN_IF_ERROR(Info(name).status());  // validates the file before copying it
  ML_ASSIGN_OR_RETURN(std::string text, env_->ReadFile(PathOf(name)));
  return WriteNewFile(env_, out_path, text, 0600,
                      "backup file " + out_path + " already exists; choose another path");
}

Result<KeyInfo> KeyStore::Import(const std::string& backup_path, const std::string& name,
                                 const std::string& passphrase) {
  ML_ASSIGN_OR_RETURN(std::string text, env_->ReadFile(backup_path));
  ML_ASSIGN_OR_RETURN(KeyInfo info, InspectKeyFile(text, backup_path));
  std::string target = name.empty() ? info.name : name;
  ML_RETURN_IF_ERROR(ValidateName(target));
  std::string path = PathOf(target);
  const std::string exists = "key '" + target + "' already exists; import under another name "
                             "with --name";
  if (env_->FileExists(path)) return AlreadyExists(exists);
  // The checksum proves the file intact, not that its secret is the public key's: decode it.
  if (info.encrypted && passphrase.empty()) {
    return PermissionDenied(backup_path + ": the backup is encrypted; give its passphrase "
                            "(--passphrase-file FILE or MESHLEARN_PASSPHRASE) so that import can "
                            "check its secret before storing it");
  }
  ML_RETURN_IF_ERROR(DecodeKeyFile(text, passphrase, backup_path).status());
  // The name inside the file is checksummed and stays as it was; the file name carries `target`.
  ML_RETURN_IF_ERROR(env_->CreateDirs(dir_, 0700));
  ML_RETURN_IF_ERROR(WriteNewFile(env_, path, text, 0600, exists));
  info.name = target;
  return info;
}

}  // namespace meshlearn

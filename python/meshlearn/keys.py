"""Key files written by `meshlearn keys` (base/keyfile.cc, docs/keys.md), read from Python.

A key file is JSON holding an ed25519 seed, in the clear or sealed with XSalsa20-Poly1305
(libsodium crypto_secretbox) under a key derived by argon2id13 (crypto_pwhash), plus a BLAKE2b
checksum over all its fields. PyNaCl wraps the same libsodium calls (nacl.pwhash.argon2id,
nacl.secret.SecretBox, nacl.signing), so a key the CLI wrote is the key Python signs with. As the
CLI does, a load refuses a key file that other users can read or write and a keys directory that
others can write, and tells a corrupt file (checksum mismatch) from a wrong passphrase.

    key = load_key("alice", home="~/.meshlearn", passphrase="...")
    key.public_key_hex          # the account's address
    key.sign(message)           # 64-byte ed25519 signature
"""

import json
import os
import re
import stat

from .encoding import Encoder, blake2b
from .errors import KeyFileError, WrongPassphrase

_FORMAT = "meshlearn-key"
_VERSION = 1
_CIPHER = "argon2id13+xsalsa20poly1305"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _nacl():
    try:
        import nacl.exceptions
        import nacl.pwhash
        import nacl.secret
        import nacl.signing
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise KeyFileError(
            "signing needs PyNaCl (Debian: apt-get install python3-nacl; scripts/setup.sh "
            "installs it): " + str(e)) from e
    return nacl


def home_dir(home=None):
    """The meshlearn home: `home`, else $MESHLEARN_HOME, else ~/.meshlearn, made absolute
    against the working directory (docs/paths.md)."""
    h = home if home is not None else os.environ.get("MESHLEARN_HOME") or "~/.meshlearn"
    return os.path.abspath(os.path.expanduser(h))


def keys_dir(home=None):
    return os.path.join(home_dir(home), "keys")


def key_path(name, home=None):
    _check_name(name)
    return os.path.join(keys_dir(home), name + ".key.json")


def _check_name(name):
    if not isinstance(name, str) or not _NAME.match(name) or name.startswith("."):
        raise KeyFileError(
            "key name %r is invalid: use 1-64 characters of A-Z a-z 0-9 _ . - not starting "
            "with '.'" % (name,))


def _checksum(f):
    e = Encoder()
    e.string(_FORMAT).u32(_VERSION).string(f["name"]).string(f["public_key"])
    e.string(f["encryption"]).string(f["kdf_salt"]).string(f["nonce"])
    e.u64(f["kdf_opslimit"]).u64(f["kdf_memlimit"]).string(f["secret"])
    return blake2b(e.take()).hex()


def _fields(text, where):
    try:
        j = json.loads(text)
    except ValueError:
        j = None
    if not isinstance(j, dict):
        raise KeyFileError(where + ": not a meshlearn key file (invalid JSON); restore it from a "
                           "backup made with `meshlearn keys export`")

    def get(k, kind):
        v = j.get(k)
        ok = isinstance(v, str) if kind is str else (
            isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        if not ok:
            raise KeyFileError("%s: key file is corrupt (field '%s' missing or not a %s); "
                               "restore it from a backup" %
                               (where, k, "string" if kind is str else "number"))
        return v

    fmt, version = get("format", str), get("version", int)
    if fmt != _FORMAT:
        raise KeyFileError("%s: not a meshlearn key file (format '%s')" % (where, fmt))
    if version != _VERSION:
        raise KeyFileError("%s: key file version %d is not supported by this client (supports "
                           "%d); upgrade meshlearn" % (where, version, _VERSION))
    f = {k: get(k, str) for k in ("name", "public_key", "encryption", "kdf_salt", "nonce",
                                  "secret")}
    f["kdf_opslimit"] = get("kdf_opslimit", int)
    f["kdf_memlimit"] = get("kdf_memlimit", int)
    if _checksum(f) != get("checksum", str):
        raise KeyFileError(where + ": key file is corrupt (checksum mismatch); restore it from a "
                           "backup made with `meshlearn keys export`")
    if f["encryption"] not in ("none", _CIPHER):
        raise KeyFileError("%s: unknown encryption '%s'" % (where, f["encryption"]))
    return f


def _unhex(s, where, field):
    try:
        return bytes.fromhex(s)
    except ValueError:
        raise KeyFileError("%s: %s: expected hex digits" % (where, field)) from None


class Key:
    """An ed25519 key pair loaded from a key file. `name` is the key's name in the store."""

    def __init__(self, name, seed):
        nacl = _nacl()
        self.name = name
        self._signing = nacl.signing.SigningKey(bytes(seed))
        self.public_key = bytes(self._signing.verify_key)

    @property
    def public_key_hex(self):
        return self.public_key.hex()

    def sign(self, message):
        """The 64-byte ed25519 signature of `message` (deterministic, as libsodium's)."""
        return self._signing.sign(bytes(message)).signature

    def __repr__(self):
        return "Key(%r, %s)" % (self.name, self.public_key_hex[:12])


def decode_key_file(text, passphrase=None, where="key file", name=None):
    """The Key in a key file's text (base/keyfile.h DecodeKeyFile)."""
    f = _fields(text, where)
    if f["encryption"] == "none":
        seed = _unhex(f["secret"], where, "secret")
        if len(seed) != 32:
            raise KeyFileError(where + ": key file is corrupt (seed size)")
    else:
        if not passphrase:
            raise KeyFileError(where + ": key is encrypted; give its passphrase (passphrase=... "
                               "or $MESHLEARN_PASSPHRASE)")
        nacl = _nacl()
        salt = _unhex(f["kdf_salt"], where, "kdf_salt")
        nonce = _unhex(f["nonce"], where, "nonce")
        cipher = _unhex(f["secret"], where, "secret")
        a = nacl.pwhash.argon2id
        if (len(salt) != a.SALTBYTES or len(nonce) != nacl.secret.SecretBox.NONCE_SIZE or
                len(cipher) != nacl.secret.SecretBox.MACBYTES + 32 or
                not a.OPSLIMIT_MIN <= f["kdf_opslimit"] <= a.OPSLIMIT_SENSITIVE or
                not a.MEMLIMIT_MIN <= f["kdf_memlimit"] <= a.MEMLIMIT_SENSITIVE):
            raise KeyFileError(where + ": key file is corrupt (encryption parameters)")
        if isinstance(passphrase, str):
            passphrase = passphrase.encode("utf-8")
        box_key = a.kdf(nacl.secret.SecretBox.KEY_SIZE, passphrase, salt,
                        opslimit=f["kdf_opslimit"], memlimit=f["kdf_memlimit"])
        try:
            seed = nacl.secret.SecretBox(box_key).decrypt(cipher, nonce)
        except nacl.exceptions.CryptoError:
            raise WrongPassphrase(where + ": wrong passphrase (decryption failed)") from None
    key = Key(name if name is not None else f["name"], seed)
    if key.public_key_hex != f["public_key"]:
        raise KeyFileError(where + ": key file is corrupt (secret does not match public key)")
    return key


def _mode_text(mode):
    return "0%03o" % (mode & 0o777)


def load_key(name, home=None, passphrase=None):
    """Loads key `name` from <home>/keys (base/keyfile.h KeyStore::Load).

    `passphrase` defaults to $MESHLEARN_PASSPHRASE. Refuses, as ssh does, a key file others can
    read or write and a keys directory others can write."""
    path = key_path(name, home)
    d = os.path.dirname(path)
    if not os.path.exists(path):
        raise KeyFileError("no key named '%s' in %s; create one with `meshlearn keys new %s`" %
                           (name, d, name))
    mode = os.stat(path).st_mode
    if mode & 0o077:
        raise KeyFileError(
            "key file %s has mode %s: other users can read it, so it is not used; run `chmod 600 "
            "%s` (and consider the key exposed if others did read it)" %
            (path, _mode_text(mode), path))
    dmode = os.stat(d).st_mode
    if dmode & 0o022:
        raise KeyFileError(
            "keys directory %s has mode %s: other users can replace the keys in it, so they are "
            "not used; run `chmod 700 %s`" % (d, _mode_text(dmode), d))
    if passphrase is None:
        passphrase = os.environ.get("MESHLEARN_PASSPHRASE")
    with open(path, "r", encoding="utf-8") as fh:
        text = fh.read()
    return decode_key_file(text, passphrase, where=path, name=name)


def public_key_of(name, home=None):
    """The public key (hex) of key `name` without its passphrase (checksum checked)."""
    path = key_path(name, home)
    if not os.path.exists(path):
        raise KeyFileError("no key named '%s' in %s" % (name, os.path.dirname(path)))
    with open(path, "r", encoding="utf-8") as fh:
        return _fields(fh.read(), path)["public_key"]


def list_keys(home=None):
    """[{name, public_key, encrypted}] of the readable keys, and [{name, path, error}] of the
    others (as `meshlearn keys list`)."""
    d = keys_dir(home)
    good, bad = [], []
    if not os.path.isdir(d):
        return good, bad
    for n in sorted(os.listdir(d)):
        if not n.endswith(".key.json") or len(n) <= len(".key.json"):
            continue
        name = n[:-len(".key.json")]
        path = os.path.join(d, n)
        try:
            with open(path, "r", encoding="utf-8") as fh:
                f = _fields(fh.read(), path)
            good.append({"name": name, "public_key": f["public_key"],
                         "encrypted": f["encryption"] != "none"})
        except (OSError, KeyFileError) as e:
            bad.append({"name": name, "path": path, "error": str(e)})
    return good, bad

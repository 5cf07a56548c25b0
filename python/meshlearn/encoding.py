"""The canonical binary encoding of base/encoding.h, for what Python signs and hashes.

Integers are fixed-width little-endian; bytes and strings are a u32 length and the bytes; fixed
size fields (keys, hashes, signatures) are raw. One value has one encoding. Hashes are BLAKE2b-256
as libsodium's crypto_generichash computes them (unkeyed, 32-byte digest); a domain-separated hash
(base/hash.h Hasher(domain)) starts with the domain's length as a u64 and the domain.
"""

import hashlib
import struct


class Encoder:
    def __init__(self):
        self._parts = []

    def u8(self, v):
        self._parts.append(struct.pack("<B", v))
        return self

    def u16(self, v):
        self._parts.append(struct.pack("<H", v))
        return self

    def u32(self, v):
        self._parts.append(struct.pack("<I", v))
        return self

    def u64(self, v):
        self._parts.append(struct.pack("<Q", v))
        return self

    def bytes_(self, b):
        self.u32(len(b))
        self._parts.append(bytes(b))
        return self

    def string(self, s):
        return self.bytes_(s.encode("utf-8"))

    def raw(self, b):
        self._parts.append(bytes(b))
        return self

    def take(self):
        return b"".join(self._parts)


def blake2b(data):
    """BLAKE2b-256 (base/hash.h Blake2b)."""
    return hashlib.blake2b(data, digest_size=32).digest()


def blake2b_domain(domain, data):
    """base/hash.h Hasher(domain).Update(data).Finish()."""
    d = domain.encode("utf-8")
    return hashlib.blake2b(struct.pack("<Q", len(d)) + d + data, digest_size=32).digest()

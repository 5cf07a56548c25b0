"""safetensors files without the safetensors package (engine/safetensors.h's layout):
u64 little-endian N | N bytes of JSON header | data. Written canonically as the engine writes
them: tensors sorted by name, packed in that order, header padded with spaces to 8 bytes."""

import json
import struct

from .errors import MeshlearnError

_SIZES = {"F32": 4, "F64": 8, "I32": 4, "I64": 8, "U8": 1}


def write(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, raw little-endian bytes)}."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        n = _SIZES[dtype]
        for d in shape:
            n *= d
        if n != len(raw):
            raise MeshlearnError("%s: %s has %d bytes, its shape %s needs %d" %
                                 (path, name, len(raw), list(shape), n))
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read(path):
    """({name: (dtype, shape, raw bytes)}, metadata) of a safetensors file, checked."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise MeshlearnError("%s: %s" % (path, e.strerror)) from None
    if len(data) < 8:
        raise MeshlearnError("%s: not a safetensors file (shorter than its header length)" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise MeshlearnError("%s: not a safetensors file (header length %d past the end)" %
                             (path, n))
    try:
        header = json.loads(data[8:8 + n])
    except ValueError:
        raise MeshlearnError("%s: not a safetensors file (header is not JSON)" % path) from None
    if not isinstance(header, dict):
        raise MeshlearnError("%s: not a safetensors file (header is not an object)" % path)
    meta = header.pop("__metadata__", {}) or {}
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        try:
            dtype, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
            size = _SIZES[dtype]
        except (KeyError, TypeError, ValueError):
            raise MeshlearnError("%s: tensor %s: bad header entry %r" % (path, name, e)) from None
        for d in shape:
            size *= d
        if not 0 <= b <= end <= len(body) or end - b != size:
            raise MeshlearnError("%s: tensor %s: offsets %s do not fit its shape %s" %
                                 (path, name, [b, end], shape))
        out[name] = (dtype, tuple(shape), body[b:end])
    return out, meta

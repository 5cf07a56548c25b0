#!/usr/bin/python3
"""Writes PyTorch golden fixtures for the engine kernels to engine/testdata/kernels/<op>.bin.

Run with Debian's python (python3-torch is installed there):
    /usr/bin/python3 tools/gen_kernel_fixtures.py

Each fixture holds the inputs of one op, the forward outputs and every gradient, computed by
PyTorch in float64 from float32-representable inputs (so the goldens are the exact answers up to
float64 rounding) and stored as float32. engine/src/fixtures_test.cc reads them without PyTorch.

File format (little endian):
    magic   4 bytes  b"MLKF"
    version u32      1
    count   u32      number of tensors
    count x tensor:
        name_len u32, name (utf-8)
        dtype    u32  (0 = float32, 1 = int32)
        ndim     u32, dims ndim x i64
        data     prod(dims) x 4 bytes
"""
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine", "testdata", "kernels")
gen = torch.Generator().manual_seed(20261129)


def rand(*shape, lo=-1.0, hi=1.0):
    x = torch.rand(*shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return x.to(torch.float64).requires_grad_(True)


def write(name, tensors):
    path = os.path.join(OUT, name + ".bin")
    with open(path, "wb") as f:
        f.write(b"MLKF")
        f.write(struct.pack("<II", 1, len(tensors)))
        for key, t in tensors.items():
            if isinstance(t, torch.Tensor):
                t = t.detach()
            a = np.asarray(t)
            if a.dtype in (np.int64, np.int32):
                a, code = a.astype("<i4"), 1
            else:
                a, code = a.astype("<f4"), 0
            kb = key.encode()
            f.write(struct.pack("<I", len(kb)) + kb)
            f.write(struct.pack("<II", code, a.ndim))
            f.write(struct.pack("<%dq" % a.ndim, *a.shape))
            f.write(a.tobytes())
    print("wrote", os.path.relpath(path), os.path.getsize(path), "bytes")


def shape_tensor(*dims):
    return np.array(dims, dtype=np.int32)


def linear():
    B, C, OC = 7, 13, 5
    x, w, b = rand(B, C), rand(OC, C), rand(OC)
    out = F.linear(x, w, b)
    dout = rand(B, OC).detach()
    out.backward(dout)
    write("linear", dict(shape=shape_tensor(B, C, OC), x=x, w=w, b=b, out=out, dout=dout,
                         dx=x.grad, dw=w.grad, db=b.grad))


def conv2d():
    B, C, H, W, OC, K, S, P = 2, 3, 9, 8, 4, 3, 2, 1
    x, w, b = rand(B, C, H, W), rand(OC, C, K, K), rand(OC)
    out = F.conv2d(x, w, b, stride=S, padding=P)
    dout = rand(*out.shape).detach()
    out.backward(dout)
    write("conv2d", dict(shape=shape_tensor(B, C, H, W, OC, K, K, S, P), x=x, w=w, b=b, out=out,
                         dout=dout, dx=x.grad, dw=w.grad, db=b.grad))


def maxpool():
    B, C, H, W, K, S = 2, 3, 9, 7, 3, 2
    x = rand(B, C, H, W)
    out = F.max_pool2d(x, K, S)
    dout = rand(*out.shape).detach()
    out.backward(dout)
    write("maxpool2d", dict(shape=shape_tensor(B, C, H, W, K, S), x=x, out=out, dout=dout,
                            dx=x.grad))


def elementwise():
    n = 101
    x = rand(n, lo=-5.0, hi=5.0)
    out = F.relu(x)
    dout = rand(n).detach()
    out.backward(dout)
    write("relu", dict(x=x, out=out, dout=dout, dx=x.grad))
    x = rand(n, lo=-5.0, hi=5.0)
    out = F.gelu(x, approximate="tanh")
    out.backward(dout)
    write("gelu", dict(x=x, out=out, dout=dout, dx=x.grad))


def softmax_ce():
    B, V = 6, 11
    logits = rand(B, V, lo=-4.0, hi=4.0)
    targets = torch.randint(0, V, (B,), generator=gen)
    losses = F.cross_entropy(logits, targets, reduction="none")
    loss = losses.mean()
    loss.backward()
    write("softmax_ce", dict(logits=logits, targets=targets.numpy(),
                             probs=F.softmax(logits, dim=-1), losses=losses,
                             loss=loss.reshape(1), dlogits=logits.grad))


def layernorm():
    N, C = 5, 24
    x, w, b = rand(N, C, lo=-3.0, hi=3.0), rand(C), rand(C)
    out = F.layer_norm(x, (C,), w, b, eps=1e-5)
    dout = rand(N, C).detach()
    out.backward(dout)
    mean = x.detach().mean(dim=-1)
    rstd = 1.0 / torch.sqrt(x.detach().var(dim=-1, unbiased=False) + 1e-5)
    write("layernorm", dict(x=x, w=w, b=b, out=out, mean=mean, rstd=rstd, dout=dout, dx=x.grad,
                            dw=w.grad, db=b.grad))


def embedding():
    N, C, V = 9, 6, 7
    table = rand(V, C)
    ids = torch.tensor([3, 1, 3, 0, 6, 3, 1, 5, 0])
    out = F.embedding(ids, table)
    dout = rand(N, C).detach()
    out.backward(dout)
    write("embedding", dict(ids=ids.numpy(), table=table, out=out, dout=dout, dtable=table.grad))


def attention():
    B, T, C, NH = 2, 5, 12, 3
    hs = C // NH
    qkv = rand(B, T, 3 * C, lo=-2.0, hi=2.0)
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, hs).transpose(1, 2)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    pre = (q @ k.transpose(-2, -1)) * (1.0 / hs ** 0.5)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = F.softmax(pre.masked_fill(~mask, float("-inf")), dim=-1)
    out = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    dout = rand(B, T, C).detach()
    out.backward(dout)
    write("attention", dict(shape=shape_tensor(B, T, C, NH), qkv=qkv, out=out, att=att,
                            dout=dout, dqkv=qkv.grad))


def math_fns():
    x = torch.linspace(-9.0, 9.0, 181, dtype=torch.float32).to(torch.float64)
    xp = torch.logspace(-30, 30, 121, dtype=torch.float64).to(torch.float32).to(torch.float64)
    write("math", dict(x=x, exp=torch.exp(x), tanh=torch.tanh(x), erf=torch.erf(x), xpos=xp,
                       log=torch.log(xp)))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_default_dtype(torch.float64)
    for fn in (linear, conv2d, maxpool, elementwise, softmax_ce, layernorm, embedding, attention,
               math_fns):
        fn()
    return 0


if __name__ == "__main__":
    sys.exit(main())

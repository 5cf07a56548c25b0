#!/usr/bin/python3
"""Loads a meshlearn model (safetensors) into PyTorch and checks it predicts what meshlearn predicts.

Usage:
  /usr/bin/python3 tools/safetensors_check.py MODEL.safetensors [--fixture FIXTURE.safetensors]

MODEL is written by `meshlearn train` (OUT/model.safetensors). Its __metadata__ "model" entry
describes the architecture; this script rebuilds it with torch.nn modules (nn.Sequential for
sequential models, a nanoGPT-style module for kind = "gpt"), loads the tensors with strict=True
and checks that every parameter round-trips bit for bit.

FIXTURE (written by engine_model_test's TorchCheckTest) holds "inputs" (float32 samples) or
"tokens" (int32 ids) and "logits", meshlearn's output for them. The check passes when PyTorch's
logits match to 1e-4 (relative to the logit scale) and every argmax prediction agrees (except
near-ties closer than 1e-4, which are reported).

Only the standard library and torch are used (no safetensors / numpy packages needed).
Exit status 0 on success, 1 on a mismatch, 2 on bad input.
"""
import argparse
import json
import math
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": (torch.float32, 4), "I32": (torch.int32, 4), "U8": (torch.uint8, 1),
          "I64": (torch.int64, 8), "F64": (torch.float64, 8)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        dtype, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        count = math.prod(shape) if shape else 1
        if end - begin != count * size or end > len(body):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets")
        buf = bytearray(body[begin:end])
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape).clone()
    return meta, tensors


def build_sequential(spec):
    shape = list(spec["input"])
    mods = []
    for i, l in enumerate(spec["layers"]):
        k = l["kind"]
        if k == "linear":
            mods.append(nn.Linear(shape[0], l["out"], bias=l.get("bias", True)))
            shape = [l["out"]]
        elif k == "conv2d":
            m = nn.Conv2d(shape[0], l["out"], l["kernel"], stride=l["stride"], padding=l["pad"],
                          bias=l.get("bias", True))
            mods.append(m)
            oh = (shape[1] + 2 * l["pad"] - l["kernel"]) // l["stride"] + 1
            ow = (shape[2] + 2 * l["pad"] - l["kernel"]) // l["stride"] + 1
            shape = [l["out"], oh, ow]
        elif k == "maxpool2d":
            mods.append(nn.MaxPool2d(l["kernel"], stride=l["stride"]))
            shape = [shape[0], (shape[1] - l["kernel"]) // l["stride"] + 1,
                     (shape[2] - l["kernel"]) // l["stride"] + 1]
        elif k == "relu":
            mods.append(nn.ReLU())
        elif k == "gelu":
            mods.append(nn.GELU(approximate="tanh"))
        elif k == "flatten":
            mods.append(nn.Flatten())
            shape = [math.prod(shape)]
        elif k == "dropout":
            mods.append(nn.Dropout(l["p"]))
        elif k == "layernorm":
            mods.append(nn.LayerNorm(shape[-1], eps=1e-5))
        else:
            raise ValueError(f"unknown layer kind {k}")

    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(*mods)

        def forward(self, x):
            return self.layers(x)

    return Seq()


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        hs = C // self.nh
        q = q.view(B, T, self.nh, hs).transpose(1, 2)
        k = k.view(B, T, self.nh, hs).transpose(1, 2)
        v = v.view(B, T, self.nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn.c_proj(y)
        x = x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class Gpt(nn.Module):
    def __init__(self, spec):
        super().__init__()
        C, V = spec["n_embd"], spec["vocab_size"]
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(V, C)
        self.transformer.wpe = nn.Embedding(spec["block_size"], C)
        self.transformer.h = nn.ModuleList([Block(C, spec["n_head"]) for _ in range(spec["n_layer"])])
        self.transformer.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx):
        B, T = idx.shape
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return (x @ self.transformer.wte.weight.t()).reshape(B * T, -1)  # tied LM head


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--fixture")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    try:
        meta, tensors = read_safetensors(args.model)
        spec = json.loads(meta["model"])
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = build_sequential(spec) if spec["kind"] == "sequential" else Gpt(spec)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    for name, p in model.state_dict().items():
        if not torch.equal(p, tensors[name]):
            print(f"FAIL: parameter {name} changed when loaded", file=sys.stderr)
            return 1
    nparams = sum(t.numel() for t in tensors.values())
    print(f"torch {torch.__version__}: loaded {args.model} ({spec['kind']}, {len(tensors)} tensors, "
          f"{nparams} parameters, step {meta.get('step')}) with strict=True")
    if not args.fixture:
        return 0
    _, fx = read_safetensors(args.fixture)
    torch.set_num_threads(1)
    with torch.no_grad():
        if "tokens" in fx:
            logits = model(fx["tokens"].long())
        else:
            logits = model(fx["inputs"])
    want = fx["logits"]
    if logits.shape != want.shape:
        print(f"FAIL: logits shape {tuple(logits.shape)} != meshlearn's {tuple(want.shape)}")
        return 1
    scale = max(1.0, want.abs().max().item())
    diff = (logits - want).abs().max().item()
    top2 = want.topk(2, dim=1).values
    near_tie = (top2[:, 0] - top2[:, 1]) < args.tol * scale
    agree = logits.argmax(dim=1) == want.argmax(dim=1)
    bad = (~agree & ~near_tie).sum().item()
    print(f"predictions: {agree.sum().item()}/{len(agree)} argmax identical "
          f"({near_tie.sum().item()} near-ties), max |logit diff| = {diff:.3g} "
          f"(scale {scale:.3g}, tolerance {args.tol * scale:.3g})")
    if diff > args.tol * scale or bad:
        print("FAIL: PyTorch disagrees with meshlearn")
        return 1
    print("OK: PyTorch gives the same predictions")
    return 0


if __name__ == "__main__":
    sys.exit(main())

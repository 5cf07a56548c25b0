#!/usr/bin/python3
"""Builds a GPT-2 in PyTorch from a Hugging Face GPT-2 directory written by `meshlearn export` and
checks that it reproduces meshlearn's validation loss and logits.

Usage:
  /usr/bin/python3 tools/hf_gpt2_check.py DIR --fixture FIXTURE.safetensors

DIR holds model.safetensors (GPT2LMHeadModel names: transformer.wte.weight, transformer.wpe.weight,
transformer.h.{i}.ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj,
transformer.ln_f; Conv1D weights [in, out]), config.json (GPT2Config) and vocab.json. The model is
Hugging Face's GPT-2 written out in torch (no transformers package needed): learned positions,
pre-norm blocks, LayerNorm with config.layer_norm_epsilon, Conv1D y = x @ W + b, causal attention
scaled by 1/sqrt(head size), GELU tanh form ("gelu_new"), lm_head tied to wte. The state dict is
loaded with strict=True (the causal-mask buffers and a tied lm_head.weight that older
transformers versions save are dropped first).

FIXTURE (written by engine_model_test's HfGpt2CheckTest) holds "tokens" and "targets" (int32,
(N, T): meshlearn's validation windows), "prompt" (int32, (P)) and "prompt_logits" (float32,
(P, V): meshlearn's logits for the prompt), and __metadata__ "val_loss" (meshlearn's validation
loss, the mean cross-entropy over every target). The check passes when PyTorch's loss is within
--loss-tol (1e-4) of meshlearn's and every prompt logit within --logit-tol (1e-5) relative to the
logits' scale (max |logit|, at least 1).

Only the standard library and torch are used (python3-torch). Exit status 0 on success, 1 on a
mismatch, 2 on bad input.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from safetensors_check import read_safetensors


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: a linear layer whose weight is [in, out]."""

    def __init__(self, nx, nf):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(1),)
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(shape)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Attention(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, hs).transpose(1, 2) for t in (q, k, v))
        att = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], hs ** 0.5, dtype=x.dtype)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))
        att = F.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, nh, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.attn = Attention(C, nh)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.mlp = Mlp(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, eps = cfg["n_embd"], cfg.get("layer_norm_epsilon", 1e-5)
        self.wte = nn.Embedding(cfg["vocab_size"], C)
        self.wpe = nn.Embedding(cfg["n_positions"], C)
        self.h = nn.ModuleList([Block(C, cfg["n_head"], eps) for _ in range(cfg["n_layer"])])
        self.ln_f = nn.LayerNorm(C, eps=eps)


class GPT2LMHead(nn.Module):
    """GPT2LMHeadModel's computation; parameter names are its state dict's."""

    def __init__(self, cfg):
        super().__init__()
        self.transformer = Transformer(cfg)

    def forward(self, idx):
        t = self.transformer
        T = idx.size(1)
        x = t.wte(idx) + t.wpe(torch.arange(T, dtype=torch.long).unsqueeze(0))
        for block in t.h:
            x = block(x)
        x = t.ln_f(x)
        return torch.matmul(x, t.wte.weight.t())  # lm_head, tied to wte


def check_config(cfg, path):
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise ValueError(f"{path}: field '{key}' must be a positive integer, got {cfg.get(key)!r}")
    if cfg["n_embd"] % cfg["n_head"]:
        raise ValueError(f"{path}: field 'n_head' must divide n_embd")
    if cfg.get("activation_function", "gelu_new") != "gelu_new":
        raise ValueError(f"{path}: field 'activation_function' must be gelu_new")
    if cfg.get("n_inner") not in (None, 4 * cfg["n_embd"]):
        raise ValueError(f"{path}: field 'n_inner' must be null or 4 * n_embd")
    if not cfg.get("tie_word_embeddings", True):
        raise ValueError(f"{path}: field 'tie_word_embeddings' must be true")


def load(model_dir):
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    check_config(cfg, cfg_path)
    with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    if not isinstance(vocab, list) or len(vocab) > cfg["vocab_size"]:
        raise ValueError(f"{model_dir}/vocab.json: must be a list of at most vocab_size characters")
    meta, tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    model = GPT2LMHead(cfg)
    wte = tensors["transformer.wte.weight"]
    if "lm_head.weight" in tensors and not torch.equal(tensors.pop("lm_head.weight"), wte):
        raise ValueError("lm_head.weight differs from transformer.wte.weight (not tied)")
    state = {k: v for k, v in tensors.items()
             if not (k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"))}
    model.load_state_dict(state, strict=True)
    for name, p in model.state_dict().items():  # every tensor bit for bit
        if not torch.equal(p, state[name]):
            raise ValueError(f"{name} changed while loading")
    model.eval()
    return cfg, vocab, model


def validation_loss(model, tokens, targets, batch):
    """The mean cross-entropy over every target of (N, T) windows, `batch` windows a forward pass
    (meshlearn's Evaluate: the mean over every predicted token), and the token count."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, tokens.size(0), batch):
            logits = model(tokens[i:i + batch])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                   targets[i:i + batch].reshape(-1), reduction="none")
            total += loss.double().sum().item()
            count += loss.numel()
    return total / count, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--loss-tol", type=float, default=1e-4)
    ap.add_argument("--logit-tol", type=float, default=1e-5)
    ap.add_argument("--batch", type=int, default=16, help="windows per forward pass")
    args = ap.parse_args()
    torch.manual_seed(0)
    try:
        cfg, vocab, model = load(args.model_dir)
        fmeta, fx = read_safetensors(args.fixture)
        tokens, targets = fx["tokens"].long(), fx["targets"].long()
        prompt, want_logits = fx["prompt"].long(), fx["prompt_logits"]
        want_loss = float(fmeta["val_loss"])
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        print(f"hf_gpt2_check: {e}", file=sys.stderr)
        return 2
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.model_dir}: GPT-2 n_layer {cfg['n_layer']} n_head {cfg['n_head']} n_embd "
          f"{cfg['n_embd']} n_positions {cfg['n_positions']} vocab {cfg['vocab_size']} "
          f"({len(vocab)} characters), {params} parameters")
    ok = True
    with torch.no_grad():
        torch_loss, count = validation_loss(model, tokens, targets, args.batch)
        d = abs(torch_loss - want_loss)
        good = d <= args.loss_tol
        ok &= good
        print(f"validation loss over {count} tokens: torch {torch_loss:.6f}, meshlearn "
              f"{want_loss:.6f}, |diff| {d:.2e} (tolerance {args.loss_tol:g}) "
              f"{'ok' if good else 'MISMATCH'}")
        got = model(prompt.unsqueeze(0))[0]
        scale = max(1.0, want_logits.abs().max().item())
        rel = (got - want_logits).abs().max().item() / scale
        good = rel <= args.logit_tol
        ok &= good
        text = "".join(vocab[i] for i in prompt.tolist())
        print(f"prompt logits ({prompt.numel()} x {want_logits.size(1)}, prompt {text!r}): max "
              f"|diff| / scale {rel:.2e} (tolerance {args.logit_tol:g}) "
              f"{'ok' if good else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

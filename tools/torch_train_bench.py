#!/usr/bin/python3
"""PyTorch baseline for bench/train_bench: training throughput of the example models.

  /usr/bin/python3 tools/torch_train_bench.py --model mlp|cnn --threads N --batch 64 --steps 200
  /usr/bin/python3 tools/torch_train_bench.py --model gpt --threads N --batch 8 --seq-len 256 \
      --steps 10 --vocab 172

mlp/cnn: the architecture of examples/fashion-{mlp,cnn}.toml, trained with Adam (lr 1e-3) on
random data of the same shape (throughput does not depend on the pixel values), each step drawing
a batch by index from a 10k-sample tensor (as meshlearn does).
gpt: the GPT-2 decoder of examples/code-gpt-10m.toml (6 layers, 6 heads, n_embd 384, block 256,
biases everywhere, tanh GELU, LayerNorm eps 1e-5, LM head tied to wte: 10.81M parameters at
vocab 172), AdamW (lr 1e-3, betas 0.9/0.99, weight decay 0.1 on matrices and embeddings, as
meshlearn decays every tensor of rank >= 2), gradient clipping at 1.0, on windows drawn from a
random token stream (throughput does not depend on the tokens).
Prints one JSON line: {"model": ..., "threads": N, "batch": B, "steps": S, "samples_per_sec": X,
"tokens_per_sec": X*T (gpt), "cpus_used": process CPU seconds over wall seconds of the timed
steps (how many cores it kept busy), "peak_rss_mb": the process's peak resident set,
"torch": version}.
"""
import argparse
import json
import math
import resource
import time

import torch_threads  # noqa: F401  (sets OPENBLAS_NUM_THREADS before torch is loaded)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, c, nh, t):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        self.register_buffer("mask", torch.tril(torch.ones(t, t, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        hs = c // self.nh
        q = q.view(b, t, self.nh, hs).transpose(1, 2)
        k = k.view(b, t, self.nh, hs).transpose(1, 2)
        v = v.view(b, t, self.nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, block, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, block) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn", "gpt"], required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=172)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.model == "gpt":
        return run_gpt(a)
    model = build(a.model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    n = 10000
    x = torch.randn(n, 1, 28, 28)
    y = torch.randint(0, 10, (n,))
    g = torch.Generator().manual_seed(1)

    def step():
        idx = torch.randint(0, n, (a.batch,), generator=g)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        step()
    secs, cpu_secs = time.perf_counter() - t0, time.process_time() - cpu0
    print(json.dumps({"model": a.model, "threads": a.threads, "batch": a.batch, "steps": a.steps,
                      "samples_per_sec": a.steps * a.batch / secs,
                      "cpus_used": cpu_secs / secs, "peak_rss_mb": peak_rss_mb(),
                      "torch": torch.__version__}))


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_gpt(a):
    t = a.seq_len
    model = Gpt(a.vocab, 256, 6, 6, 384)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    n = 1 << 20
    stream = torch.randint(0, a.vocab, (n,))
    g = torch.Generator().manual_seed(1)

    def step():
        starts = torch.randint(0, n - t - 1, (a.batch,), generator=g)
        idx = torch.stack([stream[s:s + t] for s in starts.tolist()])
        tgt = torch.stack([stream[s + 1:s + 1 + t] for s in starts.tolist()])
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(a.warmup):
        step()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        step()
    secs, cpu_secs = time.perf_counter() - t0, time.process_time() - cpu0
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": "gpt", "threads": a.threads, "batch": a.batch, "seq_len": t,
                      "steps": a.steps, "params": params,
                      "samples_per_sec": a.steps * a.batch / secs,
                      "tokens_per_sec": a.steps * a.batch * t / secs,
                      "cpus_used": cpu_secs / secs, "peak_rss_mb": peak_rss_mb(),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""PyTorch baseline for bench/train_bench: training throughput of the Fashion-MNIST example models.

  /usr/bin/python3 tools/torch_train_bench.py --model mlp|cnn --threads N --batch 64 --steps 200

Builds the same architecture as examples/fashion-{mlp,cnn}.toml, trains it with Adam (lr 1e-3) on
random data of the same shape (throughput does not depend on the pixel values), each step drawing
a batch by index from a 10k-sample tensor (as meshlearn does), and prints one JSON line:
{"model": ..., "threads": N, "batch": B, "steps": S, "samples_per_sec": X, "torch": version}.
"""
import argparse
import json
import time

import torch
import torch.nn as nn


def build(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
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
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    secs = time.perf_counter() - t0
    print(json.dumps({"model": a.model, "threads": a.threads, "batch": a.batch, "steps": a.steps,
                      "samples_per_sec": a.steps * a.batch / secs, "torch": torch.__version__}))


if __name__ == "__main__":
    main()

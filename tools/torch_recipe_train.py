#!/usr/bin/python3
"""Trains meshlearn's GPT recipe in PyTorch, from meshlearn's own starting weights and batches.

Usage:
  /usr/bin/python3 tools/torch_recipe_train.py INIT_DIR --recipe RECIPE.safetensors \
      [--threads 2] [--json]

INIT_DIR is a Hugging Face GPT-2 directory written by meshlearn (`SaveHfGpt2`, `meshlearn export`)
at step 0: the weights both frameworks start from. RECIPE (written by engine_model_test's
TrainQualityTest.CodeGpt* tests) holds every step's batch ("batch_tokens", "batch_targets": int32,
(steps, B, T)), every step's learning rate ("lr": float32, (steps), meshlearn's LearningRateAt:
warm-up and cosine), the validation windows meshlearn evaluates on ("val_tokens", "val_targets":
int32, (N, T)), and __metadata__ beta1, beta2, eps, weight_decay, grad_clip (and meshlearn's
val_loss, printed beside PyTorch's).

The model is tools/hf_gpt2_check.py's GPT-2. Each step: the mean cross-entropy over the batch's
B x T targets, its gradients, the global gradient norm clipped to grad_clip
(clip_grad_norm_: scale grad_clip / (norm + 1e-6) when above), and torch.optim.AdamW at that
step's learning rate with weight decay on the tensors of rank >= 2 only (as meshlearn's
AdamWDecays). meshlearn's AdamW is the same formula (docs/engine.md). Progress (rate, ETA) goes to
stderr every 100 steps. Prints the validation loss (and with --json one JSON line:
{"val_loss", "meshlearn_val_loss", "steps", "seconds", "last_train_loss", "threads", "torch"}).
Only the standard library and torch are used (python3-torch). Exit status 0, or 2 on bad input.
"""
import argparse
import json
import sys
import time

import torch_threads  # noqa: F401  (sets OPENBLAS_NUM_THREADS before torch is loaded)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hf_gpt2_check import load, validation_loss  # noqa: E402
from safetensors_check import read_safetensors  # noqa: E402

RECIPE_TENSORS = ("batch_tokens", "batch_targets", "lr", "val_tokens", "val_targets")
RECIPE_SCALARS = ("beta1", "beta2", "eps", "weight_decay", "grad_clip")


def read_recipe(path, vocab_size, block_size):
    """The recipe's tensors and scalars, checked for shape and range; ValueError names the field."""
    meta, t = read_safetensors(path)
    for name in RECIPE_TENSORS:
        if name not in t:
            raise ValueError(f"{path}: tensor '{name}' is missing")
    for name in RECIPE_SCALARS:
        try:
            meta[name] = float(meta[name])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: __metadata__ '{name}' must be a number") from None
    tokens, targets, lr = t["batch_tokens"], t["batch_targets"], t["lr"]
    if tokens.dim() != 3 or tokens.shape != targets.shape or tokens.size(0) < 1:
        raise ValueError(f"{path}: batch_tokens and batch_targets must be the same (steps, B, T)")
    if lr.dim() != 1 or lr.size(0) != tokens.size(0):
        raise ValueError(f"{path}: lr must hold one rate for each of the {tokens.size(0)} steps")
    if t["val_tokens"].dim() != 2 or t["val_tokens"].shape != t["val_targets"].shape:
        raise ValueError(f"{path}: val_tokens and val_targets must be the same (N, T)")
    if tokens.size(2) > block_size or t["val_tokens"].size(1) > block_size:
        raise ValueError(f"{path}: windows longer than the model's n_positions ({block_size})")
    for name in ("batch_tokens", "batch_targets", "val_tokens", "val_targets"):
        x = t[name]
        if x.numel() and (x.min().item() < 0 or x.max().item() >= vocab_size):
            raise ValueError(f"{path}: '{name}' holds token ids outside [0, {vocab_size})")
    return meta, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("init_dir")
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads < 1:
        print("torch_recipe_train: --threads must be at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    try:
        cfg, _, model = load(args.init_dir)
        meta, r = read_recipe(args.recipe, cfg["vocab_size"], cfg["n_positions"])
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        print(f"torch_recipe_train: {e}", file=sys.stderr)
        return 2
    model.train()
    params = list(model.parameters())  # wte once: the head is tied to it
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": meta["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=float(r["lr"][0]), betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"])
    tokens, targets, lr = r["batch_tokens"].long(), r["batch_targets"].long(), r["lr"]
    steps = tokens.size(0)
    start = time.monotonic()
    loss = None
    for s in range(steps):
        for group in opt.param_groups:
            group["lr"] = float(lr[s])
        logits = model(tokens[s])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets[s].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if meta["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, meta["grad_clip"])
        opt.step()
        if (s + 1) % 100 == 0 or s + 1 == steps:
            spent = time.monotonic() - start
            rate = (s + 1) / spent
            print(f"torch_recipe_train: step {s + 1}/{steps}, loss {loss.item():.4f}, "
                  f"{rate:.2f} steps/s, ETA {(steps - s - 1) / rate:.0f} s", file=sys.stderr)
    seconds = time.monotonic() - start
    model.eval()
    val, count = validation_loss(model, r["val_tokens"].long(), r["val_targets"].long(),
                                 tokens.size(1))
    mesh = meta.get("val_loss")
    print(f"validation loss over {count} tokens after {steps} steps: PyTorch {val:.4f}"
          + (f", meshlearn {float(mesh):.4f}" if mesh is not None else ""), file=sys.stderr)
    if args.json:
        print(json.dumps({"val_loss": val,
                          "meshlearn_val_loss": float(mesh) if mesh is not None else None,
                          "steps": steps, "seconds": seconds, "last_train_loss": loss.item(),
                          "threads": args.threads, "torch": torch.__version__}))
    else:
        print(f"{val:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

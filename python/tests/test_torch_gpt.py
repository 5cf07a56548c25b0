"""meshlearn.torch's GPT-2 export against the engine: a GPT built in PyTorch (meshlearn.torch.GPT,
or Hugging Face's GPT2LMHeadModel computation from tools/hf_gpt2_check.py with its Conv1D (in,
out) weights) is exported as a task's [model] and data.init_weights; the engine (`meshlearn
train`, 0 steps then a few) starts from exactly those weights and computes the validation loss
PyTorch computes on the same windows; its model, written in the Hugging Face layout (`meshlearn
export`) and read by tools/hf_gpt2_check.py, gives the PyTorch GPT's logits; the weights it
trained, loaded back into the PyTorch GPT, give the loss the engine reported. Needs
python3-torch."""

import os
import struct
import sys
import unittest

import torch

import meshlearn
import meshlearn.torch as mt
from meshlearn import safetensors, tasks
import util

sys.path.insert(0, os.path.join(util.ROOT, "tools"))
import hf_gpt2_check  # noqa: E402  (the HF GPT-2 in torch the engine's HF export is checked with)

V, BLOCK, LAYERS, HEADS, EMBD = 40, 16, 2, 2, 16
T, BATCH, EVAL_BATCHES = 16, 4, 3


def token_task(d, model, init_weights, steps=0):
    """A tokens task over random train/val token files in `d`: (task dict, val tokens)."""
    g = torch.Generator().manual_seed(11)
    files = {}
    for split, n in (("train", 4000), ("val", 1000)):
        toks = torch.randint(0, V, (n,), generator=g)
        files[split] = toks
        with open(os.path.join(d, split + ".bin"), "wb") as f:
            f.write(struct.pack("<%dH" % n, *toks.tolist()))
    task = {
        "task": {"name": "gpt-export", "seed": 3},
        "data": {"format": "tokens", "train": os.path.join(d, "train.bin"),
                 "val": os.path.join(d, "val.bin"), "vocab_size": V,
                 "init_weights": init_weights},
        "model": model,
        "optimizer": {"kind": "adamw", "lr": 1e-3},
        "train": {"steps": steps, "batch_size": BATCH, "seq_len": T,
                  "eval_batches": EVAL_BATCHES},
    }
    return task, files["val"]


def torch_val_loss(forward, val):
    """The engine's GPT evaluation (engine/src/train.cc Evaluate): consecutive non-overlapping
    windows of T from the start of the validation split, at most eval_batches x batch_size."""
    n = min((val.numel() - 1) // T, EVAL_BATCHES * BATCH)
    x = torch.stack([val[w * T:w * T + T] for w in range(n)])
    y = torch.stack([val[w * T + 1:w * T + T + 1] for w in range(n)])
    with torch.no_grad():
        logits = forward(x)
        return float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y.reshape(-1)))


def train(d, task, name):
    out = os.path.join(d, name)
    with tasks.task_file(task) as f:
        report, _, _ = util.cli(d, "train", f.path, "--out", out)
    return report, os.path.join(out, "model.safetensors")


class GptExportTest(unittest.TestCase):
    def test_the_engine_starts_from_a_torch_gpt_and_computes_its_loss(self):
        torch.manual_seed(0)
        gpt = mt.GPT(vocab_size=V, block_size=BLOCK, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD)
        d = util.tempdir("gpt")
        ex = mt.export(gpt, None, os.path.join(d, "export"))
        self.assertEqual(ex.model, {"kind": "gpt", "n_layer": LAYERS, "n_head": HEADS,
                                    "n_embd": EMBD, "block_size": BLOCK, "vocab_size": V})
        task, val = token_task(d, ex.model, ex.weights_path)
        report, model = train(d, task, "zero")
        want = torch_val_loss(gpt, val)
        print("\nGPT export, 0 steps: engine val loss %.7f, PyTorch %.7f" %
              (report["test_loss"], want))
        self.assertAlmostEqual(report["test_loss"], want, delta=1e-5)
        # The engine's model file after 0 steps is the export, bit for bit.
        got, _ = safetensors.read(model)
        sent, _ = safetensors.read(ex.weights_path)
        self.assertEqual(set(got), set(sent))
        for k in sent:
            self.assertEqual(got[k][2], sent[k][2], k)
        # The engine's model, written in the Hugging Face layout by `meshlearn export` and read
        # by tools/hf_gpt2_check.py: the PyTorch GPT's logits.
        hf_dir = os.path.join(d, "hf")
        util.cli(d, "export", model, "--out", hf_dir)
        _, _, hf = hf_gpt2_check.load(hf_dir)
        x = val[:2 * T].reshape(2, T)
        with torch.no_grad():
            a, b = gpt(x), hf(x)
        self.assertLessEqual(float((a - b).abs().max()), 1e-5 * max(1.0, float(b.abs().max())))
        # Without init_weights the engine starts from its own seed: other weights.
        seeded = dict(task, data={k: v for k, v in task["data"].items() if k != "init_weights"})
        _, seeded_model = train(d, seeded, "seeded")
        own, _ = safetensors.read(seeded_model)
        self.assertEqual(set(own), set(sent))
        self.assertTrue(all(own[k][2] != sent[k][2] for k in sent
                            if not k.endswith(".bias") and ".ln_" not in k and "ln_f" not in k))

        # Trained a few steps from the export, loaded back into PyTorch: the engine's loss.
        task["train"]["steps"] = 5
        trained, model = train(d, task, "five")
        meta = mt.load(gpt, model)
        self.assertEqual(meta["format"], "meshlearn.model.v1")
        after = torch_val_loss(gpt, val)
        print("GPT export, 5 steps: engine val loss %.7f, PyTorch %.7f" %
              (trained["test_loss"], after))
        self.assertAlmostEqual(trained["test_loss"], after, delta=1e-5)
        self.assertNotAlmostEqual(after, want, delta=1e-4)

    def test_a_hugging_face_style_state_dict_exports_to_the_same_model(self):
        cfg = {"vocab_size": V, "n_positions": BLOCK, "n_embd": EMBD, "n_layer": LAYERS,
               "n_head": HEADS}
        torch.manual_seed(1)
        hf = hf_gpt2_check.GPT2LMHead(cfg)
        with torch.no_grad():  # LayerNorms away from (1, 0), so a transposition would show
            for p in hf.parameters():
                p.add_(0.05 * torch.randn_like(p))
        sd = dict(hf.state_dict())
        sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()  # tied, as HF saves it
        d = util.tempdir("gpt-hf")
        with self.assertRaises(meshlearn.ExportError) as e:
            mt.export_gpt(sd, os.path.join(d, "x"))
        self.assertIn("give n_head=", str(e.exception))
        ex = mt.export_gpt(sd, os.path.join(d, "export"), n_head=HEADS)
        self.assertEqual(ex.model["n_layer"], LAYERS)
        self.assertEqual(ex.model["block_size"], BLOCK)
        task, val = token_task(d, ex.model, ex.weights_path)
        report, _ = train(d, task, "zero")
        want = torch_val_loss(hf, val)
        print("\nHF GPT-2 state dict, 0 steps: engine val loss %.7f, PyTorch %.7f" %
              (report["test_loss"], want))
        self.assertAlmostEqual(report["test_loss"], want, delta=1e-5)
        # The same weights in meshlearn.torch.GPT: the same logits.
        gpt = mt.GPT(vocab_size=V, block_size=BLOCK, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD)
        mt.load(gpt, ex.weights_path)
        x = val[:T].unsqueeze(0)
        with torch.no_grad():
            a, b = gpt(x), hf(x)
        self.assertLessEqual(float((a - b).abs().max()), 1e-5 * max(1.0, float(b.abs().max())))

    def test_refusals_name_the_tensor(self):
        gpt = mt.GPT(vocab_size=V, block_size=BLOCK, n_layer=1, n_head=HEADS, n_embd=EMBD)
        sd = {k: v.t() if k.endswith(mt._CONV1D) else v for k, v in gpt.state_dict().items()}
        d = util.tempdir("gpt-refuse")
        untied = dict(sd, **{"lm_head.weight": torch.zeros(V, EMBD)})
        cases = [
            (dict(sd, **{"transformer.h.0.attn.rotary": torch.zeros(3)}),
             "transformer.h.0.attn.rotary: the engine's GPT has no such parameter"),
            ({k: v for k, v in sd.items() if k != "transformer.ln_f.bias"},
             "no transformer.ln_f.bias"),
            (untied, "lm_head.weight differs from transformer.wte.weight"),
            (dict(sd, **{"transformer.h.0.mlp.c_fc.weight": torch.zeros(EMBD, 3 * EMBD)}),
             "transformer.h.0.mlp.c_fc.weight has shape [48, 16]"),
        ]
        for bad, message in cases:
            with self.assertRaises(meshlearn.ExportError) as e:
                mt.export_gpt(bad, os.path.join(d, "x"), n_head=HEADS)
            self.assertIn(message, str(e.exception))
        with self.assertRaises(meshlearn.ExportError) as e:
            mt.export_gpt(sd, os.path.join(d, "x"), n_head=3)
        self.assertIn("n_head=3 does not divide n_embd=16", str(e.exception))

    def test_the_engine_refuses_init_weights_of_another_model(self):
        gpt = mt.GPT(vocab_size=V, block_size=BLOCK, n_layer=1, n_head=HEADS, n_embd=EMBD)
        d = util.tempdir("gpt-mismatch")
        ex = mt.export(gpt, None, os.path.join(d, "export"))
        model = dict(ex.model, n_layer=2)  # the task's model has a block the file lacks
        task, _ = token_task(d, model, ex.weights_path)
        with tasks.task_file(task) as f:
            out, rc, err = util.cli(d, "train", f.path, "--out", os.path.join(d, "o"),
                                    check=False)
        self.assertNotEqual(rc, 0)
        message = out["error"]["message"] if isinstance(out, dict) else err
        self.assertIn("data.init_weights: " + ex.weights_path +
                      ": no tensor 'transformer.h.1.ln_1.weight'", message)
        self.assertIn("meshlearn.torch.export", message)


if __name__ == "__main__":
    unittest.main()

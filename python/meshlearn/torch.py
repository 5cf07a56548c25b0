"""PyTorch <-> meshlearn: export a torch.nn.Sequential as a task's [model] table and its weights,
load a model the network trained back into the same module, and evaluate it on the task's data.

    import torch.nn as nn, meshlearn.torch as mt
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    ex = mt.export(net, torch.zeros(1, 1, 28, 28), "out/export")
    task["model"] = ex.model            # {"input": [1, 28, 28], "layers": [...]}
    ...                                 # submit, watch, fetch (meshlearn.Client)
    mt.load(net, "out/my-task/model.safetensors")
    mt.evaluate(net, task)              # {"accuracy": ..., "loss": ..., "samples": ...}

The engine's layers (engine/include/meshlearn/engine/model.h) and their PyTorch twins:

    linear     nn.Linear                       weight (out, in), bias (out)
    conv2d     nn.Conv2d (square kernel/stride/padding, dilation 1, groups 1, zero padding)
    maxpool2d  nn.MaxPool2d (square, padding 0, dilation 1, floor mode)
    relu       nn.ReLU
    gelu       nn.GELU(approximate="tanh")     (the engine's GELU is the tanh form)
    flatten    nn.Flatten() (start_dim 1, end_dim -1)
    dropout    nn.Dropout(p)
    layernorm  nn.LayerNorm(last dim, eps=1e-5, elementwise_affine=True)

Parameter names are the engine's: nn.Sequential's "3.weight" is "layers.3.weight". Anything else
is refused by name (ExportError), before anything is written.

GPT-2 (the engine's `kind = "gpt"`, engine/include/meshlearn/engine/hf_gpt2.h): `GPT(...)` is
that model in PyTorch under the engine's parameter names (learned positions, pre-norm blocks,
LayerNorm eps 1e-5, causal attention scaled by 1/sqrt(head size), GELU tanh form, lm_head tied to
wte; linear weights (out, in)); `export_gpt(model, out)` writes its [model] table and weights,
from a `GPT` or from a Hugging Face-style GPT-2 state dict (GPT2LMHeadModel names, Conv1D
weights (in, out), transposed on export; give n_head):

    gpt = mt.GPT(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)
    ex = mt.export_gpt(gpt, "out/gpt")                                  # or export(gpt, None, ...)
    ex = mt.export_gpt(hf_model.state_dict(), "out/gpt", n_head=12)     # a GPT2LMHeadModel's
    task["model"] = ex.model; task["data"]["init_weights"] = ex.weights_path
"""

import dataclasses
import gzip
import math
import os
import re
import struct

import torch
import torch.nn as nn

from . import safetensors
from .errors import ExportError, MeshlearnError
from .tasks import load as load_task, to_toml

SUPPORTED = ("Linear, Conv2d, MaxPool2d, ReLU, GELU(approximate='tanh'), Flatten, Dropout, "
             "LayerNorm")


def _pair(v, what, where):
    if isinstance(v, int):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 2 and v[0] == v[1] and isinstance(v[0], int):
        return v[0]
    raise ExportError("%s: %s %r: the engine takes one value for both dimensions" %
                      (where, what, v))


def _layer(i, m, in_shape):
    """The engine's layer table for module `m` (index i), given its per-sample input shape."""
    where = "module[%d] (%s)" % (i, type(m).__name__)
    if type(m) is nn.Linear:
        if len(in_shape) != 1:
            raise ExportError("%s: its input has shape %s but the engine's linear takes a vector; "
                              "put nn.Flatten() before it" % (where, list(in_shape)))
        return {"kind": "linear", "out": m.out_features, "bias": m.bias is not None}
    if type(m) is nn.Conv2d:
        if m.groups != 1 or _pair(m.dilation, "dilation", where) != 1:
            raise ExportError("%s: groups and dilation must be 1" % where)
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            raise ExportError("%s: padding must be a number of zeros, got %r (%s)" %
                              (where, m.padding, m.padding_mode))
        if len(in_shape) != 3:
            raise ExportError("%s: its input has shape %s; conv2d needs (channels, height, "
                              "width)" % (where, list(in_shape)))
        return {"kind": "conv2d", "out": m.out_channels,
                "kernel": _pair(m.kernel_size, "kernel_size", where),
                "stride": _pair(m.stride, "stride", where),
                "pad": _pair(m.padding, "padding", where), "bias": m.bias is not None}
    if type(m) is nn.MaxPool2d:
        if (_pair(m.padding, "padding", where) != 0 or _pair(m.dilation, "dilation", where) != 1
                or m.ceil_mode or m.return_indices):
            raise ExportError("%s: the engine's maxpool2d has no padding, dilation, ceil_mode "
                              "or return_indices" % where)
        k = _pair(m.kernel_size, "kernel_size", where)
        s = _pair(m.stride if m.stride is not None else k, "stride", where)
        return {"kind": "maxpool2d", "kernel": k, "stride": s}
    if type(m) is nn.ReLU:
        return {"kind": "relu"}
    if type(m) is nn.GELU:
        if getattr(m, "approximate", "none") != "tanh":
            raise ExportError("%s: the engine's GELU is the tanh form; use "
                              "nn.GELU(approximate='tanh')" % where)
        return {"kind": "gelu"}
    if type(m) is nn.Flatten:
        if m.start_dim != 1 or m.end_dim != -1:
            raise ExportError("%s: the engine flattens everything but the batch: use "
                              "nn.Flatten() (start_dim=1, end_dim=-1)" % where)
        return {"kind": "flatten"}
    if type(m) is nn.Dropout:
        if not 0 <= m.p < 1:
            raise ExportError("%s: p must be in [0, 1), got %r" % (where, m.p))
        return {"kind": "dropout", "p": float(m.p)}
    if type(m) is nn.LayerNorm:
        shape = tuple(m.normalized_shape)
        if len(shape) != 1 or shape[0] != in_shape[-1]:
            raise ExportError("%s: the engine normalises over the last dimension (%d); got "
                              "normalized_shape %s" % (where, in_shape[-1], list(shape)))
        if m.eps != 1e-5 or not m.elementwise_affine:
            raise ExportError("%s: the engine's layernorm has eps 1e-5 and a weight and bias" %
                              where)
        return {"kind": "layernorm"}
    raise ExportError("%s: the engine has no such layer (it supports %s)" % (where, SUPPORTED))


@dataclasses.dataclass
class Export:
    model: dict          # the task's [model] table
    spec_path: str       # OUT/model.toml: that table as TOML
    weights_path: str    # OUT/init.safetensors: the module's weights, engine names


def model_spec(module, example_input):
    """The [model] table of `module` (an nn.Sequential), checked by running `example_input`
    (a batch, (B, ...)) through it layer by layer."""
    if type(module) is not nn.Sequential:
        raise ExportError("export takes a torch.nn.Sequential of the engine's layers (%s), got "
                          "%s" % (SUPPORTED, type(module).__name__))
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 2:
        raise ExportError("example_input: a batch (B, ...) of the model's input, e.g. "
                          "torch.zeros(1, 1, 28, 28)")
    x = example_input.detach().to(torch.float32)
    input_shape = list(x.shape[1:])
    layers = []
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            for i, m in enumerate(module):
                layers.append(_layer(i, m, tuple(x.shape[1:])))
                try:
                    x = m(x)
                except RuntimeError as e:
                    raise ExportError("module[%d] (%s) fails on the example input: %s" %
                                      (i, type(m).__name__, e)) from None
    finally:
        module.train(was_training)
    if x.dim() != 2 or x.shape[1] < 2:
        raise ExportError("the last layer must output class logits (B, classes >= 2), got %s; "
                          "end with nn.Linear(..., classes)" % list(x.shape))
    return {"input": input_shape, "layers": layers}


def state_tensors(module):
    """The module's parameters under the engine's names, as safetensors entries (F32)."""
    out = {}
    for name, p in module.state_dict().items():
        t = p.detach().to(torch.float32).contiguous().cpu()
        out["layers." + name] = ("F32", tuple(t.shape), t.numpy().tobytes())
    return out


def _write_export(out, spec, tensors, kind):
    os.makedirs(out, exist_ok=True)
    spec_path = os.path.join(os.path.abspath(out), "model.toml")
    weights_path = os.path.join(os.path.abspath(out), "init.safetensors")
    with open(spec_path, "w", encoding="utf-8") as f:
        f.write(to_toml({"model": spec}))
    safetensors.write(weights_path, tensors, {"meshlearn.export": kind})
    return Export(model=spec, spec_path=spec_path, weights_path=weights_path)


def export(module, example_input, out):
    """Writes OUT/model.toml (the task's [model] table) and OUT/init.safetensors (the module's
    weights, engine names) and returns an Export. Refuses an unsupported layer by name.

    The weights are the task's round-0 weights when the task names them: task["data"]
    ["init_weights"] = ex.weights_path (the engine checks every name, shape and dtype). A `GPT`
    (example_input unused) goes to export_gpt."""
    if isinstance(module, GPT):
        return export_gpt(module, out)
    spec = model_spec(module, example_input)
    return _write_export(out, spec, state_tensors(module), "torch")


# ---- GPT-2: the engine's kind = "gpt" (engine/src/model.cc GptModel, hf_gpt2.h).

class _Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.c_proj(torch.matmul(att, v).transpose(1, 2).reshape(B, T, C))


class _Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = _Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = _Mlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The engine's GPT-2 in PyTorch, parameter names and layouts the engine's: forward(idx)
    (B, T) int64 -> logits (B, T, vocab_size); loss(idx, targets) the mean cross-entropy."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        if n_embd % n_head:
            raise ExportError("GPT: n_head (%d) must divide n_embd (%d)" % (n_head, n_embd))
        self.config = {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd,
                       "block_size": block_size, "vocab_size": vocab_size}
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([_Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=1e-5)))
        # GPT-2's initialisation (the engine's kinds, not its values: those come from its seed):
        # weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 n_layer)), biases 0,
        # LayerNorms (1, 0).
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        t = self.transformer
        pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = t.wte(idx) + t.wpe(pos).unsqueeze(0)
        for block in t.h:
            x = block(x)
        return torch.matmul(t.ln_f(x), t.wte.weight.t())  # lm_head tied to wte

    def loss(self, idx, targets):
        logits = self(idx)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                           targets.reshape(-1))


# Hugging Face's Conv1D layers keep weights as (in, out); the engine's (and nn.Linear's) are
# (out, in).
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_BLOCK_KEYS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
               "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
               "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


def _gpt_shapes(n_layer, n_embd, block_size, vocab_size):
    """The engine's GPT parameters: name -> shape, in model order."""
    C = n_embd
    out = {"transformer.wte.weight": (vocab_size, C), "transformer.wpe.weight": (block_size, C)}
    for i in range(n_layer):
        p = "transformer.h.%d." % i
        out.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
                    p + "attn.c_attn.weight": (3 * C, C), p + "attn.c_attn.bias": (3 * C,),
                    p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                    p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                    p + "mlp.c_fc.weight": (4 * C, C), p + "mlp.c_fc.bias": (4 * C,),
                    p + "mlp.c_proj.weight": (C, 4 * C), p + "mlp.c_proj.bias": (C,)})
    out["transformer.ln_f.weight"] = (C,)
    out["transformer.ln_f.bias"] = (C,)
    return out


def export_gpt(model, out, n_head=None):
    """Writes OUT/model.toml ({"kind": "gpt", n_layer, n_head, n_embd, block_size, vocab_size})
    and OUT/init.safetensors (the engine's names and layouts) and returns an Export.

    `model` is a `GPT`, or a Hugging Face-style GPT-2 state dict (a dict of tensors with
    GPT2LMHeadModel's names, e.g. `hf_model.state_dict()`; its Conv1D weights (in, out) are
    transposed; the attention-mask buffers attn.bias / attn.masked_bias are dropped; an
    lm_head.weight must equal wte, since the engine ties them). A state dict does not say how
    many heads it has: give n_head (or a module with .config.n_head). Everything else is read
    from the shapes and checked; a tensor the engine does not have is refused by name."""
    if isinstance(model, GPT):
        cfg = dict(model.config)
        if n_head is not None and n_head != cfg["n_head"]:
            raise ExportError("export_gpt: n_head=%d but the GPT has %d" % (n_head, cfg["n_head"]))
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        hf = False
    else:
        if isinstance(model, nn.Module):
            conf = getattr(model, "config", None)
            if n_head is None and conf is not None:
                n_head = conf["n_head"] if isinstance(conf, dict) else getattr(conf, "n_head", None)
            model = model.state_dict()
        if not isinstance(model, dict):
            raise ExportError("export_gpt takes a meshlearn.torch.GPT or a Hugging Face-style "
                              "GPT-2 state dict, got %s" % type(model).__name__)
        if not isinstance(n_head, int) or n_head < 1:
            raise ExportError("export_gpt: a state dict does not say its number of heads; give "
                              "n_head= (GPT2Config.n_head)")
        sd = {k: v.detach() for k, v in model.items()
              if not (k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"))}
        if "lm_head.weight" in sd:
            lm = sd.pop("lm_head.weight")
            wte = sd.get("transformer.wte.weight")
            if wte is None or not torch.equal(lm, wte):
                raise ExportError("state dict: lm_head.weight differs from "
                                  "transformer.wte.weight; the engine's GPT ties them")
        hf = True
        cfg = None
    for k in ("transformer.wte.weight", "transformer.wpe.weight"):
        if k not in sd or sd[k].dim() != 2:
            raise ExportError("state dict: no 2-D %s; is this a GPT-2?" % k)
    V, C = sd["transformer.wte.weight"].shape
    block = sd["transformer.wpe.weight"].shape[0]
    layers = set()
    for k in sd:
        m = re.match(r"transformer\.h\.(\d+)\.", k)
        if m:
            layers.add(int(m.group(1)))
    L = len(layers)
    if layers != set(range(L)):
        raise ExportError("state dict: blocks %s are not numbered 0..%d" % (sorted(layers), L - 1))
    if cfg is None:
        if C % n_head:
            raise ExportError("export_gpt: n_head=%d does not divide n_embd=%d" % (n_head, C))
        cfg = {"n_layer": L, "n_head": n_head, "n_embd": int(C), "block_size": int(block),
               "vocab_size": int(V)}
    want = _gpt_shapes(cfg["n_layer"], cfg["n_embd"], cfg["block_size"], cfg["vocab_size"])
    extra = sorted(set(sd) - set(want))
    if extra:
        raise ExportError("state dict: %s: the engine's GPT has no such parameter (it has "
                          "transformer.wte/wpe, transformer.h.N.{%s}, transformer.ln_f)" %
                          (extra[0], ", ".join(_BLOCK_KEYS)))
    tensors = {}
    for name, shape in want.items():
        if name not in sd:
            raise ExportError("state dict: no %s (shape %s)" % (name, list(shape)))
        t = sd[name].to(torch.float32)
        if hf and name.endswith(_CONV1D):
            t = t.t()
        if tuple(t.shape) != shape:
            raise ExportError("state dict: %s has shape %s (as the engine lays it out), the "
                              "engine's GPT of n_embd %d wants %s" %
                              (name, list(t.shape), cfg["n_embd"], list(shape)))
        t = t.contiguous().cpu()
        tensors[name] = ("F32", shape, t.numpy().tobytes())
    spec = dict(kind="gpt", n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                block_size=cfg["block_size"], vocab_size=cfg["vocab_size"])
    return _write_export(out, spec, tensors, "torch-gpt" + ("-hf" if hf else ""))


def _engine_name(module, key):
    """The engine's name of state-dict key `key` of `module`."""
    return key if isinstance(module, GPT) else "layers." + key


def load(module, path):
    """Copies a meshlearn model file (`task fetch`'s model.safetensors, `meshlearn train`'s, or
    an export) into `module` (an nn.Sequential or a GPT), checking every name and shape; returns
    the file's metadata."""
    tensors, meta = safetensors.read(path)
    sd = module.state_dict()
    want = {_engine_name(module, k): k for k in sd}
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        raise MeshlearnError("%s does not fit this module: missing %s, unexpected %s" %
                             (path, missing or "none", extra or "none"))
    new = {}
    for name, (dtype, shape, raw) in tensors.items():
        k = want[name]
        if dtype != "F32" or tuple(sd[k].shape) != tuple(shape):
            raise MeshlearnError("%s: %s is %s %s, the module's %s is %s" %
                                 (path, name, dtype, list(shape), k, list(sd[k].shape)))
        new[k] = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
    module.load_state_dict(new)
    return meta


def _idx(path):
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise MeshlearnError("%s: not an idx file of unsigned bytes" % path)
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    t = torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8)
    return t.reshape(dims)


def test_data(task, base_dir=None):
    """The task's test split as the engine sees it: (inputs (N, *model.input) float32
    normalised, labels (N) int64). `task` is a dict or a TOML path (its relative paths are then
    relative to its folder; a dict's to the working directory)."""
    if not isinstance(task, dict):
        base_dir = os.path.dirname(os.path.abspath(os.fspath(task)))
        task = load_task(task)
    base = base_dir or os.getcwd()
    data, model = task.get("data", {}), task.get("model", {})
    fmt = data.get("format", "idx")
    path = lambda k: os.path.join(base, os.path.expanduser(data[k]))
    if fmt == "idx":
        x = _idx(path("test_images")).to(torch.float32) / 255.0
        y = _idx(path("test_labels")).to(torch.int64)
    elif fmt == "npy":
        import numpy
        xa, ya = numpy.load(path("test_x")), numpy.load(path("test_y"))
        x = torch.from_numpy(xa.astype("float32"))
        if xa.dtype == numpy.uint8:
            x = x / 255.0
        y = torch.from_numpy(ya.astype("int64"))
    else:
        raise MeshlearnError("evaluate: data.format %r is not a classification format (idx, "
                             "npy)" % fmt)
    mean, std = float(data.get("mean", 0.0)), float(data.get("std", 1.0))
    x = (x - torch.tensor(mean, dtype=torch.float32)) / torch.tensor(std, dtype=torch.float32)
    return x.reshape([x.shape[0]] + list(model.get("input", x.shape[1:]))), y


def evaluate(module, task, batch_size=1000):
    """Accuracy and mean cross-entropy of `module` on the task's whole test split, as the
    engine's Evaluate (what an aggregator reports as test_accuracy)."""
    x, y = test_data(task)
    was_training = module.training
    module.eval()
    correct, loss = 0, 0.0
    try:
        with torch.no_grad():
            for s in range(0, x.shape[0], batch_size):
                logits = module(x[s:s + batch_size])
                correct += int((logits.argmax(dim=1) == y[s:s + batch_size]).sum())
                loss += float(nn.functional.cross_entropy(logits, y[s:s + batch_size],
                                                          reduction="sum"))
    finally:
        module.train(was_training)
    return {"accuracy": correct / x.shape[0], "loss": loss / x.shape[0], "samples": x.shape[0]}

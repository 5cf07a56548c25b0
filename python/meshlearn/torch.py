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
"""

import dataclasses
import gzip
import os
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


def export(module, example_input, out):
    """Writes OUT/model.toml (the task's [model] table) and OUT/init.safetensors (the module's
    weights, engine names) and returns an Export. Refuses an unsupported layer by name."""
    spec = model_spec(module, example_input)
    os.makedirs(out, exist_ok=True)
    spec_path = os.path.join(os.path.abspath(out), "model.toml")
    weights_path = os.path.join(os.path.abspath(out), "init.safetensors")
    with open(spec_path, "w", encoding="utf-8") as f:
        f.write(to_toml({"model": spec}))
    safetensors.write(weights_path, state_tensors(module), {"meshlearn.export": "torch"})
    return Export(model=spec, spec_path=spec_path, weights_path=weights_path)


def load(module, path):
    """Copies a meshlearn model file (`task fetch`'s model.safetensors, or export's) into
    `module`, checking every name and shape; returns the file's metadata."""
    tensors, meta = safetensors.read(path)
    sd = module.state_dict()
    want = {"layers." + k: v for k, v in sd.items()}
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        raise MeshlearnError("%s does not fit this module: missing %s, unexpected %s" %
                             (path, missing or "none", extra or "none"))
    new = {}
    for name, (dtype, shape, raw) in tensors.items():
        k = name[len("layers."):]
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

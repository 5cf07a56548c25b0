"""Helpers of the Python tests: the binary, temporary homes, running the CLI."""

import atexit
import json
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FASHION = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def binary():
    b = os.environ.get("MESHLEARN_BIN") or os.path.join(ROOT, "build", "apps", "meshlearn")
    if not os.path.isfile(b):
        raise RuntimeError("no meshlearn binary at %s: build it or set MESHLEARN_BIN" % b)
    return b


def tempdir(tag):
    d = tempfile.mkdtemp(prefix="meshlearn-py-%s-" % tag)
    if not os.environ.get("MESHLEARN_KEEP_TMP"):
        atexit.register(shutil.rmtree, d, True)
    return d


def cli(home, *args, env=None, check=True, json_out=True, timeout=600):
    """Runs `meshlearn [--json] --home HOME ARGS`; returns (parsed stdout or text, returncode,
    stderr)."""
    e = dict(os.environ)
    e.pop("MESHLEARN_PASSPHRASE", None)
    e.update(env or {})
    argv = [binary()] + (["--json"] if json_out else []) + ["--home", home] + list(args)
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=e,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (argv, p.returncode, p.stdout, p.stderr))
    out = p.stdout
    if json_out:
        try:
            out = json.loads(p.stdout)
        except ValueError:
            pass
    return out, p.returncode, p.stderr


def have_fashion():
    return os.path.exists(FASHION)


def tiny_task_text(drop=(), extra=""):
    """tests/devnet-tiny.toml without the lines starting with `drop`, `extra` appended."""
    with open(os.path.join(ROOT, "tests", "devnet-tiny.toml")) as f:
        lines = [l for l in f if not any(l.startswith(d) for d in drop)]
    return "".join(lines) + extra

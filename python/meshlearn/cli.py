"""Runs the `meshlearn` binary for the work that needs the engine (building a task's bundle,
data root and initial state, quoting, fetching a model, re-executing units for an audit): one
derivation of each, the binary's, called with --json.

The binary is $MESHLEARN_BIN, else the source tree's build/apps/meshlearn (this package lives in
<tree>/python/meshlearn), else `meshlearn` on $PATH.
"""

import json
import os
import shutil
import subprocess

from .errors import CliError


def find_binary(explicit=None):
    if explicit:
        cands = [explicit]
    else:
        env = os.environ.get("MESHLEARN_BIN")
        tree = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "build",
                                            "apps", "meshlearn"))
        cands = [env] if env else [tree, shutil.which("meshlearn")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    looked = ", ".join(c for c in cands if c) or "$PATH"
    raise CliError("the meshlearn binary was not found (looked at %s); build it "
                   "(scripts/build.sh release meshlearn) or set $MESHLEARN_BIN" % looked)


def run_json(binary, args, home, passphrase=None, timeout=None, cwd=None, explain=None):
    """`meshlearn --json --home HOME ARGS...`: the JSON document it prints. Raises CliError with
    the binary's own message (passed through `explain`, e.g. to name a task dict) on failure."""
    argv = [binary, "--json", "--home", home] + [str(a) for a in args]
    env = dict(os.environ)
    if passphrase:
        env["MESHLEARN_PASSPHRASE"] = passphrase  # never on the command line
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise CliError("`meshlearn %s` did not finish within %s s" % (" ".join(argv[4:]), timeout),
                       code="DeadlineExceeded", argv=argv) from None
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    fix = explain or (lambda s: s)
    # Most commands print one document; some print several (watch: one per change; a failed
    # verify-model: its finding, then the error): the last one is the outcome.
    j, dec, pos = None, json.JSONDecoder(), 0
    while True:
        while pos < len(out) and out[pos].isspace():
            pos += 1
        if pos >= len(out):
            break
        try:
            j, pos = dec.raw_decode(out, pos)
        except ValueError:
            j = None
            break
    if isinstance(j, dict) and isinstance(j.get("error"), dict) and (p.returncode != 0):
        e = j["error"]
        raise CliError(fix(e.get("message", "failed")), code=e.get("code"), argv=argv)
    if p.returncode != 0 and not isinstance(j, dict):
        msg = err.strip().splitlines()[-1] if err.strip() else "exit status %d" % p.returncode
        if msg.startswith("error: "):
            msg = msg[len("error: "):]
        raise CliError(fix("`meshlearn %s`: %s" % (" ".join(argv[4:]), msg)), argv=argv)
    if j is None:
        raise CliError("`meshlearn %s` printed no JSON (stderr: %s)" %
                       (" ".join(argv[4:]), err.strip()[-500:]), argv=argv)
    return j, p.returncode

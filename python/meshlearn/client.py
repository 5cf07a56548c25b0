"""meshlearn.Client: a submitter's and a wallet's view of a meshlearn network from Python.

    import meshlearn
    c = meshlearn.Client("http://127.0.0.1:7700", key="alice")   # keys from $MESHLEARN_HOME
    c.balance()                                   # {"balance": ..., "nonce": ..., ...}
    c.transfer(bob_public_key, 250, memo="rent")  # signed here, sent over JSON-RPC
    q = c.quote("my-task.toml")                   # or a dict
    t = c.submit("my-task.toml")                  # {"task_id": ..., ...}
    for p in c.watch(t["task_id"]):               # round progress until the task ends
        print(p.rounds_done, p.rounds, p.test_accuracy)
    report = c.fetch(t["task_id"], "out/my-task") # model.safetensors + report.json
    audit = c.audit(t["task_id"], full=True)      # {"verdict": "PASS", ...}

Who computes what (docs/python.md): reads, watching and transfers talk to the ledger's JSON-RPC
directly (transactions are encoded and signed here, tx.py); what needs the engine (a task's
bundle, data root, initial state and price, a fetched model, an audit's re-execution) runs the
`meshlearn` binary with --json, the one implementation of each.
"""

import dataclasses
import json
import os
import time

from . import cli, keys, tasks, tx
from .errors import CliError, MeshlearnError, RpcError, TaskError, TransactionRejected
from .rpc import Rpc

_HEX = set("0123456789abcdefABCDEF")


@dataclasses.dataclass
class RoundProgress:
    """One look at a task while it runs (what `meshlearn task watch` shows).

    Rounds are numbered from 0, as the ledger records them; `rounds_done` counts from 1. It can
    go down while a task runs: a round whose unit fails its check (or is abandoned) runs again,
    and its result leaves the record until it is aggregated again (docs/verification.md).
    `test_accuracy` is None for a language model (its metric is test_loss / perplexity)."""
    task_id: str
    status: str          # "open", "finished", "cancelled"
    phase: str           # the open round's phase ("training", ...), "" when closed
    round: int           # the round now running (0-based)
    rounds: int
    rounds_done: int
    units_total: int
    units_committed: int
    units_assigned: int
    spent: int
    budget: int
    test_accuracy: object  # float or None
    test_loss: object      # float or None (no round finished yet)
    train_loss: object     # mean loss of the newest round's committed units, or None
    final_state: str       # "" until finished
    task: dict             # the ledger's record (get_task with units)

    @property
    def done(self):
        return self.status != "open"

    def key(self):
        return (self.status, self.phase, self.round, self.rounds_done, self.units_committed,
                self.units_assigned, self.spent)


def progress_of(t):
    """RoundProgress of a get_task record (with units); the rules of cmd_task.cc ProgressOf."""
    params = t.get("params") or {}
    results = t.get("round_results") or []
    has_acc = any((r.get("test_accuracy_ppm") or 0) > 0 for r in results)
    committed = assigned = 0
    loss_sum, loss_n, loss_round = 0.0, 0, 0
    for u in t.get("units") or []:
        s = u.get("status", "")
        if s in ("committed", "verified"):
            committed += 1
            r = u.get("round", 0)
            if r > loss_round:
                loss_sum, loss_n, loss_round = 0.0, 0, r
            if r == loss_round:
                loss_sum += (u.get("loss_micros") or 0) / 1e6
                loss_n += 1
        elif s == "assigned":
            assigned += 1
    fs = t.get("final_state") or ""
    last = results[-1] if results else None
    status = t.get("status", "")
    return RoundProgress(
        task_id=t.get("id", ""), status=status,
        phase=(t.get("phase") or "") if status == "open" else "",
        round=t.get("round") or 0, rounds=params.get("rounds", 0), rounds_done=len(results),
        units_total=t.get("unit_count", 0), units_committed=committed, units_assigned=assigned,
        spent=t.get("spent", 0), budget=t.get("budget", 0),
        test_accuracy=(last.get("test_accuracy_ppm", 0) / 1e6) if last and has_acc else None,
        test_loss=(last.get("test_loss_micros", 0) / 1e6) if last else None,
        train_loss=(loss_sum / loss_n) if loss_n else None,
        final_state=fs if fs.strip("0") else "", task=t)


class Client:
    """A client of one ledger (`rpc`: its URL, default $MESHLEARN_RPC or http://127.0.0.1:7700;
    several, comma-separated, are a replicated sequencer's candidates: calls fail over, rpc.py).

    `home` is the meshlearn home holding keys/ (default $MESHLEARN_HOME or ~/.meshlearn), `key`
    the name of the key that signs and pays, `passphrase` its passphrase when it is encrypted
    (default $MESHLEARN_PASSPHRASE; it reaches the binary through its environment only).
    `binary` overrides where the `meshlearn` binary is found (cli.find_binary)."""

    def __init__(self, rpc=None, home=None, key=None, passphrase=None, binary=None):
        self.rpc = Rpc(rpc)
        self.home = keys.home_dir(home)
        self.key_name = key
        self._passphrase = passphrase if passphrase is not None else os.environ.get(
            "MESHLEARN_PASSPHRASE")
        self._binary = binary
        self._key = None

    # ---- keys

    def key(self):
        """The signing key (keys.Key), loaded once."""
        if self._key is None:
            if not self.key_name:
                raise MeshlearnError("this Client has no key: pass key=NAME (see `meshlearn "
                                     "keys list`)")
            self._key = keys.load_key(self.key_name, self.home, self._passphrase)
        return self._key

    def address(self, who=None):
        """The public key (hex) of `who`: 64 hex digits, a key name in this home, or (None)
        this client's key."""
        if who is None:
            if not self.key_name:
                raise MeshlearnError("name the account: an address or key=NAME on the Client")
            who = self.key_name
        if isinstance(who, (bytes, bytearray)) and len(who) == 32:
            return bytes(who).hex()
        if isinstance(who, str) and len(who) == 64 and set(who) <= _HEX:
            return who.lower()
        try:
            return keys.public_key_of(who, self.home)
        except keys.KeyFileError:
            raise MeshlearnError("%r is neither a public key (64 hex digits) nor a key in %s" %
                                 (who, keys.keys_dir(self.home))) from None

    # ---- the ledger, read directly

    def chain_status(self):
        return self.rpc.call("chain_status")

    def balance(self, who=None):
        """get_account of `who` (default: this client's key): balance, nonce, unbonding."""
        return self.rpc.call("get_account", address=self.address(who))

    def history(self, who=None, limit=20, cursor=0):
        return self.rpc.call("account_history", address=self.address(who), limit=limit,
                             cursor=cursor)

    def task(self, task_id):
        """The ledger's record of a task (get_task with its units)."""
        return self.rpc.call("get_task", id=self.resolve_task_id(task_id), units=True)

    def resolve_task_id(self, task_id):
        """The full id of a task given by its 64 hex digits or any unique prefix."""
        if not isinstance(task_id, str) or not task_id or not set(task_id) <= _HEX:
            raise TaskError("task id: expected hex digits (the id, or any unique prefix of it), "
                            "got %r" % (task_id,))
        if len(task_id) > 64:
            raise TaskError("task id: expected at most 64 hex digits, got %d" % len(task_id))
        tid = task_id.lower()
        if len(tid) == 64:
            return tid
        found, cursor = [], 0
        while cursor is not None:
            page = self.rpc.call("list_tasks", cursor=cursor, limit=100)
            found += [t["id"] for t in page.get("items", []) if t.get("id", "").startswith(tid)]
            cursor = page.get("next_cursor")
        if not found:
            raise TaskError("no task on %s has an id starting with %s" % (self.rpc.url, tid))
        if len(found) > 1:
            raise TaskError("%d tasks have ids starting with %s: %s; give more digits" %
                            (len(found), tid, ", ".join(found)))
        return found[0]

    def watch(self, task_id, timeout=None):
        """Yields a RoundProgress at the start and after every change (a unit committed, a
        round finished, ...) until the task is finished or cancelled; the last one yielded is
        the closed task. Waits for blocks with the ledger's wait_block long poll. `timeout`
        (seconds, None: none) raises MeshlearnError if the task is still open then."""
        tid = self.resolve_task_id(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        height = self.rpc.call("chain_status")["height"]
        last = None
        while True:
            p = progress_of(self.rpc.call("get_task", id=tid, units=True))
            if last is None or p.key() != last:
                last = p.key()
                yield p
            if p.done:
                return
            wait_ms = 10000
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MeshlearnError("task %s is still open after %s s (round %d, %d/%d "
                                         "rounds done); watch it again to continue" %
                                         (tid, timeout, p.round, p.rounds_done, p.rounds))
                wait_ms = max(1, min(wait_ms, int(left * 1000)))
            r = self.rpc.call("wait_block", _timeout=wait_ms / 1000 + 30, after=height,
                              timeout_ms=wait_ms)
            height = max(height, r.get("height", height))

    # ---- transactions signed here

    def _pending_outbox(self, next_nonce):
        """The CLI's outbox entry of this key (a transaction a timed-out command left), if it
        may still be included: sending another at its nonce would race it."""
        path = os.path.join(self.home, "outbox", self.key_name + ".tx")
        if not os.path.exists(path):
            return
        try:
            with open(path) as f:
                wire = bytes.fromhex(f.read().strip())
            n = int.from_bytes(wire[1:5], "little")
            nonce = int.from_bytes(wire[5 + n + 32:5 + n + 40], "little")
        except (ValueError, OSError):
            return
        if nonce >= next_nonce:
            raise MeshlearnError(
                "key '%s' has an unconfirmed transaction (nonce %d) from an earlier `meshlearn "
                "wallet` command that timed out; re-run that command to resend it, or delete %s "
                "to abandon it" % (self.key_name, nonce, path))

    def send(self, payload, fee=0, timeout=60.0):
        """Signs `payload` (tx.transfer_payload / tx.faucet_payload) with this client's key at
        its next nonce, sends it and waits until its block is committed. Returns get_tx's answer
        (tx_id, status, height, receipt, tx). Raises TransactionRejected when the ledger refuses
        it or its receipt is not ok. Resending the same bytes after a lost answer is a no-op on
        the ledger, so a retry inside `timeout` never pays twice."""
        k = self.key()
        st = self.rpc.call("chain_status")
        nonce = self.rpc.call("get_account", address=k.public_key_hex)["nonce"]
        self._pending_outbox(nonce)
        signed = tx.sign(k, st["chain_id"], nonce, payload, fee)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeshlearnError(
                    "transaction %s was not included within %s s; it may still be: check with "
                    "`meshlearn wallet tx %s`" % (signed.id, timeout, signed.id))
            wait = int(min(left, 1.0) * 1000) or 1
            try:
                r = self.rpc.call("send_tx", _timeout=wait / 1000 + 30, tx=signed.hex,
                                  wait_ms=wait)
            except RpcError as e:
                if e.status == "Unavailable":
                    time.sleep(min(left, 0.5))
                    continue
                raise TransactionRejected(str(e), tx_id=signed.id) from None
            if r.get("status") == "included":
                done = self.rpc.call("get_tx", id=signed.id)
                receipt = done.get("receipt") or {}
                if not receipt.get("ok", False):
                    raise TransactionRejected(
                        "transaction %s failed in block %s: %s" %
                        (signed.id, done.get("height"), receipt.get("reason", "no reason given")),
                        receipt=receipt, tx_id=signed.id)
                return done
            if r.get("status") == "rejected":
                why = (r.get("error") or {}).get("message", "no reason given")
                raise TransactionRejected("the ledger dropped transaction %s: %s" %
                                          (signed.id, why), tx_id=signed.id)

    def transfer(self, to, amount, memo="", fee=0, timeout=60.0):
        """Sends `amount` tokens to `to` (a public key or a key name in this home)."""
        return self.send(tx.transfer_payload(self.address(to), amount, memo), fee, timeout)

    def faucet(self, amount=1_000_000, fee=0, timeout=60.0):
        """Devnet chains (genesis faucet = true): mints `amount` to this client's account."""
        return self.send(tx.faucet_payload(self.key().public_key, amount), fee, timeout)

    # ---- stake: `meshlearn wallet stake|unstake|withdraw --json`, the CLI's one derivation
    # (the node id a name or prefix stands for, the outbox that makes a retry resend the same
    # signed transaction), like submit.

    def stake(self, node, amount, fee=0, timeout=60):
        """Bonds `amount` onto `node` (a key name in this home, a node id, or a unique prefix of
        one; the ledger takes stake only from the node's owner). Waits for the block; returns
        its get_tx answer (receipt, height, tx). Raises TransactionRejected when it failed."""
        return self._wallet(["stake", node, amount], fee, timeout)

    def unstake(self, node, amount, fee=0, timeout=60):
        """Starts unbonding `amount` of `node`'s stake; it can be withdrawn after the chain's
        unbonding_delay_blocks (the account's "unbonding" list says when: balance())."""
        return self._wallet(["unstake", node, amount], fee, timeout)

    def withdraw(self, fee=0, timeout=60):
        """Moves every matured unbonding entry of this client's account to its balance. Raises
        TransactionRejected ("nothing has matured yet; next release at height N") before then."""
        return self._wallet(["withdraw"], fee, timeout)

    def _wallet(self, args, fee, timeout):
        if not self.key_name:
            raise MeshlearnError("%s needs a key: Client(..., key=NAME)" % args[0])
        self.key()  # a missing key or a wrong passphrase is reported by Python, before any work
        j, rc = self._cli(["wallet"] + list(args) + ["--key", self.key_name, "--fee", int(fee),
                                                     "--timeout", int(timeout)],
                          passphrase=True)
        receipt = j.get("receipt") or {}
        if rc != 0 or not receipt.get("ok", False):
            tx_id = j.get("tx_id") or (j.get("tx") or {}).get("id")
            raise TransactionRejected("%s: transaction %s failed in block %s: %s" %
                                      (args[0], tx_id, j.get("height"),
                                       receipt.get("reason", "no reason given")),
                                      receipt=receipt, tx_id=tx_id)
        return j

    # ---- what needs the engine: the binary

    def _cli(self, args, passphrase=False, timeout=None, explain=None):
        binary = cli.find_binary(self._binary)
        return cli.run_json(binary, list(args) + ["--rpc", self.rpc.url_list], self.home,
                            passphrase=self._passphrase if passphrase else None,
                            timeout=timeout, explain=explain)

    def quote(self, task):
        """`meshlearn task quote`: cost (expected spend), cost_min/cost_max, estimated_seconds,
        expected (split by payee) and params, from the nodes registered now."""
        with tasks.task_file(task) as f:
            j, _ = self._cli(["task", "quote", f.path], explain=f.explain)
        return j

    def validate(self, task):
        """`meshlearn task submit --dry-run`: every check SubmitTask makes; the params."""
        with tasks.task_file(task) as f:
            j, _ = self._cli(["task", "submit", f.path, "--dry-run"], explain=f.explain)
        return j

    def submit(self, task, memo=None, replicas=None):
        """`meshlearn task submit` with this client's key: publishes the bundle, data and initial
        state to the nodes and escrows the budget. Returns the submission (task_id, tx, height,
        params, ...)."""
        if not self.key_name:
            raise MeshlearnError("submit needs a key: Client(..., key=NAME)")
        self.key()  # a missing key or a wrong passphrase is reported by Python, before any work
        with tasks.task_file(task) as f:
            args = ["task", "submit", f.path, "--key", self.key_name]
            if memo is not None:
                args += ["--memo", memo]
            if replicas is not None:
                args += ["--replicas", replicas]
            j, _ = self._cli(args, passphrase=True, explain=f.explain)
        return j

    def status(self, task_id):
        """`meshlearn task status`: the ledger's record with money (one vocabulary, see
        docs/submitters.md "Where the tokens go") and metric."""
        j, _ = self._cli(["task", "status", self.resolve_task_id(task_id)])
        return j

    def fetch(self, task_id, out):
        """`meshlearn task fetch`: writes OUT/model.safetensors and OUT/report.json; returns the
        report. `out` is relative to the working directory."""
        j, _ = self._cli(["task", "fetch", self.resolve_task_id(task_id), "--out",
                          os.path.abspath(os.fspath(out))])
        return j

    def verify_model(self, task_id, model_file):
        """`meshlearn task verify-model`: {"match": bool, "state", "round", "weights_hash",
        ...}; a file that does not hold the recorded weights gives match False and the
        binary's explanation in "message"."""
        try:
            j, _ = self._cli(["task", "verify-model", self.resolve_task_id(task_id),
                              os.path.abspath(os.fspath(model_file))])
        except CliError as e:
            if e.code != "DataLoss":
                raise
            return {"match": False, "message": str(e)}
        return j

    def audit(self, task_id, full=False, sample=None, seed=None, task=None):
        """`meshlearn task audit`: re-executes units (all with full=True) with the code the
        nodes run. Returns the report; report["verdict"] is "PASS" or "FAIL" (a FAIL is a
        report, not an exception: it names the first mismatch)."""
        args = ["task", "audit", self.resolve_task_id(task_id)]
        if full:
            args.append("--full")
        if sample is not None:
            args += ["--sample", sample]
        if seed is not None:
            args += ["--seed", seed]
        if task is None:
            j, _ = self._cli(args)
            return j
        with tasks.task_file(task) as f:
            j, _ = self._cli(args + ["--task", f.path], explain=f.explain)
        return j

    def cancel(self, task_id):
        """`meshlearn task cancel` with this client's key: refunds the unspent escrow."""
        j, _ = self._cli(["task", "cancel", self.resolve_task_id(task_id), "--key",
                          self.key_name], passphrase=True)
        return j

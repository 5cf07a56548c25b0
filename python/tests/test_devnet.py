"""The Python client against a real devnet (`meshlearn devnet --keep`: a ledger and 4 node
processes on loopback). A key the CLI wrote (encrypted) signs transactions built in Python; the
encoding is pinned to the C++ one (a transfer the CLI sent, rebuilt here, has the same signature
and id bit for bit); a task written as a dict around a PyTorch model exported by
meshlearn.torch is quoted, submitted, watched to its end, fetched and audited from Python, and
every number agrees with the CLI's view; the fetched model, loaded into the same PyTorch module,
evaluates in PyTorch to the accuracy the network reported. Needs python3-nacl, python3-torch."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import unittest

import torch
import torch.nn as nn

import meshlearn
import meshlearn.torch as mt
from meshlearn import keys, tx
import util

PASS = "correct horse"


def wait_for(log, pattern, timeout, proc):
    """The first match of `pattern` in the file `log`, waiting up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log, errors="replace") as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    with open(log, errors="replace") as f:
        raise AssertionError("no %r in the devnet's output within %d s:\n%s" %
                             (pattern, timeout, f.read()[-4000:]))


@unittest.skipUnless(util.have_fashion(), "Fashion-MNIST not installed (dataset-fashion-mnist)")
class DevnetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.base = util.tempdir("devnet")
        task = os.path.join(cls.base, "devnet-task.toml")
        with open(task, "w") as f:
            f.write(util.tiny_task_text())
        cls.log = os.path.join(cls.base, "devnet.out")
        env = dict(os.environ, MESHLEARN_HOME=os.path.join(cls.base, "devnet-home"))
        with open(cls.log, "w") as log:
            cls.proc = subprocess.Popen(
                [util.binary(), "devnet", "--solvers", "4", "--task", task,
                 "--block-interval-ms", "200", "--keep", "--no-check-reference", "--timeout",
                 "400", "--out", os.path.join(cls.base, "d")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            cls.rpc = wait_for(cls.log, r"ledger at (http://127\.0\.0\.1:\d+)", 90,
                               cls.proc).group(1)
            # The devnet's own task is submitted once its nodes registered.
            wait_for(cls.log, r"task [0-9a-f]{64} submitted", 180, cls.proc)
        except Exception:
            cls.tearDownClass()
            raise
        # The user's home: keys the CLI made, one encrypted.
        cls.home = os.path.join(cls.base, "user")
        util.cli(cls.home, "keys", "new", "alice", env={"MESHLEARN_PASSPHRASE": PASS})
        util.cli(cls.home, "keys", "new", "bob", "--no-passphrase")

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.send_signal(signal.SIGINT)  # --keep: Ctrl-C stops the network
            try:
                cls.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                cls.proc.kill()
                cls.proc.wait()

    def cli(self, *args, **kw):
        return util.cli(self.home, *args, "--rpc", self.rpc, **kw)

    def test_wallet_and_a_task_from_python(self):
        c = meshlearn.Client(self.rpc, home=self.home, key="alice", passphrase=PASS)
        bob = keys.public_key_of("bob", self.home)

        # -- Transactions signed in Python: a faucet mint, then transfers.
        before = c.balance()["balance"]
        minted = c.faucet(400000)
        self.assertTrue(minted["receipt"]["ok"], minted)
        self.assertEqual(c.balance()["balance"], before + 400000)
        # The ledger decoded our bytes and re-encoded them to the same id.
        self.assertEqual(minted["tx"]["id"], minted["tx_id"])
        self.assertEqual(minted["tx"]["type"], "Faucet")

        # The CLI sends a transfer with the same key; rebuilt in Python from its fields it has
        # the same signature and id, bit for bit (ed25519 is deterministic): one encoding.
        sent, _, _ = self.cli("wallet", "transfer", "bob", "123", "--key", "alice", "--memo",
                              "pinned", "--fee", "2", env={"MESHLEARN_PASSPHRASE": PASS})
        t = sent["tx"]
        self.assertEqual(t["type"], "Transfer")
        again = tx.sign(c.key(), t["chain_id"], t["nonce"],
                        tx.transfer_payload(t["payload"]["to"], t["payload"]["amount"],
                                        t["payload"]["memo"]), fee=t["fee"])
        self.assertEqual(again.signature.hex(), t["signature"])
        self.assertEqual(again.id, t["id"])

        done = c.transfer("bob", 777, memo="from python")
        self.assertTrue(done["receipt"]["ok"])
        self.assertEqual(c.balance(bob)["balance"], 900)
        bal, _, _ = self.cli("wallet", "balance", bob)
        self.assertEqual(bal["balance"], 900)
        hist = c.history("bob")["items"]
        self.assertEqual([h["payload"]["memo"] for h in hist], ["from python", "pinned"])
        with self.assertRaises(meshlearn.TransactionRejected) as e:
            c.transfer(bob, 10**15)
        self.assertIn("insufficient", str(e.exception).lower())

        # A wrong passphrase is caught in Python, before anything is published.
        wrong = meshlearn.Client(self.rpc, home=self.home, key="alice", passphrase="nope")
        with self.assertRaises(meshlearn.WrongPassphrase):
            wrong.submit(util.ROOT + "/tests/devnet-tiny.toml")

        # -- A task as a dict around an exported PyTorch model, starting from its weights.
        torch.manual_seed(3)
        net = nn.Sequential(nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
        ex = mt.export(net, torch.zeros(1, 784), os.path.join(self.base, "export"))
        task = meshlearn.load_task(os.path.join(util.ROOT, "tests", "devnet-tiny.toml"))
        task["task"]["name"] = "python-devnet"
        task["model"] = ex.model
        task["data"]["init_weights"] = ex.weights_path

        q = c.quote(task)
        self.assertGreater(q["cost"], 0)
        self.assertEqual(q["params"]["rounds"], 3)
        sub = c.submit(task)
        tid = sub["task_id"]
        self.assertEqual(len(tid), 64)
        self.assertEqual(c.resolve_task_id(tid[:12]), tid)

        seen = list(c.watch(tid[:12], timeout=400))
        last = seen[-1]
        self.assertEqual(last.status, "finished", last)
        self.assertEqual((last.rounds_done, last.rounds), (3, 3))
        # It saw the task move, not only its end. (rounds_done is not monotonic: a round whose
        # check fails or is abandoned runs again, and its result leaves the record meanwhile.)
        self.assertTrue(any(0 < p.rounds_done < 3 for p in seen), [p.rounds_done for p in seen])
        self.assertTrue(all(p.status == "open" for p in seen[:-1]))
        self.assertIsNotNone(last.test_accuracy)

        # -- The CLI's view of the same task: the same numbers.
        st, _, _ = self.cli("task", "status", tid)
        self.assertEqual(st["metric"]["test_accuracy"], last.test_accuracy)
        self.assertEqual(st["spent"], last.spent)
        self.assertEqual(st["final_state"], last.final_state)
        self.assertEqual(c.status(tid)["money"], st["money"])

        out = os.path.join(self.base, "fetched")
        report = c.fetch(tid, out)
        self.assertEqual(report["state"], st["final_state"])
        self.assertEqual(report["round"], 2)
        self.assertEqual(report["money"], st["money"])
        self.assertEqual(report["metric"]["test_accuracy"], last.test_accuracy)
        verify = c.verify_model(tid, report["model"])
        self.assertTrue(verify["match"], verify)

        audit = c.audit(tid, full=True)
        self.assertEqual(audit["verdict"], "PASS", audit)

        # -- The network started from the exported weights: its final weights are those of
        # `meshlearn diloco` (the in-process reference the devnet checks against) from the same
        # file, and not those of the same task initialised from its seed.
        with meshlearn.tasks.task_file(task) as f:
            ref, _, _ = util.cli(self.home, "diloco", f.path)
        seeded = dict(task, data={k: v for k, v in task["data"].items() if k != "init_weights"})
        with meshlearn.tasks.task_file(seeded) as f:
            ref_seed, _, _ = util.cli(self.home, "diloco", f.path)
        print("\nnetwork weights %s; diloco from init_weights %s, from the seed %s" %
              (verify["weights_hash"][:12], ref["final_weights_hash"][:12],
               ref_seed["final_weights_hash"][:12]))
        self.assertEqual(ref["final_weights_hash"], verify["weights_hash"])
        self.assertNotEqual(ref_seed["final_weights_hash"], verify["weights_hash"])

        # -- The trained model, loaded into the same PyTorch module, evaluates in PyTorch to the
        # accuracy the network reported (the aggregator's, on the whole test split).
        meta = mt.load(net, report["model"])
        self.assertEqual(meta["meshlearn.task"], tid)
        got = mt.evaluate(net, task)
        print("\nnetwork test_accuracy %.4f loss %.6f; PyTorch %.4f loss %.6f on %d samples" %
              (last.test_accuracy, last.test_loss, got["accuracy"], got["loss"], got["samples"]))
        self.assertLessEqual(abs(got["accuracy"] - last.test_accuracy), 2 / got["samples"])
        self.assertAlmostEqual(got["loss"], last.test_loss, delta=1e-4)

    def test_stake_unstake_withdraw_from_python(self):
        # A node of our own (its folder is a home whose key "node" owns it), priced above every
        # task's price_cap and heartbeating rarely, so that it sends no transaction of its own
        # while Python signs with its key (a devnet node's key would race its heartbeats for
        # nonces).
        d = os.path.join(self.base, "staker")
        os.makedirs(d)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cfg = os.path.join(d, "node.toml")
        with open(cfg, "w") as f:
            f.write('data_dir = "."\nrpc = "%s"\nlisten = "127.0.0.1:%d"\nroles = "solver"\n'
                    'price = 1000000000\nstake = 1000\nheartbeat_blocks = 100000\n' %
                    (self.rpc, port))
        util.cli(d, "node", "init", "--config", cfg)
        c = meshlearn.Client(self.rpc, home=d, key="node", passphrase="")
        c.faucet(5000)
        with open(os.path.join(d, "run.log"), "w") as log:
            proc = subprocess.Popen([util.binary(), "--home", d, "node", "run", "--config", cfg],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if c.rpc.call("get_node", id=c.address())["status"] == "active":
                        break
                except meshlearn.RpcError:
                    pass
                self.assertIsNone(proc.poll(), "the node exited; see %s/run.log" % d)
                self.assertLess(time.monotonic(), deadline, "the node did not register")
                time.sleep(0.3)
            stake0 = c.rpc.call("get_node", id=c.address())["stake"]
            self.assertEqual(stake0, 1000)
            bal0 = c.balance()["balance"]

            done = c.stake("node", 500)
            self.assertTrue(done["receipt"]["ok"], done)
            self.assertEqual(done["tx"]["type"], "Stake")
            self.assertEqual(c.rpc.call("get_node", id=c.address())["stake"], 1500)
            self.assertEqual(c.balance()["balance"], bal0 - 500)
            bal, _, _ = util.cli(d, "wallet", "balance", "--key", "node", "--rpc", self.rpc)
            self.assertEqual(bal["balance"], bal0 - 500)  # the CLI's view of the same account

            # A node id prefix is taken as on the command line.
            done = c.unstake(c.address()[:12], 500)
            self.assertEqual(done["tx"]["type"], "Unstake")
            self.assertEqual(c.rpc.call("get_node", id=c.address())["stake"], 1000)
            unbonding = c.balance()["unbonding"]
            self.assertEqual([u["amount"] for u in unbonding], [500])
            release = unbonding[0]["release_height"]
            # Refusals are TransactionRejected with the ledger's reason.
            with self.assertRaises(meshlearn.TransactionRejected) as e:
                c.unstake("node", 10**12)
            self.assertIn("more than the node's stake", str(e.exception))
            if c.chain_status()["height"] < release:
                with self.assertRaises(meshlearn.TransactionRejected) as e:
                    c.withdraw()
                self.assertIn("nothing has matured yet", str(e.exception))
            while c.chain_status()["height"] < release:
                time.sleep(0.2)
            before = c.balance()["balance"]
            done = c.withdraw()
            self.assertEqual(done["tx"]["type"], "Withdraw")
            after = c.balance()
            self.assertEqual(after["unbonding"], [])
            self.assertEqual(after["balance"], before + 500)
            print("\nstake: node %s 1000 -> 1500 -> 1000, 500 withdrawn at height %d" %
                  (c.address()[:12], done["height"]))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            # Unregister it: an active node that does not answer would be pushed the blobs of
            # the next task submitted (`task submit` pushes to the registered nodes).
            util.cli(d, "node", "leave", "--config", cfg, check=False)
        self.assertNotEqual(c.rpc.call("get_node", id=c.address())["status"], "active")

    def test_the_example_of_docs_python_md_runs_as_written(self):
        with open(os.path.join(util.ROOT, "docs", "python.md")) as f:
            doc = f.read()
        section = doc[doc.index("## A complete example"):]
        code = section[section.index("```python\n") + len("```python\n"):]
        code = code[:code.index("```")]
        env = dict(os.environ, PYTHONPATH=os.path.join(util.ROOT, "python"),
                   MESHLEARN_RPC=self.rpc, MESHLEARN_HOME=self.home, MESHLEARN_PASSPHRASE=PASS,
                   MESHLEARN_BIN=util.binary())
        cwd = util.tempdir("example")
        p = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("audit PASS", p.stdout)
        self.assertIn("rounds 3/3", p.stdout)
        self.assertTrue(os.path.exists(os.path.join(cwd, "out", "python-example",
                                                    "model.safetensors")))
        last = p.stdout.strip().splitlines()[-1].split()
        self.assertEqual(last[0], "network")
        self.assertLessEqual(abs(float(last[1]) - float(last[3])), 2 / 10000, p.stdout)


if __name__ == "__main__":
    unittest.main()

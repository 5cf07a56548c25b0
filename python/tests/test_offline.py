"""The Python client without a ledger: key files the CLI wrote (clear and encrypted), its errors,
task dicts written as TOML and checked by the binary, RPC errors. Needs python3-nacl."""

import http.server
import json
import os
import socket
import stat
import threading
import tomllib
import unittest

import nacl.signing

import meshlearn
from meshlearn import keys, safetensors, tasks, tx
import util


class KeysTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.home = util.tempdir("keys")
        util.cli(cls.home, "keys", "new", "clear", "--no-passphrase")
        util.cli(cls.home, "keys", "new", "sealed", env={"MESHLEARN_PASSPHRASE": "hunter22"})
        listing, _, _ = util.cli(cls.home, "keys", "list")
        cls.public = {k["name"]: k["public_key"] for k in listing if "public_key" in k}

    def test_loads_what_the_cli_wrote(self):
        k = keys.load_key("clear", self.home)
        self.assertEqual(k.public_key_hex, self.public["clear"])
        s = keys.load_key("sealed", self.home, passphrase="hunter22")
        self.assertEqual(s.public_key_hex, self.public["sealed"])
        # The seed is the CLI's: a signature made here verifies under the CLI's public key.
        sig = s.sign(b"hello")
        nacl.signing.VerifyKey(bytes.fromhex(self.public["sealed"])).verify(b"hello", sig)
        good, bad = meshlearn.list_keys(self.home)
        self.assertEqual({g["name"]: g["encrypted"] for g in good}, {"clear": False, "sealed": True})
        self.assertEqual(bad, [])

    def test_passphrase_from_environment(self):
        old = os.environ.get("MESHLEARN_PASSPHRASE")
        os.environ["MESHLEARN_PASSPHRASE"] = "hunter22"
        try:
            c = meshlearn.Client("http://127.0.0.1:9", home=self.home, key="sealed")
            self.assertEqual(c.key().public_key_hex, self.public["sealed"])
        finally:
            if old is None:
                del os.environ["MESHLEARN_PASSPHRASE"]
            else:
                os.environ["MESHLEARN_PASSPHRASE"] = old

    def test_errors_name_the_file_and_the_fix(self):
        path = keys.key_path("sealed", self.home)
        with self.assertRaises(meshlearn.WrongPassphrase) as e:
            keys.load_key("sealed", self.home, passphrase="wrong")
        self.assertIn(path + ": wrong passphrase (decryption failed)", str(e.exception))
        with self.assertRaises(meshlearn.KeyFileError) as e:
            keys.load_key("sealed", self.home, passphrase="")
        self.assertIn("key is encrypted; give its passphrase", str(e.exception))
        with self.assertRaises(meshlearn.KeyFileError) as e:
            keys.load_key("nobody", self.home)
        self.assertIn("no key named 'nobody'", str(e.exception))
        self.assertIn("meshlearn keys new nobody", str(e.exception))
        with self.assertRaises(meshlearn.KeyFileError) as e:
            keys.load_key("../x", self.home)
        self.assertIn("is invalid", str(e.exception))

    def test_corrupt_file_is_told_apart_from_a_wrong_passphrase(self):
        home = util.tempdir("corrupt")
        util.cli(home, "keys", "new", "k", env={"MESHLEARN_PASSPHRASE": "pw"})
        path = keys.key_path("k", home)
        j = json.load(open(path))
        j["secret"] = ("0" if j["secret"][0] != "0" else "1") + j["secret"][1:]
        with open(path, "w") as f:
            json.dump(j, f)
        with self.assertRaises(meshlearn.KeyFileError) as e:
            keys.load_key("k", home, passphrase="pw")
        self.assertNotIsInstance(e.exception, meshlearn.WrongPassphrase)
        self.assertIn("key file is corrupt (checksum mismatch)", str(e.exception))
        # The CLI says the same of the same file.
        out, code, err = util.cli(home, "keys", "show", "k", check=False, json_out=False)
        self.assertNotEqual(code, 0)
        self.assertIn("checksum mismatch", err)

    def test_a_key_others_can_read_is_refused(self):
        home = util.tempdir("mode")
        util.cli(home, "keys", "new", "k", "--no-passphrase")
        path = keys.key_path("k", home)
        os.chmod(path, 0o644)
        with self.assertRaises(meshlearn.KeyFileError) as e:
            keys.load_key("k", home)
        self.assertIn("has mode 0644", str(e.exception))
        self.assertIn("chmod 600 " + path, str(e.exception))


class TxEncodingTest(unittest.TestCase):
    def test_layout_and_signature(self):
        home = util.tempdir("tx")
        util.cli(home, "keys", "new", "a", "--no-passphrase")
        k = keys.load_key("a", home)
        to = "ab" * 32
        s = tx.sign(k, "meshlearn-devnet", 7, tx.transfer_payload(to, 250, "rent"), fee=1)
        w = s.wire
        # u8 version | string chain | sender | u64 nonce | u64 fee | u16 tag | payload | sig
        self.assertEqual(w[0], 1)
        self.assertEqual(int.from_bytes(w[1:5], "little"), len("meshlearn-devnet"))
        off = 5 + len("meshlearn-devnet")
        self.assertEqual(w[off:off + 32], k.public_key)
        self.assertEqual(int.from_bytes(w[off + 32:off + 40], "little"), 7)
        self.assertEqual(int.from_bytes(w[off + 40:off + 48], "little"), 1)
        self.assertEqual(int.from_bytes(w[off + 48:off + 50], "little"), tx.TRANSFER)
        self.assertEqual(w[-64:], s.signature)
        nacl.signing.VerifyKey(k.public_key).verify(b"meshlearn.tx.v1" + w[:-64], s.signature)
        with self.assertRaises(meshlearn.MeshlearnError):
            tx.transfer_payload("zz", 1)
        with self.assertRaises(meshlearn.MeshlearnError):
            tx.transfer_payload(to, -1)


@unittest.skipUnless(util.have_fashion(), "Fashion-MNIST not installed (dataset-fashion-mnist)")
class TaskDictTest(unittest.TestCase):
    def setUp(self):
        self.home = util.tempdir("task")
        self.path = os.path.join(self.home, "tiny.toml")
        with open(self.path, "w") as f:
            f.write(util.tiny_task_text())
        # No ledger answers here: the dry run checks against the default chain parameters.
        self.c = meshlearn.Client("http://127.0.0.1:9", home=self.home)

    def test_a_dict_is_the_same_task_as_its_file(self):
        d = meshlearn.load_task(self.path)
        self.assertEqual(tomllib.loads(meshlearn.to_toml(d)), d)
        from_file = self.c.validate(self.path)
        from_dict = self.c.validate(d)
        self.assertTrue(from_dict["valid"])
        self.assertEqual(from_dict["params"], from_file["params"])

    def test_relative_data_paths_in_a_dict_are_the_working_directory(self):
        d = meshlearn.load_task(self.path)
        cwd = os.getcwd()
        os.chdir("/usr/share/datasets")
        try:
            for k in ("train_images", "train_labels", "test_images", "test_labels"):
                d["data"][k] = os.path.relpath(d["data"][k], "/usr/share/datasets")
            self.assertTrue(self.c.validate(d)["valid"])
        finally:
            os.chdir(cwd)

    def test_errors_name_the_dict_and_its_key(self):
        d = meshlearn.load_task(self.path)
        d["network"]["budget"] = 10
        with self.assertRaises(meshlearn.CliError) as e:
            self.c.validate(d)
        msg = str(e.exception)
        self.assertIn("task (dict): network.budget = 10 is below the most this task can cost", msg)
        self.assertNotIn("/tmp", msg)
        d = meshlearn.load_task(self.path)
        d["network"]["no_such_key"] = 1
        with self.assertRaises(meshlearn.CliError) as e:
            self.c.validate(d)
        self.assertIn("no_such_key", str(e.exception))
        with self.assertRaises(meshlearn.TaskError) as e:
            self.c.validate({"task": {"name": None}})
        self.assertIn("task.name is None", str(e.exception))
        with self.assertRaises(meshlearn.TaskError) as e:
            self.c.validate(os.path.join(self.home, "missing.toml"))
        self.assertIn("missing.toml does not exist", str(e.exception))

    def test_init_weights_are_checked_before_anything_is_published(self):
        # tests/devnet-tiny.toml's MLP: layers.0 (64, 784), layers.2 (10, 64).
        def weights(path, first_rows=64, extra=None):
            t = {"layers.0.weight": ("F32", (first_rows, 784), bytes(4 * first_rows * 784)),
                 "layers.0.bias": ("F32", (64,), bytes(4 * 64)),
                 "layers.2.weight": ("F32", (10, 64), bytes(4 * 640)),
                 "layers.2.bias": ("F32", (10,), bytes(40))}
            t.update(extra or {})
            safetensors.write(path, t)
            return path
        d = meshlearn.load_task(self.path)
        cwd = os.getcwd()
        os.chdir(self.home)
        try:
            d["data"]["init_weights"] = os.path.basename(weights(os.path.join(self.home, "w.st")))
            self.assertTrue(self.c.validate(d)["valid"])  # relative to the working directory
        finally:
            os.chdir(cwd)
        cases = [
            (weights(os.path.join(self.home, "narrow.st"), first_rows=32),
             "tensor 'layers.0.weight' has shape (32, 784), the model's is (64, 784)"),
            (weights(os.path.join(self.home, "extra.st"),
                     extra={"optim.m.layers.0.bias": ("F32", (64,), bytes(256))}),
             "tensor 'optim.m.layers.0.bias' F32 (64) is not a parameter of the model"),
            (os.path.join(self.home, "none.st"), "cannot open"),
        ]
        for path, message in cases:
            d["data"]["init_weights"] = path
            with self.assertRaises(meshlearn.CliError) as e:
                self.c.validate(d)
            self.assertIn("task (dict): data.init_weights: ", str(e.exception))
            self.assertIn(message, str(e.exception))


class RpcErrorTest(unittest.TestCase):
    def test_unreachable_ledger_names_the_url(self):
        c = meshlearn.Client("http://127.0.0.1:9", home=util.tempdir("rpc"))
        with self.assertRaises(meshlearn.RpcError) as e:
            c.balance("ab" * 32)
        self.assertIn("get_account: cannot reach the ledger at http://127.0.0.1:9", str(e.exception))
        with self.assertRaises(meshlearn.MeshlearnError) as e:
            c.balance("nobody")
        self.assertIn("neither a public key", str(e.exception))
        with self.assertRaises(meshlearn.TaskError) as e:
            list(c.watch("12xz"))
        self.assertIn("task id: expected hex digits", str(e.exception))


class _FakeLedger:
    """A JSON-RPC endpoint on loopback that answers every call with `answer(method)`: a result,
    or an error status name (a candidate of a replicated sequencer that is not the leader
    answers Unavailable). Counts the calls it got."""

    def __init__(self, answer):
        calls = self.calls = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls.append(req["method"])
                result = answer(req["method"])
                if isinstance(result, str):
                    body = {"jsonrpc": "2.0", "id": req["id"],
                            "error": {"code": -32004, "message": "%s here" % result,
                                      "data": {"status": result}}}
                else:
                    body = {"jsonrpc": "2.0", "id": req["id"], "result": result}
                out = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _dead_url():
    """A loopback URL nothing listens on (a killed candidate)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "http://127.0.0.1:%d" % port


class RpcFailoverTest(unittest.TestCase):
    """A comma-separated URL list (a replicated sequencer's candidates, docs/operators.md): a
    dead first endpoint and a standby answering Unavailable are passed over to the leader, which
    is then asked first; other errors are not retried elsewhere."""

    def setUp(self):
        self.leader = _FakeLedger(lambda m: {"height": 7} if m == "chain_status" else "NotFound")
        self.standby = _FakeLedger(lambda m: "Unavailable")
        self.addCleanup(self.leader.close)
        self.addCleanup(self.standby.close)

    def test_dead_and_standby_endpoints_fail_over_to_the_leader(self):
        dead = _dead_url()
        urls = ",".join([dead, self.standby.url, self.leader.url])
        c = meshlearn.Client(urls, home=util.tempdir("failover"))
        self.assertEqual(c.chain_status(), {"height": 7})
        self.assertEqual(c.rpc.url, self.leader.url)
        self.assertEqual(self.standby.calls, ["chain_status"])
        # The next call goes to the endpoint that answered last.
        self.assertEqual(c.chain_status(), {"height": 7})
        self.assertEqual(self.standby.calls, ["chain_status"])
        self.assertEqual(self.leader.calls, ["chain_status", "chain_status"])
        # An answer that is not "try elsewhere" is the answer: no other endpoint is asked.
        with self.assertRaises(meshlearn.RpcError) as e:
            c.rpc.call("get_task", id="ab" * 32)
        self.assertEqual(e.exception.status, "NotFound")
        self.assertEqual(self.standby.calls, ["chain_status"])
        # The binary gets the whole list.
        self.assertEqual(c.rpc.url_list, urls)

    def test_no_endpoint_answering_names_every_one(self):
        dead = _dead_url()
        urls = dead + "," + self.standby.url
        rpc = meshlearn.Rpc(urls, rounds=2, backoff=0.01)
        with self.assertRaises(meshlearn.RpcError) as e:
            rpc.call("chain_status")
        self.assertEqual(e.exception.status, "Unavailable")
        self.assertIn("every endpoint of " + urls + " was tried, 2 round(s)", str(e.exception))
        self.assertEqual(self.standby.calls, ["chain_status", "chain_status"])  # once a round
        with self.assertRaises(meshlearn.RpcError) as e:
            meshlearn.Rpc(self.leader.url + ",127.0.0.1:7700")
        self.assertIn("'127.0.0.1:7700' (in ", str(e.exception))
        self.assertIn("is not http://HOST:PORT", str(e.exception))


if __name__ == "__main__":
    unittest.main()

"""meshlearn.torch without a network: export refuses what the engine lacks, by name; an exported
nn.Sequential with every layer kind is a model the engine trains (`meshlearn train`), and the
engine's model file loaded back into the same PyTorch module evaluates in PyTorch to the test
accuracy and loss the engine reported. Needs python3-torch."""

import os
import unittest

import torch
import torch.nn as nn

import meshlearn
import meshlearn.torch as mt
from meshlearn import safetensors, tasks
import util


def every_layer_kind():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 8, kernel_size=3, stride=2, padding=1), nn.GELU(approximate="tanh"),
        nn.LayerNorm(7), nn.Flatten(), nn.Dropout(0.1), nn.Linear(8 * 7 * 7, 32), nn.ReLU(),
        nn.Linear(32, 10))


class ExportTest(unittest.TestCase):
    def test_refuses_unsupported_layers_by_name(self):
        x = torch.zeros(1, 784)
        cases = [
            (nn.Sequential(nn.Linear(784, 10), nn.Sigmoid()), "module[1] (Sigmoid): the engine has no such layer"),
            (nn.Sequential(nn.Linear(784, 10), nn.GELU()), "module[1] (GELU): the engine's GELU is the tanh form"),
            (nn.Sequential(nn.Linear(784, 10), nn.Sequential(nn.ReLU())), "module[1] (Sequential)"),
            (nn.Sequential(nn.Linear(784, 10), nn.LayerNorm(10, eps=1e-6)), "eps 1e-5"),
            (nn.Linear(784, 10), "export takes a torch.nn.Sequential"),
        ]
        for module, message in cases:
            with self.assertRaises(meshlearn.ExportError) as e:
                mt.export(module, x, util.tempdir("refuse"))
            self.assertIn(message, str(e.exception))
        with self.assertRaises(meshlearn.ExportError) as e:
            mt.model_spec(nn.Sequential(nn.Conv2d(1, 2, (3, 5)), nn.Flatten(), nn.Linear(2, 2)),
                          torch.zeros(1, 1, 8, 8))
        self.assertIn("module[0] (Conv2d): kernel_size (3, 5)", str(e.exception))
        with self.assertRaises(meshlearn.ExportError) as e:
            mt.model_spec(nn.Sequential(nn.Linear(4, 2)), torch.zeros(1, 1, 2, 2))
        self.assertIn("module[0] (Linear): its input has shape [1, 2, 2]", str(e.exception))

    def test_round_trip_of_the_weights(self):
        net = every_layer_kind()
        ex = mt.export(net, torch.zeros(1, 1, 28, 28), util.tempdir("export"))
        self.assertEqual(ex.model["input"], [1, 28, 28])
        self.assertEqual([l["kind"] for l in ex.model["layers"]],
                         ["conv2d", "relu", "maxpool2d", "conv2d", "gelu", "layernorm", "flatten",
                          "dropout", "linear", "relu", "linear"])
        other = every_layer_kind()
        for p in other.parameters():
            nn.init.zeros_(p)
        mt.load(other, ex.weights_path)
        for a, b in zip(net.state_dict().values(), other.state_dict().values()):
            self.assertTrue(torch.equal(a, b))
        with self.assertRaises(meshlearn.MeshlearnError) as e:
            mt.load(nn.Sequential(nn.Linear(784, 10)), ex.weights_path)
        self.assertIn("does not fit this module", str(e.exception))


@unittest.skipUnless(util.have_fashion(), "Fashion-MNIST not installed (dataset-fashion-mnist)")
class EngineTrainsTheExportTest(unittest.TestCase):
    def test_engine_model_evaluates_in_torch_to_the_reported_accuracy(self):
        net = every_layer_kind()
        ex = mt.export(net, torch.zeros(1, 1, 28, 28), util.tempdir("export"))
        d = util.tempdir("train")
        path = os.path.join(d, "tiny.toml")
        with open(path, "w") as f:
            f.write(util.tiny_task_text())
        task = meshlearn.load_task(path)
        task["model"] = ex.model
        task["train"]["steps"] = 40
        out = os.path.join(d, "out")
        with tasks.task_file(task) as f:
            report, _, _ = util.cli(d, "train", f.path, "--out", out)
        self.assertGreater(report["test_accuracy"], 0.3)  # it learned something in 40 steps
        meta = mt.load(net, os.path.join(out, "model.safetensors"))
        self.assertEqual(meta["format"], "meshlearn.model.v1")
        got = mt.evaluate(net, task)
        self.assertEqual(got["samples"], report["test_samples"])
        # Same weights, same data, float32 both: the predictions agree but for near ties.
        self.assertLessEqual(abs(got["accuracy"] - report["test_accuracy"]), 2 / got["samples"],
                             (got, report))
        self.assertAlmostEqual(got["loss"], report["test_loss"], delta=1e-4)

    def test_the_engine_starts_from_the_exported_weights(self):
        # data.init_weights of a task dict is relative to the working directory (a dict's paths
        # are made absolute there before the binary sees them: docs/paths.md, docs/python.md).
        net = every_layer_kind()
        d = util.tempdir("init")
        ex = mt.export(net, torch.zeros(1, 1, 28, 28), os.path.join(d, "export"))
        path = os.path.join(d, "tiny.toml")
        with open(path, "w") as f:
            f.write(util.tiny_task_text())
        task = meshlearn.load_task(path)
        task["model"] = ex.model
        task["data"]["init_weights"] = os.path.join("export", "init.safetensors")
        cwd = os.getcwd()
        os.chdir(d)
        try:
            with tasks.task_file(task) as f:
                report, _, _ = util.cli(d, "train", f.path, "--steps", "0", "--out", "zero")
        finally:
            os.chdir(cwd)
        # 0 steps: the engine's model is the export, bit for bit, and evaluates as PyTorch does.
        got, _ = safetensors.read(os.path.join(d, "zero", "model.safetensors"))
        sent, _ = safetensors.read(ex.weights_path)
        self.assertEqual({k: v[2] for k, v in got.items()}, {k: v[2] for k, v in sent.items()})
        mine = mt.evaluate(net, task)
        print("\nexported CNN, untrained: engine loss %.6f accuracy %.4f, PyTorch %.6f %.4f" %
              (report["test_loss"], report["test_accuracy"], mine["loss"], mine["accuracy"]))
        self.assertAlmostEqual(mine["loss"], report["test_loss"], delta=1e-4)
        self.assertLessEqual(abs(mine["accuracy"] - report["test_accuracy"]), 2 / mine["samples"])
        # The engine refuses weights of another module, naming the tensor.
        other = mt.export(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), torch.zeros(1, 784),
                          os.path.join(d, "other"))
        task["data"]["init_weights"] = other.weights_path
        with tasks.task_file(task) as f:
            out, rc, err = util.cli(d, "train", f.path, "--steps", "0", "--out",
                                    os.path.join(d, "bad"), check=False)
        self.assertNotEqual(rc, 0)
        self.assertIn("data.init_weights: " + other.weights_path + ": no tensor 'layers.0.weight'",
                      out["error"]["message"] if isinstance(out, dict) else err)


if __name__ == "__main__":
    unittest.main()

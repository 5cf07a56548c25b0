"""A task given as a TOML path or as a Python dict, turned into the file the binary reads.

A dict is written as TOML (a small writer: tables, arrays of tables, arrays, strings, integers,
floats, booleans) into a temporary folder. Its relative [data] paths are made absolute against the
working directory first: in a dict they were written by Python code, and a relative path in Python
means the working directory (docs/paths.md gives a file's relative paths its own folder, which for
a temporary file would mean nothing). The file is validated by the binary, the ledger's own checks
(`task submit --dry-run`); errors about the temporary file name it "task (dict)".
"""

import contextlib
import math
import os
import re
import shutil
import tempfile

from .errors import TaskError

# engine/src/train.cc ParseData: the [data] keys that are paths.
DATA_PATH_KEYS = ("train_images", "train_labels", "test_images", "test_labels", "train_x",
                  "train_y", "test_x", "test_y", "path", "root", "files", "train", "val",
                  "init_weights")

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k):
    return k if _BARE.match(k) else _string(k)


def _string(s):
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif c < 0x20 or c == 0x7F:
            out.append("\\u%04x" % c)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _scalar(v, where):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise TaskError("task (dict): %s = %r: TOML task files take finite numbers" %
                            (where, v))
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x, "%s[%d]" % (where, i)) for i, x in enumerate(v)) + "]"
    raise TaskError("task (dict): %s: a %s cannot be written to a task file (use str, int, "
                    "float, bool, list or dict)" % (where, type(v).__name__))


def _is_table_array(v):
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _write_table(lines, path, table):
    where = ".".join(path)
    plain, sub = [], []
    for k, v in table.items():
        if not isinstance(k, str) or not k:
            raise TaskError("task (dict): %s: keys must be non-empty strings, got %r" %
                            (where or "top level", k))
        full = (where + "." if where else "") + k
        if isinstance(v, dict) or _is_table_array(v):
            sub.append((k, v))
        else:
            if v is None:
                raise TaskError("task (dict): %s is None; leave the key out instead" % full)
            if isinstance(v, (list, tuple)) and any(isinstance(x, dict) for x in v):
                raise TaskError("task (dict): %s mixes tables and values" % full)
            plain.append("%s = %s" % (_key(k), _scalar(v, full)))
    if plain:
        if path:
            lines.append("[%s]" % ".".join(_key(p) for p in path))
        lines.extend(plain)
        lines.append("")
    for k, v in sub:
        if isinstance(v, dict):
            _write_table(lines, path + [k], v)
        else:
            for item in v:
                lines.append("[[%s]]" % ".".join(_key(p) for p in path + [k]))
                for ik, iv in item.items():
                    full = "%s.%s.%s" % (where, k, ik) if where else "%s.%s" % (k, ik)
                    if isinstance(iv, dict) or _is_table_array(iv):
                        raise TaskError("task (dict): %s: nested tables inside an array of "
                                        "tables are not used by task files" % full)
                    if iv is None:
                        raise TaskError("task (dict): %s is None; leave the key out instead" %
                                        full)
                    lines.append("%s = %s" % (_key(ik), _scalar(iv, full)))
                lines.append("")


def to_toml(task):
    """TOML text of a task dict ({"task": {...}, "data": {...}, "model": {...}, ...})."""
    if not isinstance(task, dict):
        raise TaskError("a task is a TOML file path or a dict, got %s" % type(task).__name__)
    lines = []
    _write_table(lines, [], task)
    return "\n".join(lines).rstrip("\n") + "\n"


def absolutize_data_paths(task):
    """A copy of the task dict with its relative [data] paths made absolute (working dir)."""
    out = dict(task)
    data = task.get("data")
    if isinstance(data, dict):
        data = dict(data)
        for k in DATA_PATH_KEYS:
            v = data.get(k)
            if isinstance(v, str) and v and not v.startswith("blob:"):
                data[k] = os.path.abspath(os.path.expanduser(v))
        out["data"] = data
    return out


class TaskFile:
    """The path of a task file for the binary, and the name errors should give it."""

    def __init__(self, path, label):
        self.path = path
        self.label = label

    def explain(self, message):
        """`message` with the temporary file's path replaced by the task's label."""
        return message.replace(self.path, self.label) if self.label != self.path else message


@contextlib.contextmanager
def task_file(task):
    """Yields a TaskFile for a path (str / os.PathLike) or a dict (written to a temp file)."""
    if isinstance(task, (str, os.PathLike)):
        path = os.path.abspath(os.path.expanduser(os.fspath(task)))
        if not os.path.isfile(path):
            raise TaskError("task file %s does not exist (a relative path is relative to the "
                            "working directory %s)" % (os.fspath(task), os.getcwd()))
        yield TaskFile(path, os.fspath(task))
        return
    if not isinstance(task, dict):
        raise TaskError("a task is a TOML file path or a dict, got %s" % type(task).__name__)
    text = to_toml(absolutize_data_paths(task))
    d = tempfile.mkdtemp(prefix="meshlearn-task-")
    try:
        path = os.path.join(d, "task.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        yield TaskFile(path, "task (dict)")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def load(path):
    """A task file as a dict (tomllib), e.g. to change a key and submit the dict."""
    import tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise TaskError("%s: %s" % (path, e.strerror)) from None
    except tomllib.TOMLDecodeError as e:
        raise TaskError("%s: not valid TOML: %s" % (path, e)) from None

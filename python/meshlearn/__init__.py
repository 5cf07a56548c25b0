"""meshlearn from Python: keys, wallet, tasks (quote, submit, watch, fetch, audit) and
PyTorch export (meshlearn.torch). See docs/python.md."""

from .client import Client, RoundProgress, progress_of
from .errors import (CliError, ExportError, KeyFileError, MeshlearnError, RpcError, TaskError,
                     TransactionRejected, WrongPassphrase)
from .keys import Key, list_keys, load_key
from .rpc import Rpc
from .tasks import load as load_task, to_toml

__all__ = ["Client", "RoundProgress", "progress_of", "CliError", "ExportError", "KeyFileError",
           "MeshlearnError", "RpcError", "TaskError", "TransactionRejected", "WrongPassphrase",
           "Key", "list_keys", "load_key", "Rpc", "load_task", "to_toml"]

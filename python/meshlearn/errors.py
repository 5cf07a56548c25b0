"""Exceptions of the meshlearn Python client.

Every error says which input it is about (a key file, a task file's key, an RPC method and the
server's own message, a command line of the `meshlearn` binary) and, where there is one, the fix.
"""


class MeshlearnError(Exception):
    """Base class of every error this package raises."""


class KeyFileError(MeshlearnError):
    """A key is missing, unreadable, corrupt, too open, or its passphrase is wrong."""


class WrongPassphrase(KeyFileError):
    """The key file is intact but the passphrase does not decrypt it."""


class TaskError(MeshlearnError):
    """A task (TOML file or dict) is not valid, or the ledger refused it."""


class RpcError(MeshlearnError):
    """The ledger's JSON-RPC answered an error, or could not be reached.

    `code` is the JSON-RPC error code (None when the ledger was unreachable or answered
    something that is not JSON-RPC), `status` the server's status name (e.g. "NotFound").
    """

    def __init__(self, message, code=None, status=None, method=None, url=None):
        super().__init__(message)
        self.code = code
        self.status = status
        self.method = method
        self.url = url


class TransactionRejected(MeshlearnError):
    """A transaction was refused by the ledger or failed when executed (its receipt says why)."""

    def __init__(self, message, receipt=None, tx_id=None):
        super().__init__(message)
        self.receipt = receipt
        self.tx_id = tx_id


class CliError(MeshlearnError):
    """The `meshlearn` binary failed; `code` is the binary's error code (e.g. "InvalidArgument")."""

    def __init__(self, message, code=None, argv=None):
        super().__init__(message)
        self.code = code
        self.argv = argv


class ExportError(MeshlearnError):
    """A PyTorch module cannot be exported to the engine (an unsupported layer or setting)."""

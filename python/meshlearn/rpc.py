"""The ledger's JSON-RPC API (ledger/src/rpc.cc) over HTTP POST, with the standard library.

    rpc = Rpc("http://127.0.0.1:7700")
    rpc.call("chain_status")
    rpc.call("get_task", id=TASK_ID, units=True)

An error answer raises RpcError with the server's message, its JSON-RPC code and status name.
"""

import json
import os
import socket
import urllib.error
import urllib.request

from .errors import RpcError

DEFAULT_RPC = "http://127.0.0.1:7700"


def default_url(url=None):
    """`url`, else $MESHLEARN_RPC, else http://127.0.0.1:7700 (as the CLI's --rpc)."""
    return url or os.environ.get("MESHLEARN_RPC") or DEFAULT_RPC


class Rpc:
    def __init__(self, url=None, timeout=30.0):
        self.url = default_url(url)
        if not self.url.startswith("http://"):
            raise RpcError("RPC URL %r is not http://HOST:PORT" % (self.url,), url=self.url)
        self.timeout = timeout
        self._next_id = 1

    def call(self, method, _timeout=None, **params):
        """The `result` of `method`; RpcError on an error answer or an unreachable ledger.
        `_timeout` (seconds) overrides the HTTP timeout (long polls)."""
        rid = self._next_id
        self._next_id += 1
        body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                           "params": params}).encode("utf-8")
        req = urllib.request.Request(self.url, data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=_timeout or self.timeout) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            text = e.read()  # JSON-RPC errors may come with an HTTP error status
            if not text:
                raise RpcError("%s: the ledger at %s answered HTTP %d" % (method, self.url, e.code),
                               method=method, url=self.url) from None
        except (urllib.error.URLError, socket.timeout, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            raise RpcError("%s: cannot reach the ledger at %s: %s (start it, or pass the right "
                           "rpc URL / $MESHLEARN_RPC)" % (method, self.url, reason),
                           status="Unavailable", method=method, url=self.url) from None
        try:
            answer = json.loads(text)
        except ValueError:
            raise RpcError("%s: the ledger at %s answered something that is not JSON" %
                           (method, self.url), method=method, url=self.url) from None
        if not isinstance(answer, dict):
            raise RpcError("%s: the ledger at %s answered a malformed response" %
                           (method, self.url), method=method, url=self.url)
        err = answer.get("error")
        if err is not None:
            msg = err.get("message", "no message") if isinstance(err, dict) else str(err)
            data = err.get("data") if isinstance(err, dict) else None
            raise RpcError("%s: %s" % (method, msg) if not msg.startswith(method) else msg,
                           code=err.get("code") if isinstance(err, dict) else None,
                           status=data.get("status") if isinstance(data, dict) else None,
                           method=method, url=self.url)
        if "result" not in answer:
            raise RpcError("%s: the ledger at %s answered without a result" % (method, self.url),
                           method=method, url=self.url)
        return answer["result"]

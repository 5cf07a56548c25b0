"""The ledger's JSON-RPC API (ledger/src/rpc.cc) over HTTP POST, with the standard library.

    rpc = Rpc("http://127.0.0.1:7700")
    rpc.call("chain_status")
    rpc.call("get_task", id=TASK_ID, units=True)

An error answer raises RpcError with the server's message, its JSON-RPC code and status name.

Failover, as the CLI's RpcClient (ledger/include/meshlearn/ledger/rpc_client.h): the URL may list
several endpoints, comma-separated ("http://a:7700,http://b:7700": the candidates of a
replicated sequencer, docs/operators.md "Running a replicated chain"). A call goes to the endpoint
that answered last; one that cannot be reached, answers HTTP 429 or 503 without a JSON-RPC
answer, or answers an error with status Unavailable (a standby candidate refusing a transaction,
one still catching up with etcd, an election under way) is left for the next, round the list.
After a whole round failed the call waits (0.2 s, doubling) and goes round again, `rounds` times
in all (3 with several endpoints; 1 with one, which is asked once as it always was); then the
last error is raised. Every method is idempotent (a transaction is identified by its hash and
nonce), so asking another endpoint never pays twice.
"""

import json
import os
import socket
import time
import urllib.error
import urllib.request

from .errors import RpcError

DEFAULT_RPC = "http://127.0.0.1:7700"


def default_url(url=None):
    """`url`, else $MESHLEARN_RPC, else http://127.0.0.1:7700 (as the CLI's --rpc). Either may
    be a comma-separated list of endpoints."""
    return url or os.environ.get("MESHLEARN_RPC") or DEFAULT_RPC


class _Elsewhere(Exception):
    """An endpoint that may not answer now but another (or a later try) may: wraps the error."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


class Rpc:
    def __init__(self, url=None, timeout=30.0, rounds=None, backoff=0.2):
        # Every endpoint, as given (for the `meshlearn` binary's --rpc); `url` is the one in use.
        self.url_list = default_url(url)
        self.urls = [u.strip() for u in self.url_list.split(",")]
        for u in self.urls:
            if not u.startswith("http://"):
                raise RpcError("RPC URL %r%s is not http://HOST:PORT" %
                               (u, "" if len(self.urls) == 1 else " (in %r)" % self.url_list),
                               url=self.url_list)
        self.timeout = timeout
        self.rounds = rounds or (3 if len(self.urls) > 1 else 1)
        self.backoff = backoff
        self._current = 0
        self._next_id = 1

    @property
    def url(self):
        """The endpoint in use (the one that answered last)."""
        return self.urls[self._current]

    def call(self, method, _timeout=None, **params):
        """The `result` of `method`; RpcError on an error answer or an unreachable ledger.
        `_timeout` (seconds) overrides the HTTP timeout (long polls)."""
        rid = self._next_id
        self._next_id += 1
        body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                           "params": params}).encode("utf-8")
        last = None
        delay = self.backoff
        for attempt in range(self.rounds):
            start = self._current
            for k in range(len(self.urls)):
                i = (start + k) % len(self.urls)
                try:
                    result = self._call_on(self.urls[i], method, body, _timeout)
                except _Elsewhere as e:
                    last = e.error
                    continue
                self._current = i
                return result
            if attempt + 1 < self.rounds:
                time.sleep(delay)
                delay *= 2
        if len(self.urls) > 1:
            raise RpcError("%s (every endpoint of %s was tried, %d round(s))" %
                           (last, self.url_list, self.rounds), code=last.code,
                           status=last.status, method=method, url=self.url_list)
        raise last

    def _call_on(self, url, method, body, timeout):
        """One call on one endpoint: the result, RpcError, or _Elsewhere."""
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            text = e.read()  # JSON-RPC errors may come with an HTTP error status
            if not text or (e.code in (429, 503) and not text.lstrip().startswith(b"{")):
                err = RpcError("%s: the ledger at %s answered HTTP %d" % (method, url, e.code),
                               status="Unavailable" if e.code in (429, 503) else None,
                               method=method, url=url)
                if e.code in (429, 503):
                    raise _Elsewhere(err) from None
                raise err from None
        except (urllib.error.URLError, socket.timeout, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            raise _Elsewhere(RpcError(
                "%s: cannot reach the ledger at %s: %s (start it, or pass the right "
                "rpc URL / $MESHLEARN_RPC)" % (method, url, reason),
                status="Unavailable", method=method, url=url)) from None
        try:
            answer = json.loads(text)
        except ValueError:
            raise RpcError("%s: the ledger at %s answered something that is not JSON" %
                           (method, url), method=method, url=url) from None
        if not isinstance(answer, dict):
            raise RpcError("%s: the ledger at %s answered a malformed response" %
                           (method, url), method=method, url=url)
        err = answer.get("error")
        if err is not None:
            msg = err.get("message", "no message") if isinstance(err, dict) else str(err)
            data = err.get("data") if isinstance(err, dict) else None
            e = RpcError("%s: %s" % (method, msg) if not msg.startswith(method) else msg,
                         code=err.get("code") if isinstance(err, dict) else None,
                         status=data.get("status") if isinstance(data, dict) else None,
                         method=method, url=url)
            if e.status == "Unavailable":
                raise _Elsewhere(e)
            raise e
        if "result" not in answer:
            raise RpcError("%s: the ledger at %s answered without a result" % (method, url),
                           method=method, url=url)
        return answer["result"]

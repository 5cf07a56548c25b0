"""Signed transactions, encoded as ledger/include/meshlearn/ledger/tx.h encodes them.

    u8 version(=1) | string chain_id | pubkey sender | u64 nonce | u64 fee | u16 type tag |
    payload fields in Visit order | signature

The sender signs SigningBytes: the raw domain tag "meshlearn.tx.v1" and everything before the
signature. The id is BLAKE2b over the whole encoding under the domain "meshlearn.txid.v1".

Python builds only the payloads a wallet sends (Transfer, Faucet); everything else goes through
the `meshlearn` binary. python/tests/test_devnet.py pins this encoding to the C++ one: the
transaction `meshlearn wallet transfer` sent is rebuilt here from its fields and must have the
same signature and id, bit for bit.
"""

from .encoding import Encoder, blake2b_domain
from .errors import MeshlearnError

TX_VERSION = 1
_DOMAIN = b"meshlearn.tx.v1"
_ID_DOMAIN = "meshlearn.txid.v1"
MAX_MEMO = 1024  # ledger kMaxStringFieldLength

# ledger/include/meshlearn/ledger/tx_types.h: the wire tags.
TRANSFER = 1
FAUCET = 2


def _pubkey(v, what):
    if isinstance(v, (bytes, bytearray)) and len(v) == 32:
        return bytes(v)
    if isinstance(v, str) and len(v) == 64:
        try:
            return bytes.fromhex(v)
        except ValueError:
            pass
    raise MeshlearnError("%s: expected a public key (64 hex digits), got %r" % (what, v))


def _amount(v, what):
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
        raise MeshlearnError("%s: expected a whole number of tokens 0..2^64-1, got %r" % (what, v))
    return v


def transfer_payload(to, amount, memo=""):
    memo_b = memo.encode("utf-8")
    if len(memo_b) > MAX_MEMO:
        raise MeshlearnError("memo: %d bytes, the most is %d" % (len(memo_b), MAX_MEMO))
    e = Encoder().raw(_pubkey(to, "to")).u64(_amount(amount, "amount")).bytes_(memo_b)
    return TRANSFER, e.take()


def faucet_payload(recipient, amount):
    e = Encoder().raw(_pubkey(recipient, "recipient")).u64(_amount(amount, "amount"))
    return FAUCET, e.take()


class SignedTx:
    """A signed transaction: `wire` (what send_tx takes, as hex), `id` (hex), `signature`."""

    def __init__(self, wire, signature):
        self.wire = wire
        self.signature = signature
        self.id = blake2b_domain(_ID_DOMAIN, wire).hex()

    @property
    def hex(self):
        return self.wire.hex()


def sign(key, chain_id, nonce, payload, fee=0):
    """Builds and signs a transaction (ledger BuildSignedTx). `payload` is (tag, bytes) from
    transfer_payload / faucet_payload; `key` a keys.Key."""
    tag, body = payload
    cid = chain_id.encode("utf-8")
    if not 0 < len(cid) <= 64:
        raise MeshlearnError("chain id %r: 1-64 bytes" % (chain_id,))
    e = Encoder().u8(TX_VERSION).bytes_(cid).raw(key.public_key).u64(nonce)
    e.u64(_amount(fee, "fee")).u16(tag).raw(body)
    unsigned = e.take()
    sig = key.sign(_DOMAIN + unsigned)
    return SignedTx(unsigned + sig, sig)

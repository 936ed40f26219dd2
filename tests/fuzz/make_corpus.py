"""Write the seed corpus of every fuzz target from honest traffic and records.

    python tests/fuzz/make_corpus.py

Runs a small cluster on the simulated network (virtual time), records the
bodies of the requests and replies its nodes exchange, and writes them with
frames, events, handshakes and stored records to ``corpus/<target>/``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import trio
import trio.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import targets

from ketten import Event, Identity, criterion_key
from ketten._core.leases import CursorState, Lease, LeaseTable
from ketten._core.membership import ChainState
from ketten._node.rpc import Rpc
from ketten.adapters._framing import (
    Message,
    Reply,
    Request,
    encode_body,
    encode_frame,
)
from ketten.adapters._tcp_handshake import Handshake, NetworkParams
from ketten.plugins.file_store import _format as file_format
from ketten.testing import deterministic, open_cluster
from ketten.wire import dumps, encode_message

HERE = Path(__file__).parent / "corpus"


def save(target: str, data: bytes) -> None:
    folder = HERE / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha256(data).hexdigest()[:16]).write_bytes(data)


def traffic() -> list[tuple[str, Any, Any]]:
    """``(service, request body, reply body)`` of a short run."""
    seen: list[tuple[str, Any, Any]] = []
    call_raw = Rpc.call_raw

    async def recording(self: Rpc, address: str, service: str, body: Any, **kw: Any) -> Any:
        peer, reply = await call_raw(self, address, service, body, **kw)
        seen.append((service, body, reply))
        return peer, reply

    async def main() -> None:
        Rpc.call_raw = recording  # type: ignore[method-assign]
        try:
            async with open_cluster(4, settle=2.0) as c:
                key = criterion_key("corpus")
                for i in range(5):
                    await c.nodes[i % 4].publish(key, b"event %d" % i, command=i)
                await c.nodes[3].read(key)
                await trio.sleep(3.0)
        finally:
            Rpc.call_raw = call_raw  # type: ignore[method-assign]

    deterministic(lambda: trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)))
    return seen


def main() -> None:
    author = Identity.from_seed(b"\x07" * 32)
    key = criterion_key("corpus")
    genesis = Event.create(author, criterion=key, seq=0, prev=None, payload=b"first",
                           time=1, writers=[author.public_key])
    second = Event.create(author, criterion=key, seq=1, prev=genesis.hash, payload=b"x" * 40,
                          time=2, command=7, clock=dumps({"l": 3}))
    for event in (genesis, second):
        save("event", event.to_bytes())
        save("cbor", event.to_bytes())

    by_class = {cls: i for i, cls in enumerate(targets._MESSAGE_TYPES)}
    services = {cls.SERVICE: cls for cls in targets._MESSAGE_TYPES if hasattr(cls, "SERVICE")}
    kept: dict[str, int] = {}
    for service, body, reply in traffic():
        if kept.get(service, 0) >= 6:
            continue
        kept[service] = kept.get(service, 0) + 1
        save("cbor", dumps(body))
        save("frames", encode_frame(Request(kept[service], encode_message(service, body))))
        save("frames", encode_frame(Reply(kept[service], encode_message(service, reply))))
        request_type = services.get(service)
        if request_type is not None:
            save("message", bytes([by_class[request_type]]) + dumps(body))
            save("message", bytes([by_class[request_type.Reply]]) + dumps(reply))
            save("message", bytes([128 + by_class[request_type]])
                 + encode_message(service, body))
    save("frames", encode_frame(Message(encode_message("elect", {"c": key}))))

    # The target plays the responder with a zero nonce: the initiator's auth must
    # sign the responder's hello as the target builds it.
    a = Handshake(Identity.from_seed(b"\x01" * 32), NetworkParams(), "127.0.0.1:1", True,
                  bytes(32))
    b = Handshake(targets._HANDSHAKE_ID, NetworkParams(), "127.0.0.1:1", False, bytes(32))
    auth = a.receive_hello(b.hello(), encode_body(b.hello()))
    hello = encode_body(a.hello())
    save("handshake", len(hello).to_bytes(2, "big") + hello + encode_body(auth))
    save("frames", encode_frame(a.hello()) + encode_frame(auth))

    save("stored_state", b"s" + ChainState().encode())
    table = LeaseTable()
    table.put(key, Lease(secrets.token_bytes(16), author.public_key, "n:1", 1, 10**6), 0)
    save("stored_state", b"l" + table.encode())
    save("stored_state", b"c" + CursorState.fresh([key]).advance(key, 0, genesis.hash).encode())

    segment = (file_format.frame(file_format.EVENT, genesis.to_bytes())
               + file_format.frame(file_format.COMMIT, file_format.COMMIT_BODY.pack(1)))
    save("file_records", b"s" + segment)
    save("file_records", b"c" + file_format.encode_cursor("ketten/x", b"value"))
    save("file_records", b"q" + file_format.encode_spans({(1, 0): 40}))
    for name in targets.TARGETS:
        print(f"{name}: {len(list((HERE / name).iterdir()))} inputs")


if __name__ == "__main__":
    main()

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
from ketten._core.car import car_header, car_section
from ketten._core.chain_car import chain_blocks
from ketten._core.ipld import cid_from_bytes
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
from ketten.interfaces import Peer
from ketten.plugins.file_store import _format as file_format
from ketten.plugins.gosskip import _messages as gosskip
from ketten.plugins.gosskip._names import Contact as RingContact
from ketten.plugins.gosskip._ring import Answer
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


def plugin_bodies(service: str, body: Any, reply: Any) -> None:
    """Seeds for the plugin targets from one recorded request and its reply."""
    if service == "kad":
        save("kad", b"\x00" + dumps(body))
        if isinstance(reply, dict) and "nodes" in reply:
            save("kad", _KAD_ANSWER + dumps(reply))
    elif service == "static":
        save("static_hello", b"\x00" + dumps(body))
        if isinstance(reply, dict):
            save("static_hello", b"\x01" + dumps(reply.get("known")))
    elif service == "sub":
        save("subscription", dumps(body))


_KAD_ANSWER = bytes([51])
"""Odd, and a multiple of three: a find answer for 25 contacts, no id puzzle."""


def plugin_seeds(author: Identity, key: bytes) -> None:
    """Honest bodies of the plugin services, whatever the recorded run used."""
    peers = [Peer(f"127.0.0.1:{4000 + i}", Identity.from_seed(bytes([i + 40]) * 32).public_key)
             for i in range(6)]
    for body in ({"op": "ping"}, {"op": "ping", "client": True},
                 {"op": "find", "target": key}, {"op": "find", "target": key, "count": 40},
                 {"op": "find", "target": key, "client": True}):
        save("kad", b"\x00" + dumps(body))
    answer = targets._served(targets._KadServer()._serve(peers[0], {"op": "find", "target": key}))
    save("kad", _KAD_ANSWER + dumps(answer))
    save("kad", _KAD_ANSWER + dumps({"nodes": []}))

    known = [[p.address, p.public_key] for p in peers]
    save("static_hello", b"\x00" + dumps({"op": "hello", "r": 3, "known": known}))
    save("static_hello", b"\x00" + dumps({"op": "hello", "r": 3, "known": [], "adm": bytes(64)}))
    save("static_hello", b"\x01" + dumps(known))
    save("static_hello", b"\x00" + dumps({"op": "hello", "r": 3, "dg": bytes(16)}))
    save("static_hello", b"\x00" + dumps({"op": "hello", "r": 3, "known": known,
                                           "dg": bytes(range(16))}))

    ring = [RingContact(p, i << 40) for i, p in enumerate(peers)]
    save("gosskip_message", b"\x00" + dumps(gosskip.encode_gossip(2, 1 << 50, ring[:3])))
    save("gosskip_message", b"\x00" + dumps(gosskip.encode_find(key, 7)))
    save("gosskip_message", b"\x01" + dumps(gosskip.encode_answer(5, Answer(tuple(ring[:2]),
                                                                             ring[2]))))
    save("gosskip_message", b"\x01" + dumps(gosskip.encode_answer(5, Answer((), None))))
    save("gosskip_message", b"\x02" + dumps(gosskip.encode_found(9, ring[:2], ring[2:4],
                                                                  ring[4:])))

    sid = bytes(range(16))
    save("subscription", dumps({"op": "lease", "s": sid, "c": [key], "v": 1, "t": 30_000,
                                "live": True}))
    save("subscription", dumps({"op": "lease", "s": sid, "c": [], "v": 0, "t": 1,
                                "live": False}))
    lease = Lease(sid, author.public_key, "127.0.0.1:5", 3, 10**9 + 5_000, True)
    save("subscription", dumps({"op": "merge", "m": {key: [lease.encode()]}}))
    save("subscription", dumps({"op": "merge", "m": {}}))


def car_seeds(events: list[Event]) -> None:
    """The blocks of a chain and its CAR, whole and cut short; ipfs requests about it."""
    blocks = list(chain_blocks(events))
    for block in blocks:
        save("ipld_block", block.data)
    key, head = events[0].criterion, blocks[-1]
    for body in ({"op": "provide", "key": key}, {"op": "providers", "key": key},
                 {"op": "tip", "key": key}, {"op": "tip", "key": key, "seq": 1},
                 {"op": "put_head", "key": key, "cid": head.binary, "block": head.data},
                 {"op": "get_head", "key": key},
                 {"op": "have", "key": key, "root": head.binary, "seq": 1, "stride": 1,
                  "count": 8},
                 {"op": "want", "key": key, "root": head.binary, "seq": 1, "count": 8}):
        save("ipfs_request", dumps(body))
    car = car_header([cid_from_bytes(blocks[-1].binary)]) + b"".join(
        car_section(b.binary, b.data) for b in reversed(blocks))
    save("car", car)
    save("car", car[:-7])


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
    car_seeds([genesis, second])

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
        plugin_bodies(service, body, reply)
    save("frames", encode_frame(Message(encode_message("elect", {"c": key}))))
    plugin_seeds(author, key)

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
    frame, commit = file_format.frame, file_format.COMMIT_BODY.pack
    base = (frame(file_format.BASE, file_format.BASE_BODY.pack(0)) + frame(file_format.COMMIT, commit(1))
            + frame(file_format.EVENT, genesis.to_bytes())
            + frame(file_format.ORPHAN, genesis.to_bytes())
            + frame(file_format.MARK, file_format.MARK_BODY.pack(key, 1, 4))
            + frame(file_format.DROP, file_format.DROP_BODY.pack(key))
            + frame(file_format.COMMIT, commit(4)))
    save("file_records", b"s" + base)
    save("file_records", b"c" + file_format.encode_cursor("ketten/x", b"value"))
    save("file_records", b"q" + file_format.encode_spans({(1, 0): 40}))
    for name in targets.TARGETS:
        print(f"{name}: {len(list((HERE / name).iterdir()))} inputs")


if __name__ == "__main__":
    main()

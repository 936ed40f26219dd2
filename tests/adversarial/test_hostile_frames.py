"""Hostile CBOR on live nodes over loopback TCP.

* CBOR bombs - items that declare huge lengths, nest deeper than the decoder
  allows, carry integers beyond 64 bits, tags or indefinite lengths - as the
  whole envelope and as the body of every service a node serves, in requests
  and one-way messages: each ends one request (or one connection), is counted
  as a decode error, leaves no memory behind, and the node keeps publishing;
* offered events whose fields hold integers beyond the event format's range
  (signed by their author) are answered as malformed;
* a handshake that claims an address no transport could dial does not take
  the node down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import cbor2
import pluggy
import pytest
import trio
from hostile import HostilePeer, raw_connect, retained_memory

from ketten import Event, Identity, Node, criterion_key
from ketten._core import codec
from ketten._core.messages import Answer
from ketten.adapters._framing import Auth, Message, Refuse
from ketten.testing import open_cluster
from ketten.wire import decode_message

_HUGE = (2**64 - 1).to_bytes(8, "big")

BOMBS: dict[str, bytes] = {
    "array of 2^64-1 items": b"\x9b" + _HUGE,
    "map of 2^64-1 pairs": b"\xbb" + _HUGE,
    "byte string of 2^64-1 bytes": b"\x5b" + _HUGE + b"x",
    "text of 2^64-1 bytes": b"\x7b" + _HUGE + b"x",
    "array of 2^32-1 items, three present": b"\x9a\xff\xff\xff\xff\x00\x00\x00",
    "arrays of 2^32-1 nested": b"\x9a\xff\xff\xff\xff" * 40,
    "maps of 2^32-1 pairs nested": b"\xba\xff\xff\xff\xff\x61k" * 40,
    "arrays nested 100 deep": b"\x81" * 100 + b"\x80",
    "maps nested 100 deep": b"\xa1\x61k" * 100 + b"\xa0",
    "arrays nested 10,000 deep": b"\x81" * 10_000 + b"\x80",
    "unsigned 2^64-1": b"\x1b" + _HUGE,
    "negative -2^64": b"\x3b" + _HUGE,
    "bignum tag 2": b"\xc2\x58\x40" + b"\xff" * 64,
    "negative bignum tag 3": b"\xc3\x58\x40" + b"\xff" * 64,
    "bignum of 2^20 bytes declared": b"\xc2\x5a\x00\x10\x00\x00" + b"\xff" * 16,
    "shared reference cycle": b"\xd8\x1c\x81\xd8\x1d\x00",
    "self-describe tag": b"\xd9\xd9\xf7\xa0",
    "unknown tag": b"\xda\x12\x34\x56\x78\x00",
    "indefinite array": b"\x9f" + b"\x01" * 10 + b"\xff",
    "indefinite map": b"\xbf\x61k\x01\xff",
    "indefinite byte string": b"\x5f\x41a\x41b\xff",
    "indefinite arrays nested": b"\x9f" * 5000,
    "break alone": b"\xff",
    "reserved additional info": b"\x1c",
    "float16 NaN map key": b"\xa1\xf9\x7e\x00\x01",
    "array key in a map": b"\xa1\x80\x01",
    "duplicate map keys": b"\xa2\x61k\x01\x61k\x02",
    "truncated": b"\x82\x61",
}


def _envelope(service: str, body: bytes) -> bytes:
    """``[service, body]`` with ``body`` spliced in as it is."""
    return b"\x82" + codec.dumps(service) + body


async def _publish_within(node: Node, name: str, deadline: float = 10.0) -> None:
    with trio.fail_after(deadline + 2):
        await node.publish(criterion_key(name), b"honest", deadline=deadline)


async def test_cbor_bombs_end_one_request_and_leave_no_memory(
        plugins: pluggy.PluginManager) -> None:
    async with open_cluster(3, plugins=plugins, transport="tcp", overlay="static",
                            request_timeout=2.0, settle=1.0) as c:
        victim = c.nodes[0]
        await _publish_within(victim, "before the bombs")
        services = sorted(victim._rpc._services)  # every service the node registers
        one_way = sorted(victim._rpc._messages)
        assert {"offer", "append", "static", "sub"} <= set(services), services
        before = victim.statistics()
        hostile = HostilePeer(victim.address)
        outcomes: dict[str, int] = {}
        malformed = 0
        with retained_memory() as kept:
            for name, bomb in BOMBS.items():
                for data in (bomb, *(_envelope(s, bomb) for s in services)):
                    kind, _ = await hostile.request_raw(data, timeout=10.0)
                    assert kind in ("error", "closed"), (name, data[:20])
                    outcomes[kind] = outcomes.get(kind, 0) + 1
                    malformed += _fails_to_decode(data)
                client = await hostile._connected()
                for service in one_way:
                    await client.send(Message(_envelope(service, bomb)))
                await client.send(Message(bomb))
            # The connection still answers: the messages were dropped one by one.
            kind, _ = await hostile.request("no such service", {}, timeout=10.0)
            assert kind == "error"
        await hostile.aclose()
        # Nothing a bomb declares is allocated before the bytes are there, and
        # nothing of the flood stays.
        assert kept.peak < 32 << 20 and kept.bytes < 4 << 20, kept
        after = victim.statistics()
        assert malformed > len(BOMBS)
        assert after.decode_errors - before.decode_errors >= malformed, (before, after)
        assert after.internal_errors == 0, after
        assert outcomes.get("error", 0) > 0, outcomes
        for i, node in enumerate(c.nodes.values()):
            await _publish_within(node, f"after the bombs {i}")
        assert victim.statistics().internal_errors == 0


def _fails_to_decode(data: bytes) -> int:
    try:
        codec.loads(data, max_size=1 << 22, where="test")
    except Exception:
        return 1
    return 0


def _signed_event(author: Identity, fields: list[object]) -> bytes:
    """An event of these fields, signed by ``author``, whatever the fields hold."""
    signed = cbor2.dumps(fields, canonical=True)
    return b"\x8b" + signed[1:] + b"\x58\x40" + author.sign(signed)


@pytest.mark.parametrize(("name", "index", "value"), [
    ("time 2^64-1", 7, 2**64 - 1), ("time 2^63", 7, 2**63), ("seq 2^64-1", 2, 2**64 - 1),
    ("command -2^64", 5, -(2**64)), ("time a bignum", 7, 2**200), ("seq -1", 2, -1),
])
async def test_an_offered_event_with_a_huge_integer_is_malformed(
        plugins: pluggy.PluginManager, name: str, index: int, value: int) -> None:
    author = Identity.generate()
    async with open_cluster(3, plugins=plugins, transport="tcp", overlay="static",
                            request_timeout=2.0, settle=1.0) as c:
        key = criterion_key(f"huge {name}")
        node = c.nodes[0]
        await node.publish(key, b"genesis", deadline=10)
        head = (await node.read(key))[-1]
        honest = Event.create(author, criterion=key, seq=head.seq + 1, prev=head.hash,
                              payload=b"x", time=5)
        fields = list(cbor2.loads(honest.to_bytes())[:10])
        fields[index] = value
        if index == 2:
            fields[3] = head.hash
        bad = _signed_event(author, fields)
        before = [n.statistics() for n in c.nodes.values()]
        for broker in c.brokers(key):
            hostile = HostilePeer(c.nodes[broker].address)
            kind, reply = await hostile.request("offer", {"o": [{"e": bad}]}, timeout=10)
            if kind == "reply":
                answer = decode_message(reply)[1]["a"][0]
                assert answer["s"] == Answer.INVALID.value and answer["r"] == "malformed", reply
            else:
                assert kind == "error", kind
            await hostile.aclose()
        after = [n.statistics() for n in c.nodes.values()]
        assert sum(a.invalid_events + a.decode_errors for a in after) > sum(
            b.invalid_events + b.decode_errors for b in before)
        assert all(a.internal_errors == 0 for a in after), after
        await node.publish(key, b"after", deadline=10)
        assert [e.payload for e in await node.read(key)] == [b"genesis", b"after"]


@asynccontextmanager
async def _three(plugins: pluggy.PluginManager) -> AsyncIterator[list[Node]]:
    async with open_cluster(3, plugins=plugins, transport="tcp", overlay="static",
                            request_timeout=2.0, settle=1.0) as c:
        yield list(c.nodes.values())


@pytest.mark.parametrize("claimed", [
    "hôst.example:80", "xn--zz.example:80", "\u200b:1", "[::1:80", "127.0.0.1:99999",
    "127.0.0.1:-1", ":", "exa\x00mple:1", "\udcff:1", "ünïcode-ßtraße.de:443",
    "", "a" * 300 + ":80", "a" * 250 + ".example:80",
])
async def test_an_undialable_claimed_address_is_refused_or_ignored(
        plugins: pluggy.PluginManager, claimed: str) -> None:
    async with _three(plugins) as nodes:
        target = nodes[0]
        peer = HostilePeer(target.address, claimed=claimed)
        kind = "refused"
        try:
            kind, _ = await peer.request("static", {"op": "hello", "r": 3, "known": []},
                                         timeout=5)
        except (AssertionError, UnicodeError, ValueError):
            pass  # refused at the handshake, or this client could not even encode it
        assert kind in ("reply", "error", "closed", "refused")
        await peer.aclose()
        try:
            client, answer = await raw_connect(target.address, claimed=claimed)
            assert answer is None or isinstance(answer, Auth | Refuse), answer
            await trio.aclose_forcefully(client.stream)
        except (UnicodeError, ValueError):
            pass
        # Rounds of hellos to whatever was learned go on; the node serves and publishes.
        await trio.sleep(0.5)
        for i, node in enumerate(nodes):
            await _publish_within(node, f"after a claim of {claimed!r} {i}")
        assert target.overlay is not None
        assert claimed not in {p.address for p in target.overlay.live()}
        assert all(n.statistics().internal_errors == 0 for n in nodes)

"""Signatures of long received runs are checked on worker threads, with the same verdicts."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio

import ketten
from ketten import ConfigError, Event, Identity, NodeConfig, criterion_key
from ketten._core import event as event_module
from ketten._core.event import is_verified
from ketten._core.verified import VerifiedSignatures
from ketten._node.local_chains import LocalChains, _mark_verified
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import InvalidEvent, InvalidSignature, WriterNotAllowed
from ketten.plugins.memory_store import MemoryStore
from ketten.testing import open_cluster

WRITER = Identity.from_seed(b"\x31" * 32)
STRANGER = Identity.from_seed(b"\x32" * 32)
KEY = criterion_key("threads")


def chain(length: int, *, stranger_at: int | None = None,
          forged_at: int | None = None) -> list[bytes]:
    """Encoded events of a chain only WRITER may write to; ``stranger_at`` is written
    by another author, ``forged_at`` carries a signature over other bytes."""
    out: list[Event] = []
    for seq in range(length):
        identity = STRANGER if seq == stranger_at else WRITER
        event = Event.create(identity, criterion=KEY, seq=seq,
                             prev=out[-1].hash if out else None, payload=b"%d" % seq,
                             time=seq, writers=[WRITER.public_key] if seq == 0 else None)
        if seq == forged_at:
            other = Event.create(identity, criterion=KEY, seq=seq, prev=event.prev,
                                 payload=b"other", time=seq)
            event = attrs.evolve(event, sig=other.sig)
        out.append(event)
    return [e.to_bytes() for e in out]


async def outcome(threads: int, raws: list[bytes]) -> str:
    """What ``verify_run`` says of the run (decoded afresh: nothing checked yet)."""
    store = MemoryStore()
    await store.open()
    chains = LocalChains(store, 1 << 16, verify_threads=threads)
    events = [Event.from_bytes(raw) for raw in raws]
    try:
        await chains.verify_run(KEY, None, events)
    except InvalidEvent as exc:
        return f"{type(exc).__name__}: {exc}"
    return "valid"


@pytest.fixture
def handed_over(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the runs handed to worker threads."""
    sizes: list[int] = []
    run_sync = trio.to_thread.run_sync

    async def counting(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if fn is _mark_verified:
            sizes.append(len(args[0]))
        return await run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counting)
    return sizes


@pytest.mark.parametrize("damage", [
    {}, {"forged_at": 150}, {"stranger_at": 90}, {"stranger_at": 170, "forged_at": 40},
    {"forged_at": 0},
])
async def test_a_long_run_gets_the_same_verdict_on_threads(
        damage: dict[str, int], handed_over: list[int]) -> None:
    raws = chain(200, **damage)
    alone = await outcome(0, raws)
    assert handed_over == []
    threaded = await outcome(2, raws)
    assert threaded == alone
    assert sorted(handed_over) == [100, 100], "two threads, half the run each"
    if "forged_at" in damage:
        assert alone.startswith(InvalidSignature.__name__)
        assert f"seq {damage['forged_at']} " in alone
    elif "stranger_at" in damage:
        assert alone.startswith(WriterNotAllowed.__name__)
        assert f"seq {damage['stranger_at']}:" in alone
    else:
        assert alone == "valid"


async def test_a_short_run_is_checked_on_the_event_loop(handed_over: list[int]) -> None:
    assert await outcome(4, chain(63, forged_at=62)) == await outcome(0, chain(63, forged_at=62))
    assert await outcome(4, chain(63)) == "valid"
    assert handed_over == []
    assert await outcome(4, chain(64)) == "valid"
    assert sorted(handed_over) == [32, 32], "no thread gets less than half a short run"


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The signatures checked by Ed25519, in order."""
    calls: list[bytes] = []
    real = event_module.verify_signature

    def counting(author: bytes, sig: bytes, signed: bytes) -> bool:
        calls.append(sig)
        return real(author, sig, signed)

    monkeypatch.setattr(event_module, "verify_signature", counting)
    return calls


def test_a_signature_that_verified_is_not_checked_again_on_the_same_event(
        checked: list[bytes]) -> None:
    calls = checked
    good, forged = (Event.from_bytes(raw) for raw in chain(2, forged_at=1))
    good.verify()
    good.verify()
    assert len(calls) == 1
    for _ in range(2):
        with pytest.raises(InvalidSignature):
            forged.verify()
    assert len(calls) == 3, "a bad signature is checked every time"
    again = Event.from_bytes(good.to_bytes())
    again.verify()
    assert len(calls) == 4, "a new object of the same bytes is checked afresh"


@pytest.mark.parametrize("threads", [0, 2])
async def test_a_run_received_again_is_not_checked_twice_but_a_forgery_of_it_is(
        threads: int, checked: list[bytes], handed_over: list[int]) -> None:
    store = MemoryStore()
    await store.open()
    chains = LocalChains(store, 1 << 16, verify_threads=threads)
    raws = chain(100)
    await chains.verify_run(KEY, None, [Event.from_bytes(raw) for raw in raws])
    assert len(checked) == 100
    await chains.verify_run(KEY, None, [Event.from_bytes(raw) for raw in raws])
    assert len(checked) == 100, "the same bytes decoded again: no second check"
    assert chains.statistics().signatures_recalled == 100
    assert sum(handed_over) == (100 if threads else 0), "no thread for what was recalled"

    # The same fields under another signature hash differently: checked, and refused.
    forged = [Event.from_bytes(raw) for raw in chain(100, forged_at=70)]
    with pytest.raises(InvalidSignature, match="seq 70 "):
        await chains.verify_run(KEY, None, forged)
    assert checked[100:] == [forged[70].sig]
    with pytest.raises(InvalidSignature, match="seq 70 "):
        await chains.verify_run(KEY, None, [Event.from_bytes(e.to_bytes()) for e in forged])
    assert checked[101:] == [forged[70].sig], "a signature that failed is never remembered"


def test_the_memory_of_verified_signatures_is_bounded_and_holds_only_verified_ones() -> None:
    memory = VerifiedSignatures(capacity=10)
    events = [Event.from_bytes(raw) for raw in chain(30)]
    memory.remember(events)
    assert len(memory) == 0, "nothing verified yet"
    for event in events:
        event.verify()
    memory.remember(events)
    assert len(memory) == 10
    again = [Event.from_bytes(e.to_bytes()) for e in events]
    assert memory.recall(again) == 10
    assert [is_verified(e) for e in again] == [False] * 20 + [True] * 10, "oldest forgotten"


@pytest.mark.parametrize("value", [-1, 65, 2.0, "2", True])
async def test_a_bad_verify_threads_option_is_refused(value: Any) -> None:
    config = NodeConfig(replication=1, options={
        "replication": {"verify_threads": value},
        "transport": {"network": MemoryNetwork(seed=1), "address": "n:0"}})
    with pytest.raises(ConfigError, match="'verify_threads' must be an integer from 0 to 64"):
        async with ketten.open_node(config):
            pass


async def read_by_a_reader(**cluster: Any) -> list[Event]:
    async with open_cluster(2, replication=1, settle=1.0, **cluster) as c:
        broker = c.brokers(KEY)[0]
        for n in range(100):
            await c.nodes[broker].publish(KEY, b"%d" % n)
        return await c.nodes[1 - broker].read(KEY, deadline=30.0)


async def test_a_node_on_a_real_network_checks_long_runs_on_threads(
        handed_over: list[int]) -> None:
    got = await read_by_a_reader(transport="tcp")
    assert [e.seq for e in got] == list(range(100))
    assert sum(handed_over) >= 100


async def test_a_node_on_the_simulated_network_never_hands_work_to_a_thread(
        autojump_clock: trio.testing.MockClock, handed_over: list[int]) -> None:
    got = await read_by_a_reader()
    assert [e.seq for e in got] == list(range(100))
    assert handed_over == []


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the default uses threads only with 2 cores")
async def test_the_simulated_network_in_real_time_hands_long_runs_to_threads(
        handed_over: list[int]) -> None:
    # The default follows the clock, not the transport: only virtual time rules threads out.
    got = await read_by_a_reader()
    assert [e.seq for e in got] == list(range(100))
    assert sum(handed_over) >= 100

"""Exactly-once ``get()`` with real parts: subscriber processes SIGKILLed and restarted at
random points, a broker restarted, 10 % of all frames lost (the ``lossy`` test transport
over loopback TCP, see ``lossy_transport.py``), SQLite stores."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import lossy_transport
import pytest
import trio

from ketten import Event, Node, NodeConfig, criterion_key, open_node, plugin_manager
from ketten._core.leases import CursorState
from ketten.errors import KettenError
from ketten.plugins.sqlite_store import SqliteStore
from ketten.testing import deterministic_identity

WORKER = Path(__file__).with_name("subscriber_worker.py")
SEED = 77
SUBSCRIBER = 10
BROKERS = 3
PER_CRITERION = 30
KILLS = 6


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def criteria_brokered_by_the_brokers(count: int) -> list[str]:
    """Names whose 3 closest nodes are the broker processes, not the subscriber."""
    ids = {i: deterministic_identity(SEED, i).node_id for i in [*range(BROKERS), SUBSCRIBER]}
    names: list[str] = []
    n = 0
    while len(names) < count:
        name = f"orders-{n}"
        target = int.from_bytes(criterion_key(name), "big")
        closest = sorted(ids, key=lambda i: int.from_bytes(ids[i], "big") ^ target)[:BROKERS]
        if SUBSCRIBER not in closest:
            names.append(name)
        n += 1
    return names


def broker_config(index: int, addresses: list[str], root: Path) -> NodeConfig:
    return NodeConfig(
        identity=deterministic_identity(SEED, index), transport="lossy", store="sqlite",
        overlay="static", request_timeout=0.5,
        options={
            "transport": {"loss": 0.1, "seed": index,
                          "tcp": {"listen": addresses[index]}},
            "store": {"path": str(root / f"broker{index}")},
            "overlay": {"seeds": [a for a in addresses if a != addresses[index]],
                        "interval": 0.5},
            "replication": {"anti_entropy": 1.0},
            "subscriptions": {"ttl": 6.0, "check": 1.0, "interval": 1.0},
        },
    )


async def publish(node: Node, key: bytes, payload: bytes, command: int) -> Event:
    while True:
        try:
            return await node.publish(key, payload, command=command, deadline=5.0)
        except KettenError:
            await trio.sleep(0.2)


async def run_worker(store: Path, run: int, seeds: list[str], names: list[str],
                     kill_after: float | None) -> list[str]:
    """Run one subscriber process; SIGKILL it after ``kill_after`` seconds (None: let it
    finish). Returns its output lines."""
    total = PER_CRITERION * len(names)
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(WORKER), str(store), str(run), str(total), *seeds, "--", *names],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    buffer = bytearray()
    with trio.move_on_after(kill_after if kill_after is not None else 60.0):
        while True:
            chunk = await proc.stdout.receive_some()
            if not chunk:
                break
            buffer += chunk
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    lines = bytes(buffer).decode().splitlines()
    if kill_after is None:
        assert proc.returncode == 0 and lines and lines[-1] == "done", lines[-3:]
    return lines[:-1] if lines and not bytes(buffer).endswith(b"\n") else lines


@pytest.mark.slow
async def test_durable_get_is_exactly_once_across_crashes(tmp_path: Path) -> None:
    pm = plugin_manager(extra=(lossy_transport,))
    addresses = [f"127.0.0.1:{p}" for p in free_ports(BROKERS)]
    names = criteria_brokered_by_the_brokers(2)
    keys = [criterion_key(n) for n in names]
    rng = random.Random(SEED)
    nodes: dict[int, Node] = {}
    scopes: dict[int, trio.CancelScope] = {}
    published: list[Event] = []
    runs: list[list[str]] = []
    loss: list[int] = []

    async with trio.open_nursery() as nursery:

        async def serve(index: int, task_status: trio.TaskStatus[None]) -> None:
            with trio.CancelScope() as scope:
                scopes[index] = scope
                async with open_node(broker_config(index, addresses, tmp_path), plugins=pm) as n:
                    nodes[index] = n
                    task_status.started()
                    await trio.sleep_forever()
            stats = nodes.pop(index).transport.statistics()
            loss.append(stats.requests_lost + stats.replies_lost + stats.messages_lost)

        for index in range(BROKERS):
            await nursery.start(serve, index)

        async def publisher() -> None:
            for n in range(PER_CRITERION):
                for key in keys:
                    published.append(await publish(nodes[0], key, b"%s/%d" % (key[:4].hex().encode(), n), n))
                await trio.sleep(0.35)

        nursery.start_soon(publisher)
        store = tmp_path / "subscriber"
        for run in range(KILLS):
            runs.append(await run_worker(store, run, addresses, names, rng.uniform(1.0, 3.0)))
            if run == 1:
                scopes[2].cancel()
                while 2 in nodes:
                    await trio.sleep(0.05)
                await trio.sleep(0.5)
                await nursery.start(serve, 2)
        runs.append(await run_worker(store, KILLS, addresses, names, None))
        assert len(published) == PER_CRITERION * len(keys)
        nursery.cancel_scope.cancel()

    subscriber = SqliteStore(path=str(store))
    await subscriber.open()
    try:
        raw = await subscriber.get_cursor("ketten/durable/worker")
        assert raw is not None
        state = CursorState.decode(raw, where="test")
        consumed = {k: await subscriber.range(k, 0, state.next[k]) for k in keys}
    finally:
        await subscriber.aclose()

    # The delivery record: every published event delivered, nothing else, in chain order.
    assert state.delivered == len(published)
    assert state.next == dict.fromkeys(keys, PER_CRITERION)
    assert {e.hash for c in consumed.values() for e in c} == {e.hash for e in published}
    by_key = {k: [e for e in published if e.criterion == k] for k in keys}
    for key in keys:
        assert [e.hash for e in consumed[key]] == [e.hash for e in by_key[key]]

    # What the application saw: never an event twice, each criterion in order,
    # and at most one event per kill that was recorded but not seen.
    seen: list[tuple[str, int, str]] = []
    for lines in runs:
        for line in lines:
            if line.startswith("got "):
                _, criterion, seq, digest = line.split()
                seen.append((criterion, int(seq), digest))
    assert len({s[2] for s in seen}) == len(seen), "an event was returned twice"
    for key in keys:
        seqs = [s[1] for s in seen if s[0] == key.hex()]
        assert seqs == sorted(seqs)
        assert [s[2] for s in seen if s[0] == key.hex()] == [
            consumed[key][q].hash.hex() for q in seqs]
    assert len(published) - len(seen) <= KILLS
    assert sum(1 for lines in runs[:KILLS] if any(x.startswith("got ") for x in lines)) >= 2
    assert sum(loss) > 0

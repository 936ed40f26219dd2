"""Durable subscriptions with real parts: two subscriber processes, each SIGKILLed and
restarted at random points 20 times while a publisher publishes and a broker restarts,
10 % of all frames lost (the ``lossy`` test transport over loopback TCP, see
``lossy_transport.py``), SQLite stores. One acknowledges by its next ``get()``; the other
writes its effects into its own SQLite database in the transaction that holds the cursor."""

from __future__ import annotations

import random
import socket
import sqlite3
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
SUBSCRIBERS = (10, 13)
BROKERS = 3
PER_CRITERION = 30
KILLS = 20
STARTUP_LIMIT = 30.0


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def criteria_brokered_by_the_brokers(count: int) -> list[str]:
    """Names whose 3 closest nodes are the broker processes, not a subscriber."""
    ids = {i: deterministic_identity(SEED, i).node_id for i in [*range(BROKERS), *SUBSCRIBERS]}
    names: list[str] = []
    n = 0
    while len(names) < count:
        name = f"orders-{n}"
        target = int.from_bytes(criterion_key(name), "big")
        closest = sorted(ids, key=lambda i: int.from_bytes(ids[i], "big") ^ target)[:BROKERS]
        if not set(SUBSCRIBERS) & set(closest):
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


async def run_worker(route: str, identity: int, store: Path, run: int, seeds: list[str],
                     names: list[str], kill_after: float | None) -> list[str]:
    """Run one subscriber process; SIGKILL it ``kill_after`` seconds after it says it is
    ready (None: let it finish). Returns its output lines.

    The kill clock starts at ``ready``, not at the spawn: on a busy machine starting
    Python can take longer than the whole interval, and a subscriber killed before it
    subscribed tests nothing. One that is not ready within ``STARTUP_LIMIT`` is killed."""
    total = PER_CRITERION * len(names)
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(WORKER), route, str(identity), str(store), str(run), str(total),
         *seeds, "--", *names],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    buffer = bytearray()
    ready = False
    with trio.move_on_after(STARTUP_LIMIT if kill_after is not None else 90.0) as scope:
        while True:
            chunk = await proc.stdout.receive_some()
            if not chunk:
                break
            buffer += chunk
            if kill_after is not None and not ready and (
                    buffer.startswith(b"ready") or b"\nready" in buffer):
                ready = True
                scope.deadline = trio.current_time() + kill_after
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    lines = bytes(buffer).decode().splitlines()
    if kill_after is None:
        assert proc.returncode == 0 and lines and lines[-1] == "done", lines[-3:]
    return lines[:-1] if lines and not bytes(buffer).endswith(b"\n") else lines


async def stored_cursor(store: Path, keys: list[bytes]) -> tuple[CursorState, dict[bytes, list[Event]]]:
    """The ``get`` subscriber's cursor and the events below it in its own store."""
    subscriber = SqliteStore(path=str(store))
    await subscriber.open()
    try:
        raw = await subscriber.get_cursor("ketten/durable/worker")
        assert raw is not None
        state = CursorState.decode(raw, where="test")
        return state, {k: await subscriber.range(k, 0, state.next[k]) for k in keys}
    finally:
        await subscriber.aclose()


@pytest.mark.slow
async def test_durable_subscribers_lose_nothing_across_crashes(tmp_path: Path) -> None:
    pm = plugin_manager(extra=(lossy_transport,))
    addresses = [f"127.0.0.1:{p}" for p in free_ports(BROKERS)]
    names = criteria_brokered_by_the_brokers(2)
    keys = [criterion_key(n) for n in names]
    rng = random.Random(SEED)
    nodes: dict[int, Node] = {}
    scopes: dict[int, trio.CancelScope] = {}
    published: list[Event] = []
    runs: dict[str, list[list[str]]] = {"get": [], "txn": []}
    stores = {"get": tmp_path / "get-subscriber", "txn": tmp_path / "txn-subscriber"}
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
                await trio.sleep(0.8)

        async def restart_a_broker() -> None:
            await trio.sleep(8.0)
            scopes[2].cancel()
            while 2 in nodes:
                await trio.sleep(0.05)
            await trio.sleep(0.5)
            await nursery.start(serve, 2)

        async def subscriber(route: str, identity: int, kills: list[float]) -> None:
            for run, after in enumerate(kills):
                runs[route].append(await run_worker(route, identity, stores[route], run,
                                                    addresses, names, after))
            while len(published) < PER_CRITERION * len(keys):
                await trio.sleep(0.2)
            runs[route].append(await run_worker(route, identity, stores[route], len(kills),
                                                addresses, names, None))

        async with trio.open_nursery() as work:
            work.start_soon(publisher)
            work.start_soon(restart_a_broker)
            for route, identity in zip(("get", "txn"), SUBSCRIBERS, strict=True):
                work.start_soon(subscriber, route, identity,
                                [rng.uniform(0.8, 2.5) for _ in range(KILLS)])
        assert len(published) == PER_CRITERION * len(keys)
        nursery.cancel_scope.cancel()

    by_key = {k: [e.hash.hex() for e in published if e.criterion == k] for k in keys}
    assert sum(loss) > 0

    # -- acknowledged by the next get(): nothing lost, only the unacknowledged event repeats
    state, consumed = await stored_cursor(stores["get"], keys)
    assert state.delivered == len(published)
    assert state.next == dict.fromkeys(keys, PER_CRITERION)
    for key in keys:
        assert [e.hash.hex() for e in consumed[key]] == by_key[key]
    seen: list[tuple[str, int, str]] = []
    acknowledged: set[str] = set()
    repeats = 0
    for lines in runs["get"]:
        got = [tuple(line.split()[1:]) for line in lines if line.startswith("got ")]
        for n, (criterion, seq, digest) in enumerate(got):
            if any(s[2] == digest for s in seen):
                # Only an event nobody acknowledged may come again: no get() followed it
                # in its run, and nothing of its criterion came after it.
                last = [s for s in seen if s[0] == criterion][-1]
                assert digest not in acknowledged and last[2] == digest, \
                    f"{criterion[:8]}/{seq} was acknowledged and returned again"
                repeats += 1
            else:
                seen.append((criterion, int(seq), digest))
            if n + 1 < len(got):
                acknowledged.add(digest)
    for key in keys:
        assert [s[2] for s in seen if s[0] == key.hex()] == by_key[key]
    assert repeats <= KILLS
    assert sum(1 for lines in runs["get"][:KILLS] if any(x.startswith("got ") for x in lines)) >= 5

    # -- the cursor in the application's transaction: every effect exactly once, in order
    db = sqlite3.connect(str(stores["txn"]) + ".app")
    try:
        rows = db.execute("SELECT criterion, seq, hash FROM effects ORDER BY rowid").fetchall()
        (raw,) = db.execute("SELECT state FROM ketten_cursors WHERE name = 'worker'").fetchone()
    finally:
        db.close()
    assert len(rows) == len(published)
    for key in keys:
        mine = [(seq, digest) for criterion, seq, digest in rows if criterion == key.hex()]
        assert mine == list(enumerate(by_key[key]))
    app_state = CursorState.decode(raw, where="test")
    assert app_state.delivered == len(published)
    assert app_state.next == dict.fromkeys(keys, PER_CRITERION)
    assert sum(1 for lines in runs["txn"][:KILLS] if lines and lines[0].startswith("ready")) >= 5

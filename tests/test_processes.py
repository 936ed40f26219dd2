"""Real processes: ``ketten serve`` nodes on loopback TCP with SQLite, killed with SIGKILL.

Five node processes and a client node in the test process publish to three
criteria while brokers are killed and restarted, and a node whose id is
closer to one criterion's key than every broker joins (the chain moves to
it). Afterwards every acknowledged event must be held by a majority of its
chain's final configuration, in the node processes' own stores, and a read
through the client must return it.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import pytest
import trio

import ketten
from ketten import Agent, Identity, NodeConfig, criterion_key, open_node
from ketten._core.membership import ChainState, majority
from ketten.plugins.memory_store import MemoryBacking, MemoryStore
from ketten.plugins.sqlite_store import SqliteStore

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define(eq=False)
class Process:
    index: int
    root: Path
    port: int
    identity: Identity
    bootstrap: str
    popen: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data(self) -> Path:
        return self.root / f"node{self.index}"

    def start(self) -> None:
        key = self.root / f"node{self.index}.key"
        if not key.exists():
            self.identity.save(key)
        config = self.root / f"node{self.index}.json"
        config.write_text(json.dumps({"options": {"replication": {
            "hysteresis": 5.0, "anti_entropy": 1.0}}}))
        with open(self.root / f"node{self.index}.log", "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "ketten._cli", "serve", "--config", str(config),
                 "--data", str(self.data), "--key", str(key), "--listen", self.address,
                 "--bootstrap", self.bootstrap, "--request-timeout", "1.0",
                 "--log-level", "INFO"],
                stdout=subprocess.PIPE, stderr=log)
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().decode()
        assert "serving at" in line, line

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()
        self.popen = None

    def stop(self) -> None:
        if self.popen is not None:
            self.popen.send_signal(signal.SIGTERM)
            assert self.popen.wait(timeout=30) == 0
            self.popen = None


Acked = list[tuple[bytes, int, bytes]]


def cluster(tmp_path: Path, rng: random.Random) -> tuple[list[Process], Identity]:
    """Six node processes (five start at once; the sixth, the joiner, later) and the
    client's identity."""
    identities = [Identity.from_seed(rng.randbytes(32)) for _ in range(6)]
    ports = [free_port() for _ in identities]
    first = f"127.0.0.1:{ports[0]}"
    processes = [Process(i, tmp_path, ports[i], identities[i],
                         first if i else f"127.0.0.1:{ports[1]}") for i in range(6)]
    return processes, Identity.from_seed(rng.randbytes(32))


def client_config(identity: Identity, bootstrap: str, backing: MemoryBacking) -> NodeConfig:
    # The client is a node like any other: it may become a broker too.
    return NodeConfig(
        transport="tcp", overlay="kademlia", request_timeout=1.0, identity=identity,
        options={"transport": {"listen": "127.0.0.1:0"},
                 "overlay": {"bootstrap": [bootstrap]},
                 "store": {"backing": backing},
                 "replication": {"hysteresis": 5.0, "anti_entropy": 1.0}})


async def publish_until(client: ketten.Node, number: int, keys: list[bytes], acked: Acked,
                        stop: trio.Event) -> None:
    """Publish to ``keys`` in turn, each call with the next command id, until ``stop``;
    a call that fails is made again with the same command (applied at most once)."""
    author = Identity.from_seed(bytes([number + 40]) * 32)
    agent = await Agent.open(client, identity=author)
    command = await agent.next_command()
    n = 0
    while not stop.is_set():
        key = keys[n % len(keys)]
        try:
            event = await agent.publish(key, b"%d:%d" % (number, command),
                                        command=command, deadline=5.0)
        except ketten.KettenError:
            await trio.sleep(0.2)
            continue
        acked.append((key, event.seq, event.hash))
        command = await agent.next_command()
        n += 1


async def brokers(client: ketten.Node, key: bytes, processes: list[Process]) -> list[Process]:
    config = await client.configuration(key)
    assert config is not None
    by_key = {p.identity.public_key: p for p in processes}
    return [by_key[m.key] for m in config.voters if m.key in by_key]


async def read_back(client: ketten.Node, keys: list[bytes], acked: Acked) -> None:
    """Every acknowledged event is read back through the client (within 30 s of the
    last restart: a chain may wait for an election first)."""
    for key in keys:
        with trio.fail_after(30):
            while True:
                try:
                    events = await client.read(key)
                    break
                except ketten.QuorumUnavailable:
                    await trio.sleep(0.5)
        hashes = [e.hash for e in events]
        for acked_key, seq, digest in acked:
            if acked_key == key:
                assert seq < len(hashes) and hashes[seq] == digest, (key.hex(), seq)


async def final_states(processes: list[Process], client: Identity, backing: MemoryBacking,
                       keys: list[bytes], acked: Acked) -> dict[bytes, ChainState]:
    """Check, in the stores on disk (the nodes stopped), that every acknowledged event
    is held by a majority of its chain's final configuration; the final states."""
    index_of = {p.identity.public_key: p.index for p in processes}
    index_of[client.public_key] = -1
    chains: dict[int, dict[bytes, list[bytes]]] = {}
    states: dict[int, dict[bytes, ChainState]] = {}
    stores: list[tuple[int, ketten.interfaces.Store]] = [
        (p.index, SqliteStore(path=str(p.data))) for p in processes if p.data.exists()]
    stores.append((-1, MemoryStore(backing=backing)))
    for index, store in stores:
        await store.open()
        try:
            chains[index] = {k: [e.hash for e in await store.range(k)] for k in keys}
            states[index] = {}
            for k in keys:
                raw = await store.get_cursor("ketten/chain/" + k.hex())
                if raw is not None:
                    states[index][k] = ChainState.decode(raw)
        finally:
            await store.aclose()
    final = {}
    for key in keys:
        final[key] = max((s[key] for s in states.values() if key in s and s[key].config),
                         key=lambda state: state.epoch)
        config = final[key].config
        assert config is not None
        voters = [index_of[m.key] for m in config.voters]
        for acked_key, seq, digest in acked:
            if acked_key != key:
                continue
            holders = [v for v in voters if v in chains
                       and len(chains[v][key]) > seq and chains[v][key][seq] == digest]
            assert len(holders) >= majority(len(voters)), (key.hex()[:12], seq, holders)
    return final


async def stop_all(processes: list[Process]) -> None:
    for process in processes:
        if process.popen is not None:
            await trio.to_thread.run_sync(process.stop)


async def scenario(processes: list[Process], client_identity: Identity, keys: list[bytes],
                   publishers: int,
                   faults: Callable[[ketten.Node], Awaitable[None]]) -> dict[bytes, ChainState]:
    """Start the first five processes and a client node; ``publishers`` publish through
    the client while ``faults`` runs; then read every acknowledged event back, stop
    the nodes and check their stores (see :func:`final_states`)."""
    for process in processes[:5]:
        await trio.to_thread.run_sync(process.start)
    acked: Acked = []
    backing = MemoryBacking()
    try:
        async with open_node(client_config(client_identity, processes[0].address,
                                           backing)) as client:
            await trio.sleep(2.0)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for number in range(publishers):
                    nursery.start_soon(publish_until, client, number, keys, acked, stop)
                await faults(client)
                stop.set()
            assert len(acked) > 30
            await read_back(client, keys, acked)
    finally:
        await stop_all(processes)
    return await final_states(processes, client_identity, backing, keys, acked)


async def test_killed_brokers_and_a_closer_node_lose_no_acknowledged_event(
        tmp_path: Path) -> None:
    processes, client_identity = cluster(tmp_path, random.Random(7))
    joiner = processes[5].identity
    moving = joiner.node_id  # the joiner is closer to this key than any other node
    keys = [moving, criterion_key("orders"), criterion_key("payments")]

    async def faults(client: ketten.Node) -> None:
        await trio.sleep(3.0)
        # One broker of each chain dies and comes back.
        for key in keys:
            victim = (await brokers(client, key, processes))[0]
            await trio.to_thread.run_sync(victim.kill)
            await trio.sleep(2.0)
            await trio.to_thread.run_sync(victim.start)
            await trio.sleep(1.0)
        # A node closer to a key than its brokers joins; the chain moves to it,
        # and one of the old brokers is killed while it does.
        old = await brokers(client, moving, processes)
        await trio.to_thread.run_sync(processes[5].start)
        await trio.sleep(3.0)
        survivor = old[-1]
        await trio.to_thread.run_sync(survivor.kill)
        with trio.fail_after(90):
            while joiner.public_key not in (
                    await client.configuration(moving)).voter_keys():  # type: ignore[union-attr]
                await trio.sleep(0.5)
        await trio.to_thread.run_sync(survivor.start)
        await trio.sleep(3.0)

    final = await scenario(processes, client_identity, keys, 3, faults)
    assert joiner.public_key in final[moving].config.voter_keys()  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", [1])
async def test_random_kills_of_one_or_two_brokers_lose_no_acknowledged_event(
        tmp_path: Path, seed: int) -> None:
    """Six rounds: one or two brokers of a chain (two of three: the chain stops until
    they are back) are killed at moments and for times the seed draws, and brought
    back; the node closer to one key joins at a random round and may be killed in
    later ones. Other seeds give other schedules (seeds 1-8 were run)."""
    rng = random.Random(seed)
    processes, client_identity = cluster(tmp_path, rng)
    joiner = processes[5]
    keys = [joiner.identity.node_id, criterion_key(f"orders {seed}"),
            criterion_key(f"payments {seed}")]

    async def faults(client: ketten.Node) -> None:
        await trio.sleep(2.0)
        for round_ in range(6):
            live = [p for p in await brokers(client, rng.choice(keys), processes)
                    if p.popen is not None]
            victims = rng.sample(live, min(len(live), rng.choice([1, 1, 2])))
            for victim in victims:
                await trio.to_thread.run_sync(victim.kill)
                await trio.sleep(rng.uniform(0.0, 0.5))
            if round_ > 1 and joiner.popen is None and rng.random() < 0.4:
                await trio.to_thread.run_sync(joiner.start)
            await trio.sleep(rng.uniform(0.5, 6.0))
            for victim in victims:
                if victim.popen is None:
                    await trio.to_thread.run_sync(victim.start)
                await trio.sleep(rng.uniform(0.0, 1.0))
            await trio.sleep(rng.uniform(0.5, 3.0))
        if joiner.popen is None:
            await trio.to_thread.run_sync(joiner.start)
        await trio.sleep(8.0)

    await scenario(processes, client_identity, keys, 4, faults)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ketten._cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


async def test_a_cluster_killed_at_once_comes_back_with_every_acknowledged_event(
        tmp_path: Path) -> None:
    rng = random.Random(8)
    ports = [free_port() for _ in range(3)]
    # Each node joins through the next, which is still down when it starts again.
    processes = [Process(i, tmp_path, ports[i], Identity.from_seed(rng.randbytes(32)),
                         f"127.0.0.1:{ports[(i + 1) % 3]}") for i in range(3)]
    try:
        for process in processes:
            await trio.to_thread.run_sync(process.start)
        await trio.sleep(2.0)
        acked = []
        for i in range(6):
            done = await trio.to_thread.run_sync(
                _cli, "publish", "orders", f"order {i}", "--json",
                "-b", processes[i % 3].address)
            assert done.returncode == 0, done.stderr
            acked.append(json.loads(done.stdout)["hash"])
        for process in processes:  # a power cut
            await trio.to_thread.run_sync(process.kill)
        for process in processes:
            await trio.to_thread.run_sync(process.start)
        done = await trio.to_thread.run_sync(_cli, "read", "orders", "--json", "-b",
                                             processes[2].address)
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["hash"] for line in done.stdout.splitlines()] == acked
        done = await trio.to_thread.run_sync(_cli, "publish", "orders", "after", "--json",
                                             "-b", processes[0].address)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["seq"] == 6
    finally:
        await stop_all(processes)

"""ketten.Agent: an author identity with a persisted command counter."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ketten import Agent, Identity, NodeConfig, criterion_key, open_node
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import CommandIdReused, DecodeError, UsageError
from ketten.plugins.memory_store import MemoryBacking


def single(backing: MemoryBacking, identity: Identity | None = None) -> NodeConfig:
    """One node brokering everything itself (r = 1): enough to exercise the agent."""
    return NodeConfig(identity=identity or Identity.from_seed(b"\5" * 32), replication=1,
                      options={"transport": {"network": MemoryNetwork()},
                               "store": {"backing": backing}})


async def test_the_counter_grows_and_survives_reopening(plugins, autojump_clock) -> None:
    backing = MemoryBacking()
    async with open_node(single(backing), plugins=plugins) as node:
        agent = await Agent.open(node)
        assert agent.author == node.identity.public_key
        assert [await agent.next_command() for _ in range(3)] == [1, 2, 3]
    async with open_node(single(backing), plugins=plugins) as node:
        agent = await Agent.open(node)
        assert agent.last_command == 3
        assert await agent.next_command() == 4


async def test_agents_of_different_authors_count_separately(plugins, autojump_clock) -> None:
    async with open_node(single(MemoryBacking()), plugins=plugins) as node:
        a = await Agent.open(node, identity=Identity.from_seed(b"\1" * 32))
        b = await Agent.open(node, identity=Identity.from_seed(b"\2" * 32))
        assert [await a.next_command(), await a.next_command(), await b.next_command()] == [
            1, 2, 1]


async def test_concurrent_commands_are_unique(plugins, autojump_clock) -> None:
    async with open_node(single(MemoryBacking()), plugins=plugins) as node:
        agent = await Agent.open(node)
        got: list[int] = []

        async def take() -> None:
            got.append(await agent.next_command())

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(take)
        assert sorted(got) == list(range(1, 51))


async def test_a_file_counter_is_written_atomically(plugins, autojump_clock,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "agent.counter"
    async with open_node(single(MemoryBacking()), plugins=plugins) as node:
        agent = await Agent.open(node, path=path)
        assert [await agent.next_command() for _ in range(2)] == [1, 2]
        assert path.read_bytes().endswith(b"\n2\n")
        assert [p.name for p in tmp_path.iterdir()] == ["agent.counter"]
        again = await Agent.open(node, path=path)
        assert await again.next_command() == 3
        path.write_bytes(b"garbage")
        with pytest.raises(DecodeError, match=r"agent\.counter"):
            await Agent.open(node, path=path)


async def test_publishing_commands(plugins, autojump_clock) -> None:
    async with open_node(single(MemoryBacking()), plugins=plugins) as node:
        author = Identity.from_seed(b"\x09" * 32)
        agent = await Agent.open(node, identity=author)
        key = criterion_key("ledger")
        first = await agent.publish(key, b"credit 5")
        assert (first.author, first.command) == (author.public_key, 1)
        second = await agent.publish("ledger", b"debit 2")
        assert second.command == 2 and second.prev == first.hash
        assert await agent.publish(key, b"credit 5", command=1) == first
        with pytest.raises(CommandIdReused):
            await agent.publish(key, b"credit 6", command=1)
        with pytest.raises(UsageError):
            await agent.publish(key, b"x", command=-1)
        assert [e.payload for e in await node.read(key)] == [b"credit 5", b"debit 2"]

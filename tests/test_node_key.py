"""A store belongs to one node: reopened without an identity it is the same node;
opened under another identity it is refused with an error that says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ketten import ConfigError, Identity, NodeConfig, open_node
from ketten.adapters.memory import MemoryNetwork


def config(path: Path, store: str = "sqlite", identity: Identity | None = None) -> NodeConfig:
    return NodeConfig(store=store, replication=1, identity=identity,
                      options={"transport": {"network": MemoryNetwork(seed=1)},
                               "store": {"path": str(path)}})


@pytest.mark.parametrize("store", ["sqlite", "file"])
async def test_a_node_without_an_identity_reopens_its_store_as_itself(
        plugins, tmp_path: Path, store: str) -> None:
    with trio.fail_after(30):
        async with open_node(config(tmp_path / "n", store), plugins=plugins) as node:
            first = await node.publish("orders", b"one")
            identity = node.identity
        assert (tmp_path / "n" / "node.key").stat().st_mode & 0o077 == 0
        async with open_node(config(tmp_path / "n", store), plugins=plugins) as again:
            assert again.identity.public_key == identity.public_key
            second = await again.publish("orders", b"two")
            assert [e.hash for e in await again.read("orders")] == [first.hash, second.hash]


async def test_a_store_is_refused_to_another_node(plugins, tmp_path: Path) -> None:
    owner = Identity.from_seed(b"\x01" * 32)
    with trio.fail_after(30):
        async with open_node(config(tmp_path / "n", identity=owner), plugins=plugins) as node:
            await node.publish("orders", b"one")
        stranger = Identity.from_seed(b"\x02" * 32)
        for other in (stranger, None):  # None: a fresh identity (no key file was kept)
            with pytest.raises(ConfigError, match=f"belongs to node {owner.public_key.hex()[:16]}"):
                async with open_node(config(tmp_path / "n", identity=other), plugins=plugins):
                    pass  # pragma: no cover
        # Refused before anything was written: the owner opens it as before.
        async with open_node(config(tmp_path / "n", identity=owner), plugins=plugins) as node:
            assert [e.payload for e in await node.read("orders")] == [b"one"]


async def test_a_damaged_key_file_is_a_config_error(plugins, tmp_path: Path) -> None:
    async with open_node(config(tmp_path / "n"), plugins=plugins):
        pass
    (tmp_path / "n" / "node.key").write_bytes(b"not a key\n")
    with pytest.raises(ConfigError, match=r"node\.key"):
        async with open_node(config(tmp_path / "n"), plugins=plugins):
            pass  # pragma: no cover


async def test_a_memory_store_keeps_no_key(plugins, autojump_clock) -> None:
    async with open_node(NodeConfig(replication=1), plugins=plugins) as a:
        pass
    async with open_node(NodeConfig(replication=1), plugins=plugins) as b:
        pass
    assert a.identity.public_key != b.identity.public_key

"""Logs: a NullHandler, structured records for what operators must see, rate limits,
nothing per event at INFO."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

import ketten
from ketten import NodeConfig, criterion_key
from ketten.logs import RateLimitedLog
from ketten.testing import open_cluster


def _records(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "ketten", {}).get("event") == event]


def test_the_library_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("ketten").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


async def test_alike_records_are_cut_to_one_per_interval_and_counted(
        autojump_clock: object, caplog: pytest.LogCaptureFixture) -> None:
    log = RateLimitedLog(logging.getLogger("ketten.test"), interval=10.0)
    caplog.set_level(logging.INFO, logger="ketten.test")
    assert log.warning("peer_refused", "refusing %s", "a", key="a", peer="a")
    for _ in range(4):
        assert not log.warning("peer_refused", "refusing %s", "a", key="a", peer="a")
    assert log.warning("peer_refused", "refusing %s", "b", key="b", peer="b")
    await trio.sleep(10)
    assert log.warning("peer_refused", "refusing %s", "a", key="a", peer="a")
    records = _records(caplog, "peer_refused")
    assert [r.getMessage() for r in records] == [
        "refusing a", "refusing b", "refusing a (4 similar suppressed)"]
    assert records[2].ketten == {"event": "peer_refused", "peer": "a", "suppressed": 4}
    assert records[0].levelno == logging.WARNING


def test_keys_are_bounded() -> None:
    log = RateLimitedLog(logging.getLogger("ketten.test"), max_keys=8)
    for i in range(100):
        log.warning("x", "m", key=str(i))
        log.warning("x", "m", key=str(i))
    assert len(log._last) <= 8 and len(log._suppressed) <= 8


async def test_a_failed_publish_is_logged_with_its_criterion(
        autojump_clock: object, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ketten")
    async with open_cluster(3, seed=11) as cluster:
        key = criterion_key("lonely")
        cluster.cut(0)
        with pytest.raises(ketten.Unavailable):
            await cluster[0].publish(key, b"x")
    failed = _records(caplog, "publish_failed")
    assert failed, [r.getMessage() for r in caplog.records]
    fields: dict[str, Any] = failed[0].ketten
    assert fields["criterion"] == key.hex() and fields["outcome"] in ("quorum", "unknown")
    assert "publish to criterion" in failed[0].getMessage()


async def test_a_refused_peer_is_logged_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ketten.tcp")
    tcp = {"transport": {"listen": "127.0.0.1:0"}}
    async with ketten.open_node(NodeConfig(transport="tcp", replication=3, options=tcp)) as a, \
            ketten.open_node(NodeConfig(transport="tcp", replication=5, options=tcp)) as b:
        with pytest.raises(ketten.Unavailable):
            await b.pull(a.address, criterion_key("x"))
    # Each side refuses the other, naming the mismatch; the dialer names the address.
    refusals = _records(caplog, "peer_refused")
    assert {r.ketten["peer"] for r in refusals} == {a.address, "an incoming peer from 127.0.0.1"}
    assert all("replication factor" in r.ketten["reason"] for r in refusals)
    assert all(r.filename == "tcp.py" for r in refusals)


async def test_nothing_is_logged_per_event_at_info(
        autojump_clock: object, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ketten")
    async with open_cluster(3, seed=12) as cluster:
        for i in range(60):
            await cluster[i % 3].publish("steady", b"%d" % i)
        await trio.sleep(5)
    assert len(caplog.records) < 10, [r.getMessage() for r in caplog.records]
    created = _records(caplog, "chain_created")
    assert len(created) == 1 and created[0].ketten["criterion"] == criterion_key("steady").hex()


async def test_a_store_repair_is_logged(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ketten.store")
    config = NodeConfig(replication=1, store="file", identity=ketten.Identity.generate(),
                        options={"store": {"path": str(tmp_path)}})
    async with ketten.open_node(config) as node:
        await node.publish("kept", b"one")
    segment = sorted(tmp_path.glob("seg-*.log"))[-1]
    size = segment.stat().st_size
    with segment.open("ab") as f:  # a write torn before its COMMIT frame
        f.write(b"\x00\x00\x01\x00torn")
    async with ketten.open_node(config) as node:
        head = await node.store.head(criterion_key("kept"))
        assert head is not None and head.payload == b"one"
    repaired = _records(caplog, "store_repaired")
    assert len(repaired) == 1 and repaired[0].ketten["bytes_cut"] == 8
    assert segment.stat().st_size == size

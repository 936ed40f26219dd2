"""One author starts chains as fast as it can, on loopback TCP: each broker lets it
start a burst, then a few per second, and refuses the rest with a clear error
that stores nothing; other authors keep starting theirs."""

from __future__ import annotations

import pluggy
import pytest

from ketten import QuotaExceeded, criterion_key
from ketten.testing import open_cluster


async def test_one_author_starts_a_bounded_number_of_chains(
    plugins: pluggy.PluginManager,
) -> None:
    burst = 10
    limits = {"replication": {"creation_burst": burst, "creations_per_second": 0.01}}
    async with open_cluster(4, plugins=plugins, transport="tcp", overlay="static",
                            settle=1.0, options=limits) as c:
        flooder, other = c.nodes[0], c.nodes[1]
        started, refused = [], []
        for i in range(80):
            key = criterion_key(f"flood {i}")
            try:
                await flooder.publish(key, b"genesis")
                started.append(key)
            except QuotaExceeded as exc:
                assert "chains at this broker" in str(exc) and "nothing was stored" in str(exc)
                refused.append(key)
        # Each of the four brokers lets the author start a burst, no more.
        assert len(started) <= 4 * burst and refused, (len(started), len(refused))
        for key in refused:
            for node in c.nodes.values():
                assert await node.store.head(key) is None
        # A chain already started takes appends as before; other authors start theirs.
        await flooder.publish(started[0], b"second")
        for i in range(5):
            await other.publish(f"other {i}", b"fine")
        with pytest.raises(QuotaExceeded):
            await flooder.publish("one more", b"refused")
        stats = [n.statistics() for n in c.nodes.values()]
        assert all(s.internal_errors == 0 for s in stats)

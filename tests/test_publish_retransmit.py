"""Offers lost on the way are sent again within the round, not after it."""

from __future__ import annotations

import pluggy
import pytest
import trio
import trio.testing
from test_replication import cluster

from ketten import criterion_key
from ketten.adapters.memory import Faults
from ketten.testing import deterministic


@pytest.mark.parametrize("seed", [
    *range(4), *(pytest.param(s, marks=pytest.mark.sim) for s in range(4, 60))])
def test_publishes_meet_short_deadlines_on_a_lossy_network(
    plugins: pluggy.PluginManager, seed: int
) -> None:
    # Each message is lost with probability 0.15. With the default 5 s
    # request timeout, one lost offer, append or answer would eat most of a
    # 6 s deadline; retransmissions (of offers by the publisher, of appends by
    # the leader) every 1/8 of the timeout keep every publish inside it.
    # Scheduling is deterministic: a seed replays exactly.
    async def main() -> None:
        async with cluster(plugins, 5, request_timeout=5.0, seed=seed) as c:
            publisher = c.nodes[c.others(criterion_key("lossy"))[0]]
            # The chain is created first (creating asks the nodes near the key, twice).
            await publisher.publish("lossy", b"0")
            c.network.set_faults(Faults(latency=0.01, loss=0.15))
            for i in range(1, 30):
                started = trio.current_time()
                await publisher.publish("lossy", b"%d" % i, deadline=6.0)
                assert trio.current_time() - started < 6.0
            c.network.set_faults(Faults(latency=0.01))
            chain = await c.settle(criterion_key("lossy"))
            assert [e.payload for e in chain] == [b"%d" % i for i in range(30)]

    deterministic(lambda: trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)))

"""ketten from programs that do not run trio: the blocking facade and the asyncio bridge.

Real threads and real time (the node runs on a trio thread of its own), so
these tests use a node alone on its own memory network, or loopback TCP.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import threading

import pytest

import ketten
import ketten.aio
import ketten.blocking
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_blocking_node_serves_calls_from_many_threads() -> None:
    with ketten.blocking.open_node() as node:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            events = list(pool.map(lambda n: node.publish("t", b"%d" % n, command=n), range(40)))
        assert sorted(e.seq for e in events) == list(range(40))
        chain = node.read("t")
        assert [e.hash for e in chain] == [e.hash for e in sorted(events, key=lambda e: e.seq)]
        assert [e.hash for e in node.replay("t", 30)] == [e.hash for e in chain[30:]]
        assert node.statistics() is not None
        with pytest.raises(UsageError, match="payload must be bytes"):
            node.publish("t", "text")  # type: ignore[arg-type]

        got: list[bytes] = []
        with node.subscribe("t") as sub:
            def listen() -> None:
                for event in sub:
                    got.append(event.payload)
                    if len(got) == 41:
                        return

            listener = threading.Thread(target=listen)
            listener.start()
            node.publish("t", b"live")
            listener.join(timeout=30)
        assert len(got) == 41 and got[-1] == b"live"

        durable = node.durable_subscription("d", ["t"])
        assert durable.get().seq == 0 and durable.get().seq == 1
        durable.ack()
        assert durable.position == {ketten.criterion_key("t"): 2}
        durable.close()
    with pytest.raises(ketten.blocking.NodeClosed):
        node.publish("t", b"after")
    node.close()  # twice is fine


def test_a_pending_subscription_call_ends_when_the_node_closes() -> None:
    node = ketten.blocking.open_node()
    sub = node.subscribe("quiet")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            next(sub)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    node.close()
    waiter.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], ketten.blocking.NodeClosed)


def test_a_memory_network_refuses_nodes_of_another_trio_run() -> None:
    network = MemoryNetwork()
    config = ketten.NodeConfig(options={"transport": {"network": network}})
    with ketten.blocking.open_node(config), pytest.raises(UsageError, match="one trio run"):
        ketten.blocking.open_node(config)


def test_the_asyncio_bridge() -> None:
    async def main() -> None:
        async with ketten.aio.open_node() as node:
            async with node.subscribe("a") as sub:
                events = await asyncio.gather(*(node.publish("a", b"%d" % n, command=n)
                                                for n in range(100)))
                assert sorted(e.seq for e in events) == list(range(100))
                seen = []
                async for event in sub:
                    seen.append(event.seq)
                    if len(seen) == 100:
                        break
                assert seen == list(range(100))
            assert len(await node.read("a")) == 100
            with pytest.raises(UsageError):
                await node.publish("a", b"x", command=-1)
            durable = await node.durable_subscription("d", ["a"])
            assert (await durable.get()).seq == 0
            await durable.ack()
            await durable.aclose()
            assert (await node.statistics()) is not None
        with pytest.raises(ketten.aio.NodeClosed):
            await node.publish("a", b"after")

    asyncio.run(main())


@pytest.mark.parametrize("example", ["blocking_script.py", "asyncio_app.py"])
def test_the_host_examples_run(example: str) -> None:
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", example)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("done")

"""The transport and delivery conformance kits against the built-in plugins, and
against broken ones they must reject."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio
import trio.testing

from ketten import Event, Identity
from ketten.adapters._tcp_handshake import PROTOCOL_VERSION, NetworkParams
from ketten.adapters.memory import MemoryNetwork
from ketten.adapters.tcp import TcpTransport
from ketten.interfaces import Peer, Reply
from ketten.plugins.causal_delivery import make_causal_delivery
from ketten.plugins.chain_delivery import ChainDelivery
from ketten.testing import check_delivery, check_transport


async def test_the_memory_transport_conforms(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=3)
    await check_transport(lambda identity: net.endpoint(identity), unreachable="mem:nobody")


async def test_the_tcp_transport_conforms() -> None:
    params = NetworkParams(PROTOCOL_VERSION, 3, 0)
    await check_transport(lambda identity: TcpTransport(identity=identity, params=params),
                          unreachable="127.0.0.1:1")


async def test_a_transport_that_forgets_who_answered_is_rejected(
        autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=4)
    stranger = Identity.from_seed(b"\x55" * 32)

    class Impostor:
        """Says every answer came from a stranger."""

        def __init__(self, identity: Identity) -> None:
            self.inner = net.endpoint(identity)

        @property
        def address(self) -> str:
            return self.inner.address

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def request(self, address: str, data: bytes) -> Reply:
            reply = await self.inner.request(address, data)
            return Reply(Peer(reply.peer.address, stranger.public_key), reply.data)

    with pytest.raises(AssertionError, match=r"\[request\].*identity"):
        await check_transport(lambda identity: Impostor(identity))  # type: ignore[arg-type,return-value]


def test_the_built_in_deliveries_conform() -> None:
    check_delivery(lambda options: ChainDelivery(criteria=frozenset(options["criteria"]),
                                                 start=options["start"]))
    def causal(options: Mapping[str, Any]) -> Any:
        return make_causal_delivery({"criteria": options["criteria"],
                                     "start": options["start"]})

    check_delivery(causal)


def test_a_delivery_that_delivers_twice_is_rejected() -> None:
    class Echo:
        def offer(self, event: Event) -> list[Event]:
            return [event]

        def pending(self) -> int:
            return 0

    with pytest.raises(AssertionError, match=r"\[shuffled\]"):
        check_delivery(lambda options: Echo())

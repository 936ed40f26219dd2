"""The ``memory`` transport: an in-process simulated network.

Every node of a simulation gets an endpoint of one :class:`MemoryNetwork`.
Delivery is decided by the seeded :class:`~ketten.adapters._netmodel.NetworkModel`
(latency, jitter, loss, duplication, reordering, partitions) and carried out
with ``trio.sleep``, so under ``trio.testing.MockClock(autojump_threshold=0)``
thousands of nodes run in virtual time. Peers are authenticated by
construction: the network knows which identity owns each endpoint.

Options: ``network`` (the :class:`MemoryNetwork` the nodes that should see
each other share; without it a node gets a network of its own and runs
alone, which is what ``NodeConfig()`` gives) and ``address``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ketten import Identity, Option, PluginSpec, hookimpl
from ketten.errors import ConfigError, KettenError, PeerUnreachable, RemoteError, UsageError
from ketten.interfaces import Handler, Peer, Reply

from ._netmodel import Faults, NetworkModel, NetworkStatistics
from ._reply import ReplySlot

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["Faults", "MemoryNetwork", "MemoryTransport", "NetworkStatistics", "TransportStatistics"]


@attrs.frozen
class TransportStatistics:
    """Counters of one transport endpoint."""

    requests_sent: int
    replies_received: int
    messages_sent: int
    requests_received: int
    messages_received: int
    error_replies_sent: int
    bytes_sent: int
    bytes_received: int


@attrs.define(eq=False)
class MemoryNetwork:
    """A simulated network shared by the endpoints of one simulation.

    ``faults`` can be replaced at any time; :meth:`cut` and :meth:`heal`
    make and undo partitions between sets of addresses.
    """

    seed: int = 0
    faults: Faults = attrs.field(factory=Faults)
    _model: NetworkModel = attrs.field(init=False)
    _endpoints: dict[str, MemoryTransport] = attrs.field(factory=dict, init=False)
    _next_address: int = attrs.field(default=0, init=False)
    _run: object = attrs.field(default=None, init=False)
    """The trio run its endpoints serve in: messages are carried by that run's tasks."""

    def __attrs_post_init__(self) -> None:
        self._model = NetworkModel(self.faults, self.seed)

    def set_faults(self, faults: Faults) -> None:
        """Change how links behave from now on."""
        self.faults = faults
        self._model.faults = faults

    def endpoint(self, identity: Identity, address: str | None = None) -> MemoryTransport:
        """A new endpoint owned by ``identity``; it is reachable once it serves."""
        if address is None:
            self._next_address += 1
            address = f"mem:{self._next_address}"
        return MemoryTransport(network=self, identity=identity, address=address)

    def cut(self, group: Iterable[str], other: Iterable[str] | None = None) -> None:
        """Partition ``group`` from ``other`` (default: from everyone else)."""
        self._model.cut(group, other)

    def heal(self, group: Iterable[str] | None = None) -> None:
        """Undo the cuts made for ``group`` (default: all of them)."""
        self._model.heal(group)

    def is_cut(self, src: str, dst: str) -> bool:
        return self._model.is_cut(src, dst)

    def addresses(self) -> list[str]:
        """Addresses of the endpoints that are serving now."""
        return list(self._endpoints)

    def statistics(self) -> NetworkStatistics:
        return self._model.statistics()

    # -- driver ------------------------------------------------------------

    def _attach(self, endpoint: MemoryTransport) -> None:
        if endpoint.address in self._endpoints:
            raise UsageError(f"address {endpoint.address} is already serving on this network")
        run = trio.lowlevel.current_trio_token()
        if self._endpoints and run is not self._run:
            raise UsageError(
                "a MemoryNetwork carries messages within one trio run; a node on another "
                "thread or run (ketten.blocking, ketten.aio) needs its own network, or TCP")
        self._run = run
        self._endpoints[endpoint.address] = endpoint

    def _detach(self, endpoint: MemoryTransport) -> None:
        if self._endpoints.get(endpoint.address) is endpoint:
            del self._endpoints[endpoint.address]

    def _transmit(self, src: MemoryTransport, dst_address: str, kind: str, req_id: int,
                  data: bytes) -> None:
        dst = self._endpoints.get(dst_address)
        if dst is None:
            if kind == "request" and not self._model.is_cut(src.address, dst_address):
                # Like a refused connection: the sender learns it after one hop (behind
                # a cut, nothing comes back at all).
                arrival = trio.current_time() + self.faults.latency
                src._spawn(src._refused, arrival, req_id, dst_address)
            return
        for arrival in self._model.route(src.address, dst_address, trio.current_time()):
            dst._spawn(dst._arrive, arrival, src.peer, kind, req_id, data)

    def _transmit_reply(self, src: MemoryTransport, dst_address: str, req_id: int,
                        outcome: bytes | tuple[str, str]) -> None:
        dst = self._endpoints.get(dst_address)
        if dst is None:
            return
        for arrival in self._model.route(src.address, dst_address, trio.current_time()):
            dst._spawn(dst._reply_arrives, arrival, src.peer, req_id, outcome)


@attrs.define(eq=False)
class MemoryTransport:
    """One endpoint of a :class:`MemoryNetwork` (a :class:`~ketten.interfaces.Transport`)."""

    loses_frames = True  # the fault model drops messages

    _network: MemoryNetwork = attrs.field(alias="network")
    _identity: Identity = attrs.field(alias="identity")
    _address: str = attrs.field(alias="address")
    _handler: Handler | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _pending: dict[int, ReplySlot] = attrs.field(factory=dict, init=False)
    _next_id: int = attrs.field(default=0, init=False)
    _peer: Peer = attrs.field(init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._peer = Peer(self._address, self._identity.public_key)
        self._counts = dict.fromkeys(attrs.fields_dict(TransportStatistics), 0)

    @property
    def address(self) -> str:
        return self._address

    @property
    def peer(self) -> Peer:
        return self._peer

    def address_proven(self, peer: Peer) -> bool:
        """Whether ``peer``'s key serves at ``peer.address`` now: the network knows
        (it names every sender by the address it serves at; a contact a third party
        names is checked against the endpoint at that address)."""
        endpoint = self._network._endpoints.get(peer.address)
        return endpoint is not None and endpoint.peer.public_key == peer.public_key

    async def serve(
        self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if self._nursery is not None:
            raise UsageError(f"{self._address} is already serving")
        self._network._attach(self)
        try:
            async with trio.open_nursery() as nursery:
                self._handler = handler
                self._nursery = nursery
                task_status.started(self._address)
                try:
                    await trio.sleep_forever()
                finally:
                    # Stop taking arrivals before the nursery starts closing.
                    self._network._detach(self)
                    self._nursery = None
                    self._handler = None
        finally:
            self._network._detach(self)
            for slot in self._pending.values():
                slot.settle(PeerUnreachable(f"{self._address} stopped serving"))
            self._pending.clear()

    async def request(self, address: str, data: bytes) -> Reply:
        if self._nursery is None:
            raise UsageError(f"{self._address} must be serving to send requests")
        self._next_id += 1
        req_id = self._next_id
        slot = ReplySlot()
        self._pending[req_id] = slot
        self._counts["requests_sent"] += 1
        self._counts["bytes_sent"] += len(data)
        try:
            self._network._transmit(self, address, "request", req_id, data)
            return await slot.result()
        finally:
            self._pending.pop(req_id, None)

    async def send(self, address: str, data: bytes) -> None:
        if self._nursery is None:
            raise UsageError(f"{self._address} must be serving to send messages")
        self._counts["messages_sent"] += 1
        self._counts["bytes_sent"] += len(data)
        self._network._transmit(self, address, "message", 0, data)
        await trio.lowlevel.checkpoint()

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(**self._counts)

    # -- driver side -------------------------------------------------------

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    async def _arrive(self, arrival: float, peer: Peer, kind: str, req_id: int, data: bytes) -> None:
        await trio.sleep_until(arrival)
        handler = self._handler
        if handler is None:
            return
        self._counts["bytes_received"] += len(data)
        if kind == "message":
            self._counts["messages_received"] += 1
            await handler.handle_message(peer, data)
            return
        self._counts["requests_received"] += 1
        outcome: bytes | tuple[str, str]
        try:
            outcome = await handler.handle_request(peer, data)
        except KettenError as exc:
            self._counts["error_replies_sent"] += 1
            outcome = (type(exc).__name__, str(exc))
        else:
            self._counts["bytes_sent"] += len(outcome)
        self._network._transmit_reply(self, peer.address, req_id, outcome)

    async def _reply_arrives(self, arrival: float, peer: Peer, req_id: int,
                             outcome: bytes | tuple[str, str]) -> None:
        await trio.sleep_until(arrival)
        slot = self._pending.get(req_id)
        if slot is None or slot.settled:
            return  # late, duplicated or abandoned
        self._counts["replies_received"] += 1
        if isinstance(outcome, tuple):
            slot.settle(RemoteError(*outcome))
        else:
            self._counts["bytes_received"] += len(outcome)
            slot.settle(Reply(peer, outcome))

    async def _refused(self, arrival: float, req_id: int, address: str) -> None:
        await trio.sleep_until(arrival)
        slot = self._pending.get(req_id)
        if slot is not None:
            slot.settle(PeerUnreachable(f"nothing is serving at {address}"))


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"transport": ["memory"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("transport", "memory"):
        return None
    return PluginSpec({
        "network": Option("the MemoryNetwork shared by the nodes that should see each other",
                          MemoryNetwork),
        "address": Option("this node's address on the network", str),
    })


@hookimpl
def ketten_make_transport(name: str, options: Mapping[str, Any], node: Node) -> MemoryTransport | None:
    if name != "memory":
        return None
    network = options.get("network")
    if network is None:
        # A network of its own: a node alone, which only nodes given this very
        # network could reach (there are none).
        network = MemoryNetwork()
    if not isinstance(network, MemoryNetwork):
        raise ConfigError(
            "transport option 'network' must be a ketten.adapters.memory.MemoryNetwork "
            f"(shared by the nodes that should see each other), got {type(network).__name__}"
        )
    address = options.get("address")
    if address is not None and not isinstance(address, str):
        raise ConfigError(f"transport option 'address' must be a string, got {address!r}")
    return network.endpoint(node.identity, address)

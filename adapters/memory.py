"""The ``memory`` transport: an in-process simulated network.

Every node of a simulation gets an endpoint of one :class:`MemoryNetwork`.
Delivery is decided by the seeded :class:`~ketten.adapters._netmodel.NetworkModel`
(latency, jitter, loss, duplication, reordering, partitions) and carried out
by one timer task per endpoint (a heap of arrivals, in arrival order and then
in the order they were sent), so under
``trio.testing.MockClock(autojump_threshold=0)`` thousands of nodes run in
virtual time, and a message in flight costs a heap entry, not a task. Peers
are authenticated by construction: the network knows which identity owns
each endpoint.

Options: ``network`` (the :class:`MemoryNetwork` the nodes that should see
each other share; without it a node gets a network of its own and runs
alone, which is what ``NodeConfig()`` gives) and ``address``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
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


@attrs.define(eq=False, repr=False)
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

    def __repr__(self) -> str:
        return f"<MemoryNetwork seed={self.seed} endpoints={len(self._endpoints)}>"

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
                src._at(arrival, src._refused, req_id, dst_address)
            return
        for arrival in self._model.route(src.address, dst_address, trio.current_time()):
            dst._at(arrival, dst._arrive, src.peer, kind, req_id, data)

    def _transmit_reply(self, src: MemoryTransport, dst_address: str, req_id: int,
                        outcome: bytes | tuple[str, str]) -> None:
        dst = self._endpoints.get(dst_address)
        if dst is None:
            return
        for arrival in self._model.route(src.address, dst_address, trio.current_time()):
            dst._at(arrival, dst._reply_arrives, src.peer, req_id, outcome)


@attrs.define(eq=False, repr=False)
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
    # Arrivals and resends due: (when, order sent, action, arguments).
    _due: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = attrs.field(
        factory=list, init=False)
    _queued: int = attrs.field(default=0, init=False)
    _timer: trio.CancelScope | None = attrs.field(default=None, init=False)
    _peer: Peer = attrs.field(init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._peer = Peer(self._address, self._identity.public_key)
        self._counts = dict.fromkeys(attrs.fields_dict(TransportStatistics), 0)

    def __repr__(self) -> str:
        return f"<MemoryTransport {self._address}>"

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
                    await self._carry_out()
                finally:
                    # Stop taking arrivals before the nursery starts closing.
                    self._network._detach(self)
                    self._nursery = None
                    self._handler = None
        finally:
            self._network._detach(self)
            self._due.clear()
            for slot in self._pending.values():
                slot.settle(PeerUnreachable(f"{self._address} stopped serving"))
            self._pending.clear()

    async def request(self, address: str, data: bytes) -> Reply:
        return await self._request(address, data, math.inf)

    async def request_resending(self, address: str, data: bytes, interval: float) -> Reply:
        """Like :meth:`request`, sending a copy again every ``interval`` seconds
        until one copy is answered; a reply to any copy is the reply."""
        return await self._request(address, data, interval)

    async def _request(self, address: str, data: bytes, interval: float) -> Reply:
        if self._nursery is None:
            raise UsageError(f"{self._address} must be serving to send requests")
        self._next_id += 1
        req_id = self._next_id
        slot = ReplySlot()
        self._pending[req_id] = slot
        try:
            self._resend(req_id, address, data, interval)
            return await slot.result()
        finally:
            self._pending.pop(req_id, None)

    def _resend(self, req_id: int, address: str, data: bytes, interval: float) -> None:
        slot = self._pending.get(req_id)
        if slot is None or slot.settled:
            return  # answered, or the caller gave up
        self._counts["requests_sent"] += 1
        self._counts["bytes_sent"] += len(data)
        self._network._transmit(self, address, "request", req_id, data)
        if interval < math.inf:
            self._at(trio.current_time() + interval, self._resend, req_id, address, data,
                     interval)

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

    def _at(self, when: float, action: Callable[..., None], *args: Any) -> None:
        if self._nursery is None:
            return
        self._queued += 1
        heapq.heappush(self._due, (when, self._queued, action, args))
        timer = self._timer
        if timer is not None and when < timer.deadline:
            timer.deadline = when

    async def _carry_out(self) -> None:
        due = self._due
        while True:
            now = trio.current_time()
            while due and due[0][0] <= now:
                _, _, action, args = heapq.heappop(due)
                action(*args)
            with trio.CancelScope(deadline=due[0][0] if due else math.inf) as self._timer:
                await trio.sleep_forever()
            self._timer = None

    def _arrive(self, peer: Peer, kind: str, req_id: int, data: bytes) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._take, peer, kind, req_id, data)

    async def _take(self, peer: Peer, kind: str, req_id: int, data: bytes) -> None:
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

    def _reply_arrives(self, peer: Peer, req_id: int, outcome: bytes | tuple[str, str]) -> None:
        slot = self._pending.get(req_id)
        if slot is None or slot.settled:
            return  # late, duplicated or abandoned
        self._counts["replies_received"] += 1
        if isinstance(outcome, tuple):
            slot.settle(RemoteError(*outcome))
        else:
            self._counts["bytes_received"] += len(outcome)
            slot.settle(Reply(peer, outcome))

    def _refused(self, req_id: int, address: str) -> None:
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

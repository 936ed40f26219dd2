"""The interfaces plugins implement, as :class:`typing.Protocol` classes.

A plugin's factory hook (see :mod:`ketten.hookspecs`) returns an object that
satisfies one of these protocols; the node awaits its methods inside its own
nursery. Conformance suites for each live in :mod:`ketten.testing`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import pluggy
import trio

from ._core.event import Event
from ._core.identity import Identity, node_id_of

__all__ = [
    "Clock",
    "ClockOrder",
    "Delivery",
    "Handler",
    "NodeContext",
    "Overlay",
    "Peer",
    "Reply",
    "Store",
    "StoreReader",
    "Transport",
    "address_proven",
]


@attrs.frozen
class Peer:
    """A remote node as the transport authenticated it."""

    address: str
    public_key: bytes
    node_id: bytes = attrs.field(init=False, eq=False, repr=False)
    """``SHA-256(public_key)``: nobody can claim it without the key."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "node_id", node_id_of(self.public_key))


@attrs.frozen
class Reply:
    """The answer to a request, with the authenticated identity of who sent it."""

    peer: Peer
    data: bytes


class Handler(Protocol):
    """What a transport delivers incoming frames to (the node implements it)."""

    async def handle_request(self, peer: Peer, data: bytes) -> bytes:
        """Answer a request. A raised :class:`~ketten.errors.KettenError` is sent back
        as an error reply; any other exception is a bug and closes the node."""
        ...

    async def handle_message(self, peer: Peer, data: bytes) -> None:
        """Take a one-way message. Nothing is sent back."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Frames between addresses: request/response and one-way messages.

    Frames are opaque bytes. Every frame arrives with the authenticated
    :class:`Peer` that sent it. Calls carry no timeouts of their own: callers
    wrap them in ``trio.move_on_after`` / ``trio.fail_after``.

    A transport may set the attribute ``loses_frames = False`` when it never
    drops a frame silently (TCP: a frame arrives or the connection breaks);
    the node then does not retransmit requests on it. Without the attribute
    the node assumes frames can be lost.

    A transport that loses frames may offer
    ``async request_resending(address, data, interval) -> Reply``: like
    ``request``, sending a copy again every ``interval`` seconds until any copy
    is answered (the memory network does it with a timer, not a task per
    copy). Without it the node sends the copies itself.

    A transport may also offer ``address_proven(peer) -> bool``: whether it
    knows by itself that ``peer`` listens at ``peer.address`` (the memory
    network names each sender by the address it serves at; TCP: this node
    dialed that address and found that key there). Overlays take such a peer
    at once instead of checking the address it claims with a request of their
    own. Without the method every address a peer sends from is only claimed.
    """

    @property
    def address(self) -> str:
        """The address peers reach this transport at (valid once serving)."""
        ...

    async def serve(
        self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept frames until cancelled; call ``task_status.started(address)`` once listening."""
        ...

    async def request(self, address: str, data: bytes) -> Reply:
        """Send a request and wait for its reply.

        Raises :class:`~ketten.errors.PeerUnreachable` when the address refuses,
        :class:`~ketten.errors.RemoteError` when the peer answered with an error.
        A lost request or reply is never answered: time out at the call site.
        """
        ...

    async def send(self, address: str, data: bytes) -> None:
        """Send a one-way message, best effort (it may be lost)."""
        ...

    def statistics(self) -> Any:
        """A frozen snapshot of this transport's counters."""
        ...


def address_proven(transport: Transport, peer: Peer) -> bool:
    """Whether ``transport`` itself knows that ``peer`` listens at ``peer.address``
    (its optional ``address_proven``; see :class:`Transport`). ``False`` when it
    cannot tell: the address is only claimed."""
    proven = getattr(transport, "address_proven", None)
    return bool(proven(peer)) if callable(proven) else False


@runtime_checkable
class Store(Protocol):
    """Durable home of events, chain heads, orphans, command ids and cursors.

    Every method is atomic. An append is durable before it returns.
    """

    async def open(self) -> None:
        """Open (create if needed) the store. Raises :class:`~ketten.errors.StoreFormatError`."""
        ...

    async def aclose(self) -> None:
        """Release files and connections; the store can be opened again later."""
        ...

    async def append(self, events: Sequence[Event]) -> None:
        """Append events, each extending the head of its criterion, all or none.

        Events of one criterion come in seq order. Raises
        :class:`~ketten.errors.StoreConflict` if an event does not extend its
        head (its seq is taken or its ``prev`` is not the head) or reuses a
        command id ``(author, command)`` already in its chain.
        """
        ...

    async def get(self, event_hash: bytes) -> Event | None:
        """The event with this hash, on the main chain or orphaned, or ``None``."""
        ...

    async def head(self, criterion: bytes) -> Event | None:
        """The head of the chain of ``criterion``, or ``None`` if it has none."""
        ...

    async def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        """``{criterion: (head seq, head hash)}`` for every stored chain."""
        ...

    async def range(self, criterion: bytes, start: int = 0, stop: int | None = None) -> list[Event]:
        """Main-chain events with ``start <= seq < stop`` (``stop=None``: to the head), in order."""
        ...

    async def by_command(self, criterion: bytes, author: bytes, command: int) -> Event | None:
        """The main-chain event with this command id in this chain, or ``None``."""
        ...

    async def replace_from(self, criterion: bytes, seq: int, events: Sequence[Event]) -> list[Event]:
        """Orphan the main chain from ``seq`` on and append ``events`` in its place.

        The rule (fork resolution): ``0 <= seq <= height``; ``events`` (possibly
        none) are of ``criterion`` and form a chain whose first event has seq
        ``seq`` and links the kept event at ``seq - 1`` (a genesis if ``seq`` is
        0); none reuses a command id of the kept part. Otherwise nothing
        changes and :class:`~ketten.errors.StoreConflict` is raised. The
        replaced events stay findable by :meth:`get` and listed by
        :meth:`orphans` (oldest first), but no longer by :meth:`by_command`;
        an orphaned branch may later be switched back to. Atomic and durable
        before it returns. Returns the events that became orphans, in seq
        order (``[]`` when ``seq`` is the height). ``ketten.testing.check_store``
        checks all of this.
        """
        ...

    async def orphans(self, criterion: bytes) -> list[Event]:
        """Events that lost a fork, oldest first."""
        ...

    async def drop(self, criterion: bytes) -> int:
        """Remove the whole chain of ``criterion``: main chain and orphans.

        Afterwards the store answers for it as for a chain it never held
        (:meth:`head` is ``None``, :meth:`get` finds none of its events, its
        command ids are free) and a new chain of ``criterion`` may be
        appended from seq 0. Cursors are left alone. Atomic and durable
        before it returns; the space is given back as the store can (see each
        store). Returns how many events went (main chain and orphans; 0 for
        a chain not held). The node drops only copies it does not need: a
        reader's copy collected under ``copies_events``, never a chain it
        replicates.
        """
        ...

    async def get_cursor(self, name: str) -> bytes | None:
        """A stored cursor, or ``None``."""
        ...

    async def put_cursor(self, name: str, value: bytes) -> None:
        """Store a cursor atomically and durably."""
        ...

    async def cursors(self, prefix: str) -> Mapping[str, bytes]:
        """Every cursor whose name starts with ``prefix``, as ``{name: value}``."""
        ...

@runtime_checkable
class StoreReader(Protocol):
    """Synchronous, read-only access to a store on disk, for offline tools.

    The Spark connector and ``ketten verify`` read store directories through
    it. A reader sees a consistent snapshot even while a node writes to the
    same store; it never modifies anything on disk. Damaged data raises
    :class:`~ketten.errors.StoreCorrupted` naming the file and offset.
    """

    def criteria(self) -> list[bytes]:
        """Keys of every stored chain, sorted."""
        ...

    def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        """``{criterion: (head seq, head hash)}``."""
        ...

    def read_encoded(
        self, criterion: bytes, start: int = 0, stop: int | None = None, *, check: bool = True
    ) -> Iterator[tuple[int, bytes]]:
        """``(seq, canonical event bytes)`` of the main chain, ``start <= seq < stop``, in order.

        With ``check`` (the default) the reader proves every record against
        its stored hash and chain position and raises
        :class:`~ketten.errors.StoreCorrupted` on damage. A caller that checks
        hash links itself (``scan_encoded_chain`` with ``Verify.LINKS`` or
        ``FULL``) passes ``check=False`` so the work is not done twice.
        """
        ...

    def orphans_encoded(self, criterion: bytes) -> Iterator[bytes]:
        """Canonical bytes of the orphaned events of a chain, oldest first."""
        ...

    def close(self) -> None:
        """Release files and connections."""
        ...


class ClockOrder(enum.Enum):
    """How two clock stamps relate."""

    BEFORE = "before"
    AFTER = "after"
    EQUAL = "equal"
    CONCURRENT = "concurrent"


@runtime_checkable
class Clock(Protocol):
    """A logical clock, sans-IO. Stamps travel as canonical bytes in events."""

    def stamp(self) -> bytes:
        """Tick for a local event (a send) and return its encoded stamp."""
        ...

    def observe(self, stamp: bytes) -> None:
        """Merge a received stamp. Raises :class:`~ketten.errors.DecodeError`."""
        ...

    def compare(self, a: bytes, b: bytes) -> ClockOrder:
        """Order two encoded stamps. Raises :class:`~ketten.errors.DecodeError`."""
        ...


@runtime_checkable
class Delivery(Protocol):
    """Decides when received events reach the application, sans-IO."""

    def offer(self, event: Event) -> list[Event]:
        """Take a received event; return the events deliverable now, in order."""
        ...

    def pending(self) -> int:
        """How many events are held back.

        A delivery that holds events may also offer ``blocked() -> list[tuple[bytes,
        int]]``: the positions ``(criterion, seq)`` they wait for, earliest first; a
        subscription names the first in :class:`~ketten.errors.DependencyUnavailable`
        when nothing was delivered for its ``patience``.

        A delivery that can give events up may offer ``skip(criterion, seq) ->
        list[Event]``: events of ``criterion`` before ``seq`` will never be
        offered; drop those held and return what now follows. Only such a
        delivery serves a subscription with ``overflow="drop"``."""
        ...


@runtime_checkable
class Overlay(Protocol):
    """Membership and routing: who are the ``count`` nodes closest to a key.

    Closeness is XOR of node id and key unless the overlay has a method
    ``distance(node_id, key) -> int`` (both 32 bytes; smaller is closer), which
    the node then uses wherever it ranks nodes for a key itself.

    An overlay whose membership is restricted may have a method
    ``admits(public_key) -> bool``: the node then remembers near keys (to tell a
    chain that does not exist from one whose brokers are out of reach) only the
    peers it admits, so that strangers cannot stand in for absent members.

    An overlay that can fetch chains from nodes other than their brokers (the
    ``ipfs`` overlay, from the chain's providers) may have a method ``async
    fetch_chain(criterion, *, head, after, policy, timeout, signatures) ->
    list[Event]``: the events that follow ``after`` (the last event this node
    holds, or ``None``) up to ``head`` (a commit position ``(seq, hash)`` the
    chain's leader confirmed; ``policy`` is the chain's writer policy). The
    node calls it with ``signatures=False`` and checks what it gets itself
    (links up to ``head``, signatures, writer policy) before it keeps it; on
    any :class:`~ketten.errors.KettenError` it asks the brokers. It does so
    when it lacks more than ``overlay.fetch_above`` events (an integer
    attribute, default 256); shorter tails come from a broker.

    An overlay may have an integer property ``version`` that changes whenever
    :meth:`nearest` may answer differently (a node came, moved, left or was
    dropped). The node then caches replica sets by it, and its background
    rounds skip chains whose replica set cannot have changed; without one,
    every round looks at every chain, so an idle node's work grows with the
    chains it holds. :func:`ketten.testing.check_overlay` checks the promise."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join the network, call ``task_status.started()``, then maintain it until cancelled."""
        ...

    async def closest(self, key: bytes, count: int) -> list[Peer]:
        """The live nodes (this one included) closest to ``key``, nearest first.

        May run a network lookup."""
        ...

    def nearest(self, key: bytes, count: int) -> list[Peer]:
        """Like :meth:`closest`, from what this node knows now (no network traffic).

        Replica sets are computed from it on the hot path; it must be cheap."""
        ...

    def statistics(self) -> Any:
        """A frozen snapshot of this overlay's counters."""
        ...


class NodeContext(Protocol):
    """What a plugin's factory hook receives: the node it serves, through the parts a
    plugin may use. (:class:`ketten.Node` provides it.)"""

    @property
    def identity(self) -> Identity:
        """The node's key pair (its public key is its identity on the network)."""
        ...

    @property
    def config(self) -> Any:
        """The node's :class:`~ketten.NodeConfig`."""
        ...

    @property
    def address(self) -> str:
        """Where peers reach the node (valid once it serves)."""
        ...

    @property
    def store(self) -> Store:
        ...

    @property
    def transport(self) -> Transport:
        ...

    @property
    def plugins(self) -> pluggy.PluginManager:
        """The plugin manager (``plugins.hook`` calls observer hooks)."""
        ...

    def register_service(self, name: str,
                         handler: Callable[[Peer, Any], Awaitable[Any]]) -> None:
        """Answer requests to ``name`` with ``handler(peer, body)`` (CBOR values)."""
        ...

    def register_message_service(self, name: str,
                                 handler: Callable[[Peer, Any], Awaitable[None]]) -> None:
        """Take one-way messages to ``name``."""
        ...

    async def request(self, address: str, service: str, body: Any, *,
                      timeout: float | None = None,
                      retransmit: bool = False) -> tuple[Peer, Any]:
        """Ask ``service`` at ``address``; the authenticated peer that answered and its reply."""
        ...

    async def notify(self, address: str, service: str, body: Any) -> None:
        """Send a one-way message (it may be lost)."""
        ...

    def now_ms(self) -> int:
        """Wall-clock milliseconds (virtual in simulations)."""
        ...

"""The ``static`` overlay: full membership, learned from seed addresses.

Every node knows every other node. A node says hello to its seeds; the
hello carries the sender's replication factor (peers with another ``r`` are
refused) and the members the sender knows, and so does the reply, so the
membership spreads. Hellos double as liveness pings every ``interval``
seconds: a member that does not answer is marked down until it answers
again. The list is sent only where it can tell something: each hello and
reply carries a digest of the sender's view (its live members and itself),
and a node leaves its list out of a hello to a member whose last digest
matches its own, and out of a reply to a hello whose digest matches, so a
settled network's hellos cost the same whatever its size. One hello and its
reply tell both sides that the other is up and what it knows, so a node
skips its hello to a member whose own hello it answered since its last
round: each pair greets about once per interval, not twice. A member that
has been down for ``evict_after`` seconds leaves the replica sets
(:meth:`StaticOverlay.closest`); until then it keeps its place, so that a
partition or a restart shorter than ``evict_after`` does not move any chain
to other brokers (consistency over availability).

Members are kept in a store cursor, so a node that restarts sees the same
replica sets as before even if it cannot reach its seeds yet. A peer becomes a
member only when a hello this node sent to its address is answered with
its key: an inbound hello makes the node dial the claimed address back (at
most 32 at once), so keys made up at addresses where nobody answers never
become members, never keep a silent member up and are never stored.
Addresses learned from members' lists are candidates (at most 256) until
they answer a hello themselves.

**Admission.** Membership is open unless the network names who may join:
``admit`` lists member public keys (hex), and ``operators`` lists operator
public keys (hex) whose signature over a member's key admits it
(:func:`admission_ticket`; the member passes its own ticket as
``admission``). A peer that is neither listed nor carries a valid ticket is
refused and never enters a replica set, however many identities it makes.

Options (``NodeConfig.options["overlay"]``): ``seeds`` (list of addresses),
``interval`` (seconds, default 1.0), ``evict_after`` (seconds, default
30.0), ``admit``, ``operators``, ``admission``.

Service ``static``: ``{op: "hello", r: int, known?: [[address, public key], ...],
dg?: digest, adm?: ticket}`` -> ``{r: int, known?: [...], dg?: digest, adm?: ticket}``
(``dg``: the first 16 bytes of the SHA-256 of the canonical encoding of the
sender's sorted ``[address, public key]`` pairs of its live members and itself;
without it, the other side sends its list).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ketten import Identity, Option, PluginSpec, hookimpl, verify_signature, wire
from ketten.errors import ConfigError, DecodeError, KettenError, ProtocolError
from ketten.interfaces import Peer
from ketten.wire import field

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["OverlayStatistics", "StaticOverlay", "admission_ticket"]

_MAX_KNOWN = 1024
_MAX_CANDIDATES = 256
_ADMISSION_LABEL = b"ketten-static-admission\x00"
_CURSOR = "overlay/static/members"
_CANDIDATE_TRIES = 3
_DIGEST_SIZE = 16
_MAX_PROOFS = 32
"""Hellos dialled back at once to prove claimed addresses (more wait for the next round)."""


@attrs.frozen
class OverlayStatistics:
    """Counters of a static overlay."""

    members: int
    live: int
    candidates: int
    hellos_sent: int
    hello_failures: int
    hellos_served: int
    refused: int
    lists_sent: int
    """Hellos and replies that carried this node's member list (the others carried
    only its digest: the other side's view was the same)."""


def admission_ticket(operator: Identity, member_key: bytes) -> bytes:
    """The ticket with which ``operator`` admits the node whose public key is
    ``member_key`` to a static network that lists the operator's key."""
    return operator.sign(_ADMISSION_LABEL + member_key)


@attrs.frozen
class Admission:
    """Who may join: nobody is refused when both lists are empty."""

    keys: frozenset[bytes] = frozenset()
    operators: tuple[bytes, ...] = ()

    @property
    def open(self) -> bool:
        return not self.keys and not self.operators

    def admits(self, key: bytes, ticket: Any) -> bool:
        if self.open or key in self.keys:
            return True
        return type(ticket) is bytes and any(
            verify_signature(op, ticket, _ADMISSION_LABEL + key) for op in self.operators)


@attrs.define(eq=False)
class _Member:
    peer: Peer
    node_id: bytes
    down_since: float | None = None
    digest: bytes | None = None
    """The digest of the member's view it sent last."""
    proven: bool = False
    """The member answered a hello this node sent to its address."""
    greeted_in: int = -1
    """The round of this node in which it last answered a hello of the member (at
    its known address)."""


@attrs.define(eq=False)
class StaticOverlay:
    """An :class:`~ketten.interfaces.Overlay` where every node knows every node."""

    node: Node
    seeds: list[str]
    interval: float = 1.0
    evict_after: float = 30.0
    admission: Admission = Admission()
    ticket: bytes | None = None
    """This node's own admission ticket (sent with every hello)."""
    _members: dict[bytes, _Member] = attrs.field(factory=dict, init=False)
    _candidates: dict[str, int] = attrs.field(factory=dict, init=False)
    _dirty: bool = attrs.field(default=False, init=False)
    _proving: set[str] = attrs.field(factory=set, init=False)
    """Claimed addresses being dialled back now."""
    _view: tuple[list[list[Any]], bytes] | None = attrs.field(default=None, init=False)
    _rounds: int = attrs.field(default=0, init=False)
    _version: int = attrs.field(default=0, init=False)
    _evicted: frozenset[bytes] = attrs.field(default=frozenset(), init=False)
    """Members :attr:`version` last saw evicted."""
    _evicts_at: float | None = attrs.field(default=None, init=False)
    """When the next down member may cross ``evict_after`` (``None``: none is down)."""
    _rng: random.Random = attrs.field(init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.node.identity.node_id)
        self._counts = {"hellos_sent": 0, "hello_failures": 0, "hellos_served": 0, "refused": 0,
                        "lists_sent": 0}
        self.node.register_service("static", self._serve)

    # -- Overlay -----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._recall()
        for address in self.seeds:
            if address != self.node.address:
                self._candidates.setdefault(address, 0)
        # Learn the whole membership before anyone asks for replica sets.
        for _ in range(8):
            await self._round()
            if not self._candidates or not self._members:
                break
        task_status.started()
        while True:
            await trio.sleep(self.interval * (0.75 + 0.5 * self._rng.random()))
            await self._round()

    async def closest(self, key: bytes, count: int) -> list[Peer]:
        await trio.lowlevel.checkpoint()
        return self.nearest(key, count)

    def nearest(self, key: bytes, count: int) -> list[Peer]:
        """The ``count`` members closest to ``key`` that are not evicted, this node included."""
        now = trio.current_time()
        me = Peer(self.node.address, self.node.identity.public_key)
        ranked: list[tuple[int, Peer]] = [
            (int.from_bytes(self.node.identity.node_id, "big") ^ int.from_bytes(key, "big"), me)
        ]
        for member in self._members.values():
            if self._is_evicted(member, now):
                continue
            distance = int.from_bytes(member.node_id, "big") ^ int.from_bytes(key, "big")
            ranked.append((distance, member.peer))
        ranked.sort(key=lambda item: item[0])
        return [peer for _, peer in ranked[:count]]

    @property
    def version(self) -> int:
        """Changes whenever :meth:`nearest` may answer differently (callers cache by it):
        a member came, moved, or was evicted or came back after eviction."""
        if self._evicts_at is not None and trio.current_time() >= self._evicts_at:
            self._count_evictions()
        return self._version

    def _count_evictions(self) -> None:
        now = trio.current_time()
        evicted: set[bytes] = set()
        pending: list[float] = []
        for key, member in self._members.items():
            if self._is_evicted(member, now):
                evicted.add(key)
            elif member.down_since is not None:
                pending.append(member.down_since + self.evict_after)
        if evicted != self._evicted:
            self._evicted = frozenset(evicted)
            self._version += 1
        self._evicts_at = min(pending) if pending else None

    def _is_evicted(self, member: _Member, now: float) -> bool:
        return member.down_since is not None and now - member.down_since >= self.evict_after

    def _changed(self) -> None:
        self._version += 1
        self._view = None

    def address_of(self, public_key: bytes) -> str | None:
        """Where the member with this key was last reached, if it is known."""
        member = self._members.get(public_key)
        return None if member is None else member.peer.address

    def admits(self, public_key: bytes) -> bool:
        """Whether a node with this key is a member: any node in an open network,
        else one this node took as a member (named by ``admit``, or with a ticket)."""
        return (self.admission.open or public_key in self.admission.keys
                or public_key in self._members)

    def members(self) -> list[Peer]:
        """Every member this node knows, up or down (not itself)."""
        return [m.peer for m in self._members.values()]

    def live(self) -> list[Peer]:
        """Members that answered their last hello."""
        return [m.peer for m in self._members.values() if m.down_since is None]

    def statistics(self) -> OverlayStatistics:
        return OverlayStatistics(
            members=len(self._members),
            live=sum(1 for m in self._members.values() if m.down_since is None),
            candidates=len(self._candidates),
            **self._counts,
        )

    # -- membership --------------------------------------------------------

    def _known(self) -> tuple[list[list[Any]], bytes]:
        """The live members this node tells others of, and the digest of its view
        (worked out again only after a member came, went down or came back)."""
        if self._view is None:
            out: list[list[Any]] = []
            for member in self._members.values():
                if member.down_since is None:
                    out.append([member.peer.address, member.peer.public_key])
                if len(out) >= _MAX_KNOWN:
                    break
            view = sorted([*out, [self.node.address, self.node.identity.public_key]])
            digest = hashlib.sha256(wire.dumps_canonical(view)).digest()[:_DIGEST_SIZE]
            self._view = out, digest
        return self._view

    def _with_list(self, body: dict[str, Any], theirs: bytes | None) -> dict[str, Any]:
        """``body`` with this node's digest, and its list unless ``theirs`` matches."""
        known, digest = self._known()
        body["dg"] = digest
        if theirs != digest:
            body["known"] = known
            self._counts["lists_sent"] += 1
        return body

    def _claimed(self, peer: Peer) -> None:
        """An inbound hello: ``peer`` claims its address. A member up at that address
        needs nothing more; any other claim (a new key, a member that is down or
        moved) is believed only once a hello sent to the address is answered with
        the key: it is dialled back now (at most ``_MAX_PROOFS`` at once, else as a
        candidate in a coming round). So a peer that makes up keys and addresses
        where nobody answers never becomes a member, never keeps a silent member
        up, and is never stored."""
        known = self._members.get(peer.public_key)
        address = peer.address
        if (peer.public_key == self.node.identity.public_key or address in self._proving
                or (known is not None and known.peer.address == address
                    and known.down_since is None)):
            return
        if len(self._proving) >= _MAX_PROOFS:
            if len(self._candidates) < _MAX_CANDIDATES:
                self._candidates.setdefault(address, 0)
            return
        try:
            self.node.nursery.start_soon(self._prove, address)
        except KettenError:
            return  # the node is closing
        self._proving.add(address)

    async def _prove(self, address: str) -> None:
        try:
            await self._hello(address, None)  # admits whoever answers there with its key
        finally:
            self._proving.discard(address)

    def _admit(self, peer: Peer) -> None:
        """Take ``peer`` as a member at its address: it answered a hello sent there."""
        if peer.public_key == self.node.identity.public_key:
            return
        known = self._members.get(peer.public_key)
        self._candidates.pop(peer.address, None)
        for key, member in list(self._members.items()):
            if member.peer.address == peer.address and key != peer.public_key:
                self._mark_down(member)
        if known is None:
            self._members[peer.public_key] = _Member(peer, peer.node_id, proven=True)
            self._dirty = True
            self._changed()
            self.node.plugins.hook.ketten_peer_joined(node=self.node, peer=peer)
            return
        if known.peer != peer:
            self._dirty = True
            self._changed()
        if known.down_since is not None:
            self._view = None
            if peer.public_key in self._evicted:
                self._evicted = self._evicted - {peer.public_key}
                self._version += 1
        known.peer = peer
        known.down_since = None
        known.proven = True

    def _mark_down(self, member: _Member) -> None:
        """A live member's address went silent, or answers with another key."""
        if member.down_since is None:
            member.down_since = trio.current_time()
            self._view = None
            evicts_at = member.down_since + self.evict_after
            if self._evicts_at is None or evicts_at < self._evicts_at:
                self._evicts_at = evicts_at

    async def _recall(self) -> None:
        """Reload the members known before a restart: a node that comes back
        must see the same replica sets as before, not just its seeds."""
        raw = await self.node.store.get_cursor(_CURSOR)
        if raw is None:
            return
        try:
            entries = wire.loads(raw, max_size=1 << 20, where="static overlay members")
            if type(entries) is not list:
                raise DecodeError("expected a list", where="static overlay members")
            for entry in entries:
                if (type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str
                        or type(entry[1]) is not bytes or len(entry[1]) != 32):
                    raise DecodeError("bad entry", where="static overlay members")
                peer = Peer(entry[0], entry[1])
                if peer.public_key != self.node.identity.public_key:
                    self._members.setdefault(peer.public_key, _Member(peer, peer.node_id))
        except DecodeError:
            self._members.clear()
        self._changed()

    async def _remember(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        entries = [[m.peer.address, m.peer.public_key] for m in self._members.values()]
        await self.node.store.put_cursor(_CURSOR, wire.dumps_canonical(entries))

    def _learn(self, known: Any, where: str) -> None:
        if type(known) is not list or len(known) > _MAX_KNOWN:
            raise DecodeError(f"known must be a list of at most {_MAX_KNOWN} entries", where=where)
        for entry in known:
            if (
                type(entry) is not list
                or len(entry) != 2
                or type(entry[0]) is not str
                or type(entry[1]) is not bytes
            ):
                raise DecodeError("known entries are [address, public key]", where=where)
            address, key = entry
            if key == self.node.identity.public_key or address == self.node.address:
                continue
            if key not in self._members and len(self._candidates) < _MAX_CANDIDATES:
                self._candidates.setdefault(address, 0)

    def _check_r(self, body: Any, where: str) -> None:
        theirs = field(body, "r", int, where=where)
        if theirs != self.node.config.replication:
            self._counts["refused"] += 1
            raise ProtocolError(
                f"replication factor {theirs} differs from this network's "
                f"{self.node.config.replication}"
            )

    async def _serve(self, peer: Peer, body: Any) -> Any:
        if field(body, "op", str, where="hello") != "hello":
            raise ProtocolError("the static overlay only knows 'hello'")
        self._check_r(body, "hello")
        if not self.admission.admits(peer.public_key, body.get("adm")):
            self._counts["refused"] += 1
            raise ProtocolError(f"{peer.node_id.hex()[:16]} is not admitted to this network "
                                "(its key is not listed and it has no valid ticket)")
        self._counts["hellos_served"] += 1
        theirs = _digest(body, "hello")
        self._claimed(peer)
        member = self._members.get(peer.public_key)
        if member is not None and member.peer.address == peer.address:
            # Only a member's list is taken: a claim's comes with the reply to the
            # hello that proves it.
            if "known" in body:
                self._learn(body["known"], "hello")
            member.digest = theirs
            member.greeted_in = self._rounds
        return self._body(self._with_list({"r": self.node.config.replication}, theirs))

    def _body(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.ticket is not None:
            body["adm"] = self.ticket
        return body

    async def _hello(self, address: str, member: _Member | None) -> None:
        self._counts["hellos_sent"] += 1
        body = self._body(self._with_list({"op": "hello", "r": self.node.config.replication},
                                          None if member is None else member.digest))
        timeout = min(self.node.config.request_timeout, self.interval)
        try:
            peer, reply = await self.node.request(address, "static", body, timeout=timeout)
            self._check_r(reply, "hello reply")
            if not self.admission.admits(peer.public_key, reply.get("adm")):
                self._counts["refused"] += 1
                raise ProtocolError(f"{address} is not admitted to this network")
            theirs = _digest(reply, "hello reply")
            if "known" in reply:
                self._learn(reply["known"], "hello reply")
        except KettenError:
            self._counts["hello_failures"] += 1
            if member is not None:
                member.digest = None  # it may come back with another view: tell it ours
                self._mark_down(member)
            else:
                tries = self._candidates.get(address)
                if tries is not None:
                    if tries + 1 >= _CANDIDATE_TRIES and address not in self.seeds:
                        del self._candidates[address]
                    else:
                        self._candidates[address] = tries + 1
            return
        if member is not None and peer.public_key != member.peer.public_key:
            self._mark_down(member)
        self._admit(peer)
        answered = self._members.get(peer.public_key)
        if answered is not None:
            answered.digest = theirs

    async def _round(self) -> None:
        # A member whose hello this node answered since its last round began is up and
        # has heard this node's view in the reply: it needs no hello this round (unless
        # its address was only claimed: a hello to it proves it).
        targets: list[tuple[str, _Member | None]] = [
            (m.peer.address, m) for m in self._members.values()
            if m.down_since is not None or not m.proven or m.greeted_in != self._rounds
        ]
        self._rounds += 1
        addresses = {m.peer.address for m in self._members.values()}
        targets += [(a, None) for a in list(self._candidates) if a not in addresses]
        async with trio.open_nursery() as nursery:
            for address, member in targets:
                nursery.start_soon(self._hello, address, member)
        await self._remember()


def _digest(body: Any, where: str) -> bytes | None:
    """The ``dg`` of a hello or reply (a map already checked; ``None`` if it has none)."""
    if "dg" not in body:
        return None
    digest: bytes = field(body, "dg", bytes, where=where)
    if len(digest) != _DIGEST_SIZE:
        raise DecodeError(f"field 'dg' must be {_DIGEST_SIZE} bytes, not {len(digest)}",
                          where=where)
    return digest


def _number(options: Mapping[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"overlay option {name!r} must be a positive number, got {value!r}")
    return float(value)


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"overlay": ["static"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("overlay", "static"):
        return None
    seconds = (int, float)
    keys = (list, tuple)
    return PluginSpec({
        "seeds": Option("addresses of members to greet", (list, tuple)),
        "interval": Option("seconds between greetings", seconds),
        "evict_after": Option("seconds of silence before a member is dropped", seconds),
        "admit": Option("hex public keys of the members", keys),
        "operators": Option("hex public keys whose tickets admit a member", keys),
        "admission": Option("this node's admission ticket (hex)", str),
    })


@hookimpl
def ketten_make_overlay(name: str, options: Mapping[str, Any], node: Node) -> StaticOverlay | None:
    if name != "static":
        return None
    seeds = options.get("seeds", [])
    if isinstance(seeds, str) or not all(isinstance(s, str) for s in seeds):
        raise ConfigError("overlay option 'seeds' must be a list of addresses")
    admission = Admission(frozenset(_keys(options, "admit")), tuple(_keys(options, "operators")))
    if admission.keys and not admission.operators:
        members = len(admission.keys | {node.identity.public_key})
        if node.config.replication > members:
            raise ConfigError(
                f"replication={node.config.replication} cannot be met: the static overlay "
                f"admits {members} members (the keys of 'admit' and this node); lower "
                f"NodeConfig(replication=...) to at most {members} or admit more members")
    return StaticOverlay(
        node,
        list(seeds),
        interval=_number(options, "interval", 1.0),
        evict_after=_number(options, "evict_after", 30.0),
        admission=admission,
        ticket=_ticket(options),
    )


def _keys(options: Mapping[str, Any], name: str) -> list[bytes]:
    value = options.get(name, [])
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError(f"overlay option {name!r} must be a list of hex public keys")
    keys = []
    for item in value:
        key = _hex(item, 32)
        if key is None:
            raise ConfigError(f"overlay option {name!r}: {item!r:.80} is not a hex public key")
        keys.append(key)
    return keys


def _ticket(options: Mapping[str, Any]) -> bytes | None:
    value = options.get("admission")
    if value is None:
        return None
    ticket = _hex(value, 64)
    if ticket is None:
        raise ConfigError("overlay option 'admission' must be a hex signature (64 bytes)")
    return ticket


def _hex(value: Any, size: int) -> bytes | None:
    """``value`` as ``size`` bytes if it is their hex string, else ``None``."""
    try:
        data = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return data if data is not None and len(data) == size else None

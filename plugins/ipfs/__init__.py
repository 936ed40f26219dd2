"""The ``ipfs`` overlay: Kademlia routing, provider records and a block exchange.

Routing is the ``kademlia`` overlay's (:mod:`ketten.plugins.kademlia`, with
all its options and its S/Kademlia hardening): ``closest(key, r)`` and the
replicated chains work on this overlay as on that one. On top of it, in the
style of IPFS:

* **Provider records** (:mod:`._providers`): a node that holds a chain's blocks
  announces itself as a provider of the chain's key to the ``k`` nodes
  closest to the key, and announces it again every ``republish_interval``;
  records lapse after ``provider_ttl``. A record names the provider the
  transport authenticated: a node can announce only itself.
* **Blocks**: every event is an IPLD block (CIDv1, dag-cbor, sha2-256,
  linking its predecessor's block; :mod:`ketten.ipld`). The chains in the
  node's store are not copied: :mod:`._index` keeps the CID of each event's
  block, computed once as the chain grows, and a block is rebuilt from its
  event when served. Chains fetched from providers (or given to
  :meth:`IpfsOverlay.add_chain`) are kept in a blockstore (:mod:`._blocks`)
  of at most ``blockstore_bytes`` of unpinned blocks, least recently used
  collected first; pinned chains are kept whatever the bound.
* **Head records** (:mod:`._heads`, in the style of IPNS): a node that holds
  a committed copy of a chain puts the block of its commit position at the
  nodes closest to the key, every ``head_interval`` while the copy grows
  and with every provider announcement; a newer seq replaces an older record,
  and a record not put again within ``provider_ttl`` lapses. The block's CID and its author's
  signature are checked before a record is kept; it is a hint for
  :meth:`IpfsOverlay.fetch_chain` without a ``head``, never a proof.
* **Block exchange** (:mod:`._fetch`): :meth:`IpfsOverlay.fetch_chain` fetches
  a chain from several providers at once: one tells where the segments start
  (have), the segments are asked for in parallel (want), every block is
  checked against its CID before it is kept, and the chain is assembled only
  along links from the root. Wrong blocks are rejected and fetched
  elsewhere; a provider that does not answer costs one ``rpc_timeout`` per
  request, never the fetch's deadline. A node that fetched a chain provides
  it too (``provide_fetched``).

Its requests are the node service ``"ipfs"`` (``k``: a key, ``c``: a binary
CID, ``n``: the seq of the block ``c`` names):

* ``{"op": "provide", "key": k}`` -> ``{"ok": bool}`` (the sender provides ``k``)
* ``{"op": "providers", "key": k}`` -> ``{"providers": [[address, public key], ...]}``
* ``{"op": "tip", "key": k[, "seq": n]}`` -> ``{"cid": c, "seq": n}`` or ``{}``: the
  newest block of chain ``k`` held here, or its block at ``n``
* ``{"op": "have", "key": k, "root": c, "seq": n, "stride": s, "count": m}`` ->
  ``{"cids": [...]}``: the CIDs ``0, s, 2s, ...`` links behind ``c``
* ``{"op": "want", "key": k, "root": c, "seq": n, "count": m}`` ->
  ``{"blocks": [...]}``: up to ``m`` blocks from ``c`` back, at most
  ``MAX_WANT_BYTES`` (an empty list: do not have)
* ``{"op": "put_head", "key": k, "cid": c, "block": b}`` -> ``{"ok": bool}``: keep
  the head record ``b`` if it is newer than the one held
* ``{"op": "get_head", "key": k}`` -> ``{"cid": c, "block": b}`` or ``{}``

Options (``NodeConfig.options["overlay"]``): every ``kademlia`` option, and
``provider_ttl`` (seconds, 48 h), ``republish_interval`` (seconds, 12 h, less
than ``provider_ttl``), ``blockstore_bytes`` (256 MiB of unpinned blocks),
``segment`` (blocks per want, 256), ``fetch_parallel`` (requests open per
provider, 2), ``provide_held`` (a node provides the chains in its store,
true), ``provide_fetched`` (a node that fetched a chain provides it, true),
``read_above`` (``node.read()`` on a node that does not replicate a chain
fetches from providers when it lacks more than this many events, 256),
``head_interval`` (seconds between head records of a growing chain, 30).

What it keeps per peer is bounded: provider records per provider, per key
and in all (:class:`._providers.ProviderRecords`), and a request asks for at
most ``MAX_WANT`` blocks or ``MAX_CLAIMS`` CIDs. The CID index costs about
70 bytes of memory per event of the chains in the node's store.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import trio

from ketten import Event, Option, PluginSpec, Verify, WriterPolicy, check_successor, hookimpl
from ketten.errors import (
    ConfigError,
    DecodeError,
    InvalidEvent,
    KettenError,
    ProtocolError,
    QuorumUnavailable,
    UsageError,
)
from ketten.interfaces import Peer
from ketten.ipld import EventBlock, cid_text, decode_block
from ketten.wire import field

from ..kademlia import KademliaOptions, KademliaOverlay, KademliaStatistics, decode_contacts
from ..kademlia import ketten_plugin_spec as _kademlia_spec
from ._blocks import Blockstore
from ._fetch import ChainFetch, FetchRequest, Kind
from ._heads import HeadRecords
from ._index import ChainIndex
from ._providers import ProviderRecords, Republisher

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["IpfsOptions", "IpfsOverlay", "IpfsStatistics"]

SERVICE = "ipfs"
MAX_WANT_BYTES = 1024 * 1024
"""Bytes of blocks in one want answer (always at least one block)."""
MAX_WANT = 4096
"""Blocks one want may ask for."""
MAX_CLAIMS = 4096
"""CIDs one have answer may hold."""
MAX_PROVIDERS = 20
"""Providers one providers answer holds."""
_INDEX_PAGE = 1024
"""Events read from the store at a time to index a chain."""
_SERVE_PAGE = 64
"""Events read from the store at a time to serve a want (events may be large)."""
_ANNOUNCING = 16
_HEADS_PER_ROUND = 256
_EXPIRE_EVERY = 300.0
_TTL = 48 * 3600.0
_REPUBLISH = 12 * 3600.0
_log = logging.getLogger("ketten.ipfs")


@attrs.frozen
class IpfsOptions:
    """The overlay's options, validated."""

    kademlia: KademliaOptions
    provider_ttl: float = _TTL
    republish_interval: float = _REPUBLISH
    blockstore_bytes: int = 256 * 1024 * 1024
    segment: int = 256
    fetch_parallel: int = 2
    provide_fetched: bool = True
    provide_held: bool = True
    read_above: int = 256
    head_interval: float = 30.0

    @classmethod
    def parse(cls, options: Mapping[str, Any], replication: int) -> IpfsOptions:
        """Raises :class:`~ketten.errors.ConfigError` for unknown or bad options."""
        own = {a.name for a in attrs.fields(cls)} - {"kademlia"}
        values: dict[str, Any] = {}
        for name in ("provider_ttl", "republish_interval", "head_interval"):
            if name in options:
                value = options[name]
                if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                    raise ConfigError(f"ipfs option {name!r} must be a positive number")
                values[name] = float(value)
        for name, low in (("blockstore_bytes", 1), ("segment", 1), ("fetch_parallel", 1),
                          ("read_above", 0)):
            if name in options:
                value = options[name]
                if type(value) is not int or value < low:
                    raise ConfigError(f"ipfs option {name!r} must be an integer >= {low}")
                values[name] = value
        if values.get("segment", 1) > MAX_WANT:
            raise ConfigError(f"ipfs option 'segment' must be at most {MAX_WANT}")
        for name in ("provide_fetched", "provide_held"):
            if name in options:
                if type(options[name]) is not bool:
                    raise ConfigError(f"ipfs option {name!r} must be a boolean")
                values[name] = options[name]
        ttl = values.get("provider_ttl", _TTL)
        values.setdefault("republish_interval", min(_REPUBLISH, ttl / 2))
        if values["republish_interval"] >= ttl:
            raise ConfigError("ipfs option 'republish_interval' must be shorter than "
                              "'provider_ttl' (records would lapse before they are renewed)")
        rest = {k: v for k, v in options.items() if k not in own}
        return cls(kademlia=KademliaOptions.parse(rest, replication), **values)


@attrs.frozen
class IpfsStatistics:
    """A snapshot of the overlay's counters."""

    kademlia: KademliaStatistics
    provider_records: int
    """Records this node keeps for others."""
    providing: int
    """Keys this node announces."""
    blocks: int
    block_bytes: int
    blocks_collected: int
    announcements: int
    """Provider records this node placed at other nodes."""
    blocks_served: int
    blocks_fetched: int
    blocks_rejected: int
    """Fetched blocks that did not match their CIDs."""
    fetches: int
    fetches_failed: int
    heads_put: int
    """Head records of this node's chains that other nodes took."""
    head_records: int
    """Head records this node keeps for others."""


def _key(body: Any, name: str, where: str) -> bytes:
    value: bytes = field(body, name, bytes, where=where)
    if len(value) > 64:
        raise DecodeError(f"{name} must be at most 64 bytes", where=where)
    return value


def _seq(body: Any, where: str) -> int:
    value: int = field(body, "seq", int, where=where)
    if value < 0:
        raise DecodeError("seq must not be negative", where=where)
    return value


def _count(body: Any, name: str, where: str, limit: int) -> int:
    value: int = field(body, name, int, where=where)
    if not 1 <= value <= limit:
        raise DecodeError(f"{name} must be between 1 and {limit}", where=where)
    return value


@attrs.define(eq=False)
class IpfsOverlay:
    """Kademlia routing with provider records and a block exchange on top."""

    _node: Node = attrs.field(alias="node", repr=False)
    options: IpfsOptions
    _dht: KademliaOverlay = attrs.field(init=False)
    _records: ProviderRecords = attrs.field(init=False)
    _republisher: Republisher = attrs.field(init=False)
    _index: ChainIndex = attrs.field(factory=ChainIndex, init=False)
    _indexing: dict[bytes, trio.Lock] = attrs.field(factory=dict, init=False)
    _blocks: Blockstore = attrs.field(init=False)
    _heads: HeadRecords = attrs.field(init=False)
    _grown: dict[bytes, None] = attrs.field(factory=dict, init=False)
    """Chains whose copy here grew since their head record was last put."""
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _announcing: trio.Semaphore = attrs.field(factory=lambda: trio.Semaphore(_ANNOUNCING),
                                              init=False)
    """Announcements under way at a time (a node providing many chains republishes
    them in a stream, not all at once)."""
    _counts: dict[str, int] = attrs.field(init=False)

    supports_client: ClassVar[bool] = True

    def __attrs_post_init__(self) -> None:
        self._dht = KademliaOverlay(node=self._node, options=self.options.kademlia)
        self._records = ProviderRecords(ttl=self.options.provider_ttl)
        self._heads = HeadRecords(ttl=self.options.provider_ttl)
        self._republisher = Republisher(interval=self.options.republish_interval)
        self._blocks = Blockstore(max_bytes=self.options.blockstore_bytes)
        self._counts = dict.fromkeys(("announcements", "blocks_served", "blocks_fetched",
                                      "blocks_rejected", "fetches", "fetches_failed",
                                      "heads_put"), 0)

    # -- Overlay (the routing is kademlia's) -------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the kademlia overlay, serve ``"ipfs"``, then announce what this node
        provides when due and forget lapsed records, until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._dht.run)
            self._node.register_service(SERVICE, self._serve)
            nursery.start_soon(self._put_heads)
            task_status.started()
            expire_at = trio.current_time()
            while True:
                now = trio.current_time()
                if now >= expire_at:  # lapsed records are also skipped when read
                    self._records.expire(now)
                    self._heads.expire(now)
                    expire_at = now + min(_EXPIRE_EVERY, self.options.provider_ttl / 4)
                for key in self._republisher.due(now):
                    nursery.start_soon(self._announce, key)
                due = self._republisher.next_due()
                until = now + self.options.republish_interval if due is None else due
                with trio.move_on_at(until):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def closest(self, key: bytes, count: int) -> list[Peer]:
        """See :meth:`KademliaOverlay.closest`."""
        return await self._dht.closest(key, count)

    def nearest(self, key: bytes, count: int) -> list[Peer]:
        """See :meth:`KademliaOverlay.nearest` (the routing table alone)."""
        return self._dht.nearest(key, count)

    @property
    def version(self) -> int:
        """Changes whenever :meth:`nearest` may answer differently."""
        return self._dht.version

    def address_of(self, public_key: bytes) -> str | None:
        """Where the routing table last reached the node with this key, if it knows it."""
        return self._dht.address_of(public_key)

    def admits(self, public_key: bytes) -> bool:
        """Whether a node with this key may join (its id solves the id puzzle)."""
        return self._dht.admits(public_key)

    def siblings(self) -> list[Peer]:
        """The known nodes closest to this node's id, nearest first."""
        return self._dht.siblings()

    @property
    def fetch_above(self) -> int:
        """Events a reading node must lack before it fetches them from providers."""
        return self.options.read_above

    @property
    def dht(self) -> KademliaOverlay:
        """The kademlia overlay underneath (read it, do not drive it)."""
        return self._dht

    def statistics(self) -> IpfsStatistics:
        """A snapshot of the overlay's counters (the kademlia overlay's among them)."""
        return IpfsStatistics(
            kademlia=self._dht.statistics(), provider_records=len(self._records),
            providing=len(self._republisher), blocks=len(self._blocks),
            block_bytes=self._blocks.size, blocks_collected=self._blocks.collected,
            head_records=len(self._heads), **self._counts)

    # -- blocks and providers ----------------------------------------------------

    def add_chain(self, events: Sequence[Event], *, pin: bool = False,
                  provide: bool = True) -> bytes | None:
        """Hold the blocks of ``events`` (a run of one chain from its genesis, or
        following the events added before) and, if ``provide``, announce this node
        as a provider of the chain. Returns the binary CID of the newest block.

        ``pin`` keeps the chain's blocks whatever ``blockstore_bytes`` says.
        Raises :class:`~ketten.errors.UsageError` if the run does not follow on.
        """
        if not events:
            return None
        criterion = events[0].criterion
        if pin:
            self._blocks.pin(criterion)
        blocks = self._blocks.add_events(events)
        if provide:
            self.provide_soon(criterion)
        return blocks[-1].binary

    def tip(self, criterion: bytes) -> bytes | None:
        """The binary CID of the newest block of ``criterion`` this node serves: of
        its store's copy as far as indexed, else of the blockstore's."""
        found = self._index.tip(criterion)
        return found[0] if found is not None else self._blocks.tip(criterion)

    def unpin(self, criterion: bytes) -> None:
        """Let the chain's blocks be collected when the blockstore is full."""
        self._blocks.unpin(criterion)

    def provide_soon(self, key: bytes) -> None:
        """Announce this node as a provider of ``key`` now and every
        ``republish_interval`` (by the running overlay)."""
        if self._republisher.provide(key, trio.current_time()):
            self._wake.set()

    def stop_providing(self, key: bytes) -> None:
        """Stop announcing ``key``; the records elsewhere lapse after ``provider_ttl``."""
        self._republisher.stop(key)

    async def provide(self, key: bytes) -> int:
        """Announce this node as a provider of ``key`` to the ``k`` nodes closest to
        it, now; how many took the record. (The overlay renews it.)"""
        self._republisher.provide(key, trio.current_time())
        return await self._announce(key)

    async def _announce(self, key: bytes) -> int:
        if self.options.provide_held:
            self._grown[key] = None  # its head record goes out again with it
        async with self._announcing:
            return await self._announce_now(key)

    async def _announce_now(self, key: bytes) -> int:
        taken = await self._place(key, {"op": "provide", "key": key}, "provider record",
                                  lambda own: self._records.add(key, own, trio.current_time()))
        self._counts["announcements"] += taken
        if not taken:
            self._republisher.failed(key, trio.current_time(),
                                     retry=min(60.0, self.options.republish_interval))
        return taken

    async def _place(self, key: bytes, body: dict[str, Any], what: str,
                     local: Callable[[Peer], bool]) -> int:
        """Send the record ``body`` to the ``k`` nodes closest to ``key`` (``local``
        takes it when this node is one of them); how many took it."""
        own = self._node.identity.public_key
        try:
            closest = await self._dht.closest(_dht_key(key), self.options.kademlia.k)
        except KettenError as exc:
            _log.debug("no nodes found to take the %s of %s: %s", what, key.hex()[:16], exc)
            return 0
        taken = 0

        async def one(peer: Peer) -> None:
            nonlocal taken
            if peer.public_key == own:
                taken += local(peer)
                return
            try:
                _, answer = await self._rpc(peer, body)
                taken += field(answer, "ok", bool, where=f"ipfs {body['op']} answer")
            except KettenError as exc:
                _log.debug("%s did not take the %s of %s: %s", peer.address, what,
                           key.hex()[:16], exc)

        async with trio.open_nursery() as nursery:
            for peer in closest:
                nursery.start_soon(one, peer)
        return taken

    async def find_providers(self, key: bytes, count: int = MAX_PROVIDERS) -> list[Peer]:
        """Up to ``count`` providers of ``key``, asked of the nodes closest to it (this
        node included); the most recently announced first, no duplicates."""
        if type(count) is not int or count < 1:
            raise UsageError("count must be a positive integer")
        closest = await self._dht.closest(_dht_key(key), self.options.kademlia.k)
        own = self._node.identity.public_key
        found: dict[bytes, Peer] = {}
        for peer in self._records.providers(key, trio.current_time()):
            found.setdefault(peer.public_key, peer)

        async def one(peer: Peer) -> None:
            try:
                _, answer = await self._rpc(peer, {"op": "providers", "key": key})
                for contact in decode_contacts(answer, self.options.kademlia.puzzle_difficulty,
                                               MAX_PROVIDERS, name="providers",
                                               where="ipfs providers answer"):
                    found.setdefault(contact.peer.public_key, contact.peer)
            except KettenError as exc:
                _log.debug("%s named no providers of %s: %s", peer.address, key.hex()[:16], exc)

        async with trio.open_nursery() as nursery:
            for peer in closest:
                if peer.public_key != own:
                    nursery.start_soon(one, peer)
        return list(found.values())[:count]

    async def fetch_chain(self, criterion: bytes, *, head: tuple[int, bytes] | None = None,
                          after: Event | None = None, policy: WriterPolicy | None = None,
                          providers: Sequence[Peer] | None = None,
                          timeout: float = 30.0, signatures: bool = True) -> list[Event]:
        """The events of ``criterion`` from its providers (or ``providers``), checked.

        ``head`` is the ``(seq, hash)`` the chain must end at (a commit position
        its brokers confirmed). Without it, the chain is fetched up to the
        newest head record (:meth:`head_record`), else the highest tip the
        providers name: a valid chain, but only as current as those hints.
        Either way every event is checked against its predecessor, the writer
        policy and its signature, as events from a broker are; ``signatures=False``
        leaves the last two to a caller that checks the events again anyway
        (the node does, before it keeps them). ``after`` is the last event this node already holds (only
        what follows it is fetched; ``policy`` is then the chain's writer
        policy). Every block is checked against its CID first. A node that
        fetched a chain provides it too unless ``provide_fetched`` is off.

        Raises :class:`~ketten.errors.QuorumUnavailable` if no provider served the
        chain by ``timeout``, :class:`~ketten.errors.InvalidEvent` if what the
        providers served does not form a valid chain (ending at ``head``).
        """
        if type(criterion) is not bytes or len(criterion) != 32:
            raise UsageError("a criterion key is 32 bytes")
        if head is not None and after is not None and head[0] <= after.seq:
            return []
        deadline = trio.current_time() + timeout
        self._counts["fetches"] += 1
        try:
            with trio.move_on_at(deadline):
                own = self._node.identity.public_key
                sources = [p for p in (list(providers) if providers is not None
                                       else await self.find_providers(criterion))
                           if p.public_key != own]
                failure: KettenError | None = None
                candidates = await self._tips(criterion, sources, head)
                if head is None:
                    record = await self.head_record(criterion)
                    if record is not None:
                        candidates.insert(0, (record.binary, record.event.seq, sources))
                for root, seq, named in candidates:
                    try:
                        blocks = await self._fetch(criterion, root, seq, named, deadline,
                                                   0 if after is None else after.seq + 1)
                        events = _checked(criterion, blocks, head, after, policy,
                                          Verify.FULL if signatures else Verify.LINKS)
                    except (InvalidEvent, QuorumUnavailable) as exc:
                        failure = exc  # a tip that does not hold: try the next
                        continue
                    self._keep_fetched(criterion, blocks)
                    return events
                if failure is not None:
                    raise failure
                raise QuorumUnavailable(f"no provider of criterion {criterion.hex()[:16]} "
                                        "named a tip" + ("" if head is None else
                                                         f" at seq {head[0]}"))
            raise QuorumUnavailable(f"the providers of criterion {criterion.hex()[:16]} did "
                                    f"not serve it within {timeout} s")
        except KettenError:
            self._counts["fetches_failed"] += 1
            raise

    async def _tips(self, criterion: bytes, sources: list[Peer], head: tuple[int, bytes] | None,
                    ) -> list[tuple[bytes, int, list[Peer]]]:
        """The tips the providers name (at ``head``'s seq, if given): the most named
        at the highest seq first, each with every provider (the ones that named
        it first: older tips share the chain's earlier blocks)."""
        tips: dict[bytes, tuple[int, list[Peer]]] = {}
        body: dict[str, Any] = {"op": "tip", "key": criterion}
        if head is not None:
            body["seq"] = head[0]

        async def one(peer: Peer) -> None:
            try:
                _, answer = await self._rpc(peer, body)
                if not isinstance(answer, dict) or "cid" not in answer:
                    return
                cid = _key(answer, "cid", "ipfs tip answer")
                seq: int = field(answer, "seq", int, where="ipfs tip answer")
                if seq < 0 or (head is not None and seq != head[0]):
                    raise ProtocolError(f"{peer.address} named a tip at seq {seq}")
                tips.setdefault(cid, (seq, []))[1].append(peer)
            except KettenError as exc:
                _log.debug("%s named no tip of %s: %s", peer.address, criterion.hex()[:16], exc)

        async with trio.open_nursery() as nursery:
            for peer in sources:
                nursery.start_soon(one, peer)
        ranked = sorted(tips.items(), key=lambda item: (-item[1][0], -len(item[1][1])))
        return [(cid, seq, named + [p for p in sources if p not in named])
                for cid, (seq, named) in ranked[:4]]

    async def _fetch(self, criterion: bytes, root: bytes, root_seq: int, providers: list[Peer],
                     deadline: float, stop_seq: int) -> list[EventBlock]:
        fetch = ChainFetch(root, root_seq, providers, deadline, segment=self.options.segment,
                           per_provider=self.options.fetch_parallel, stop_seq=stop_seq)
        send, receive = trio.open_memory_channel[tuple[FetchRequest, Any]](0)

        async def ask(request: FetchRequest) -> None:
            answer: list[bytes] | None = None
            body = {"op": request.kind.value, "key": criterion, "root": request.root,
                    "seq": request.seq, "count": request.count}
            try:
                if request.kind is Kind.HAVE:
                    body["stride"] = request.stride
                    _, reply = await self._rpc(request.provider, body)
                    answer = _bytes_list(reply, "cids", "ipfs have answer", request.count)
                else:
                    _, reply = await self._rpc(request.provider, body)
                    answer = _bytes_list(reply, "blocks", "ipfs want answer", request.count)
            except KettenError as exc:
                _log.debug("%s %s of %s failed: %s", request.provider.address,
                           request.kind.value, root.hex()[:16], exc)
            await send.send((request, answer))

        async with trio.open_nursery() as nursery:
            waiting = 0
            while not fetch.done and fetch.error is None:
                for request in fetch.requests(trio.current_time()):
                    waiting += 1
                    nursery.start_soon(ask, request)
                if fetch.done or fetch.error is not None or not waiting:
                    break
                request, answer = await receive.receive()
                waiting -= 1
                fetch.answered(request, answer)
            nursery.cancel_scope.cancel()
        self._counts["blocks_rejected"] += fetch.rejected
        if fetch.error is not None or not fetch.done:
            raise QuorumUnavailable(f"fetch of {criterion.hex()[:16]} from block "
                                    f"{cid_text(root)}: {fetch.error or 'no provider answered'}")
        self._counts["blocks_fetched"] += len(fetch.result)
        return fetch.result

    def _keep_fetched(self, criterion: bytes, blocks: list[EventBlock]) -> None:
        if not self.options.provide_fetched or not blocks or criterion in self._index:
            return
        tip = self._blocks.tip_seq(criterion)
        fresh = [b.event for b in blocks if b.event.seq > (-1 if tip is None else tip)]
        if not fresh or fresh[0].seq != (0 if tip is None else tip + 1):
            return  # only a run that follows what the cache holds can be linked
        try:
            self._blocks.add_events(fresh)
        except UsageError:
            return
        self.provide_soon(criterion)

    async def _rpc(self, peer: Peer, body: Any) -> tuple[Peer, Any]:
        responder, answer = await self._node.request(
            peer.address, SERVICE, body, timeout=self.options.kademlia.rpc_timeout,
            retransmit=True)
        if responder.public_key != peer.public_key:
            raise ProtocolError(f"{peer.address} answered with another key")
        return responder, answer

    # -- the node's chains ---------------------------------------------------------

    def held(self, event: Event) -> None:
        """The node stored ``event``: provide its chain (once, then renewed) and put
        its head record when next due."""
        if self.options.provide_held:
            if event.criterion not in self._republisher:
                self.provide_soon(event.criterion)
            self._grown[event.criterion] = None

    async def _put_heads(self) -> None:
        while True:
            await trio.sleep(self.options.head_interval)
            # A bounded batch per round, oldest growth first; the rest waits its turn.
            grown = list(itertools.islice(self._grown, _HEADS_PER_ROUND))
            for criterion in grown:
                del self._grown[criterion]
            for criterion in grown:
                try:
                    await self.put_head(criterion)
                except KettenError as exc:
                    _log.debug("head record of %s not put: %s", criterion.hex()[:16], exc)

    async def put_head(self, criterion: bytes) -> int:
        """Put the head record of this node's committed copy of ``criterion`` at the
        ``k`` nodes closest to its key (the overlay does so every ``head_interval``
        while the copy grows); how many took it."""
        commit = await self._node.local_commit(criterion)
        if commit is None:
            return 0
        await self._indexed(criterion)
        events = await self._node.store.range(criterion, commit[0], commit[0] + 1)
        blocks = self._index.blocks(criterion, commit[0], events)
        if not blocks or blocks[0].event.hash != commit[1]:
            return 0
        block = blocks[0]
        body = {"op": "put_head", "key": criterion, "cid": block.binary, "block": block.data}
        taken = await self._place(
            criterion, body, "head record",
            lambda own: self._heads.offer(criterion, block.binary, commit[0], block.data,
                                          own.public_key, trio.current_time()))
        self._counts["heads_put"] += taken
        return taken

    async def head_record(self, criterion: bytes) -> EventBlock | None:
        """The newest head record of ``criterion`` the nodes closest to its key hold:
        the block of a committed head, its CID and the event's signature checked.
        A hint (a node that lies can name an older head); :meth:`ketten.Node.read`
        asks the chain's leader instead."""
        found: list[EventBlock] = []
        record = self._heads.get(criterion, trio.current_time())
        if record is not None:
            found.append(decode_block(record.cid, record.block))
        own = self._node.identity.public_key

        async def one(peer: Peer) -> None:
            try:
                _, answer = await self._rpc(peer, {"op": "get_head", "key": criterion})
                if isinstance(answer, dict) and answer:
                    found.append(_head_block(answer, criterion, "ipfs get_head answer"))
            except KettenError as exc:
                _log.debug("%s named no head of %s: %s", peer.address, criterion.hex()[:16],
                           exc)

        closest = await self._dht.closest(_dht_key(criterion), self.options.kademlia.k)
        async with trio.open_nursery() as nursery:
            for peer in closest:
                if peer.public_key != own:
                    nursery.start_soon(one, peer)
        return max(found, key=lambda b: (b.event.seq, b.binary), default=None)

    def cut(self, criterion: bytes, head: Event | None) -> None:
        """The node cut its copy of ``criterion`` back to ``head``: its CIDs are
        indexed again; a copy given up entirely is no longer provided (unless the
        blockstore holds the chain)."""
        self._index.cut(criterion, 0)
        if head is None and self._blocks.tip(criterion) is None:
            self._republisher.stop(criterion)

    async def _indexed(self, criterion: bytes) -> None:
        """Index the chain of ``criterion`` in the node's store up to its head."""
        lock = self._indexing.setdefault(criterion, trio.Lock())
        try:
            async with lock:
                store = self._node.store
                head = await store.head(criterion)
                if head is None:
                    self._index.cut(criterion, 0)
                    return
                if self._index.length(criterion) > head.seq + 1:
                    self._index.cut(criterion, 0)
                start = self._index.length(criterion)
                while start <= head.seq:
                    events = await store.range(criterion, start,
                                               min(start + _INDEX_PAGE, head.seq + 1))
                    if not events or not self._index.extend(events):
                        return  # the chain changed while read: indexed again when asked
                    start += len(events)
        finally:
            if not lock.statistics().tasks_waiting:
                self._indexing.pop(criterion, None)

    # -- serving -----------------------------------------------------------------

    async def _serve(self, peer: Peer, body: Any) -> Any:
        op = field(body, "op", str, where="ipfs request")
        where = f"ipfs {op} request"
        now = trio.current_time()
        if op == "provide":
            key = _key(body, "key", where)
            return {"ok": self._records.add(key, peer, now)}
        if op == "providers":
            key = _key(body, "key", where)
            found = self._records.providers(key, now, MAX_PROVIDERS)
            return {"providers": [[p.address, p.public_key] for p in found]}
        if op == "tip":
            key = _key(body, "key", where)
            seq = _seq(body, where) if "seq" in body else None
            return await self._tip(key, seq)
        if op == "put_head":
            key = _key(body, "key", where)
            block = _head_block(body, key, where)
            return {"ok": self._heads.offer(key, block.binary, block.event.seq, block.data,
                                            peer.public_key, now)}
        if op == "get_head":
            record = self._heads.get(_key(body, "key", where), now)
            return {} if record is None else {"cid": record.cid, "block": record.block}
        if op in ("have", "want"):
            key = _key(body, "key", where)
            root = _key(body, "root", where)
            seq = _seq(body, where)
            if self._index.cid(key, seq) is None:
                await self._indexed(key)
            if op == "have":
                stride = _count(body, "stride", where, 1 << 32)
                count = _count(body, "count", where, MAX_CLAIMS)
                cids = (self._index.strides(key, seq, root, stride, count)
                        or self._blocks.strides(root, stride, count))
                return {"cids": cids}
            count = _count(body, "count", where, MAX_WANT)
            blocks = await self._want(key, root, seq, count)
            self._counts["blocks_served"] += len(blocks)
            return {"blocks": blocks}
        raise ProtocolError(f"unknown ipfs operation {op!r}")

    async def _tip(self, key: bytes, seq: int | None) -> dict[str, Any]:
        await self._indexed(key)
        if seq is None:
            found = self._index.tip(key)
            if found is not None:
                return {"cid": found[0], "seq": found[1]}
            cached = self._blocks.tip(key)
            cached_seq = self._blocks.tip_seq(key)
            return {} if cached is None else {"cid": cached, "seq": cached_seq}
        cid = self._index.cid(key, seq) or self._blocks.cid_at(key, seq)
        return {} if cid is None else {"cid": cid, "seq": seq}

    async def _want(self, key: bytes, root: bytes, seq: int, count: int) -> list[bytes]:
        if self._index.cid(key, seq) != root:
            return self._blocks.walk(root, count, MAX_WANT_BYTES)
        out: list[bytes] = []
        size = 0
        top = seq
        while len(out) < count and top >= 0:
            low = max(0, top - min(count - len(out), _SERVE_PAGE) + 1)
            events = await self._node.store.range(key, low, top + 1)
            blocks = self._index.blocks(key, top, events[::-1])
            for block in blocks:
                if out and size + len(block.data) > MAX_WANT_BYTES:
                    return out
                out.append(block.data)
                size += len(block.data)
            if len(blocks) < top - low + 1:
                break
            top = low - 1
        return out


def _dht_key(key: bytes) -> bytes:
    """The 32-byte key records of ``key`` are kept under (a criterion key is one)."""
    return key if len(key) == 32 else hashlib.sha256(key).digest()


def _head_block(body: Any, key: bytes, where: str) -> EventBlock:
    """The head block in ``body`` (``cid``, ``block``), checked: its CID, its layout,
    its criterion and its author's signature. Raises :class:`DecodeError`,
    :class:`ProtocolError`, :class:`~ketten.errors.InvalidSignature`."""
    cid = _key(body, "cid", where)
    data: bytes = field(body, "block", bytes, where=where)
    block = decode_block(cid, data)
    if block.event.criterion != key:
        raise ProtocolError(f"{where}: the block is of another criterion")
    block.event.verify()
    return block


def _bytes_list(body: Any, name: str, where: str, limit: int) -> list[bytes]:
    items: list[bytes] = field(body, name, list, where=where)
    if len(items) > limit:
        raise ProtocolError(f"{where} held {len(items)} items, more than the {limit} asked for")
    if not all(type(item) is bytes for item in items):
        raise DecodeError(f"{name} must be a list of byte strings", where=where)
    return items


def _checked(criterion: bytes, blocks: list[EventBlock], head: tuple[int, bytes] | None,
             after: Event | None, policy: WriterPolicy | None, verify: Verify) -> list[Event]:
    """The events of ``blocks``, checked as a chain following ``after`` and ending at
    ``head``. Raises :class:`~ketten.errors.InvalidEvent`."""
    prev = after
    events: list[Event] = []
    for block in blocks:
        event = block.event
        if event.criterion != criterion:
            raise InvalidEvent(f"a provider served seq {event.seq} of another criterion")
        check_successor(prev, event, policy=policy, verify=verify)
        if event.seq == 0:
            policy = WriterPolicy.of(event)
        events.append(event)
        prev = event
    if head is not None and (prev is None or (prev.seq, prev.hash) != head):
        raise InvalidEvent(f"the providers' chain of {criterion.hex()[:16]} does not end at "
                           f"seq {head[0]}")
    return events


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"overlay": ["ipfs"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("overlay", "ipfs"):
        return None
    base = _kademlia_spec(kind="overlay", name="kademlia")
    assert base is not None
    seconds = (int, float)
    return PluginSpec({
        **base.options,
        "provider_ttl": Option("seconds a provider record lives unless renewed", seconds),
        "republish_interval": Option("seconds between announcements of a provided key",
                                     seconds),
        "blockstore_bytes": Option("bytes of unpinned blocks kept", int),
        "segment": Option("blocks asked for in one want", int),
        "fetch_parallel": Option("requests open per provider during a fetch", int),
        "provide_fetched": Option("a node that fetched a chain provides it", bool),
        "provide_held": Option("a node provides the chains in its store", bool),
        "read_above": Option("events a read must lack to fetch them from providers", int),
        "head_interval": Option("seconds between head records of a growing chain", seconds),
    })


@hookimpl
def ketten_event_appended(node: Node, event: Event) -> None:
    overlay = node.overlay
    if isinstance(overlay, IpfsOverlay):
        overlay.held(event)


@hookimpl
def ketten_fork_resolved(node: Node, criterion: bytes, orphaned: Sequence[Event],
                         head: Event | None) -> None:
    overlay = node.overlay
    if isinstance(overlay, IpfsOverlay):
        overlay.cut(criterion, head)


@hookimpl
def ketten_chain_dropped(node: Node, criterion: bytes) -> None:
    overlay = node.overlay
    if isinstance(overlay, IpfsOverlay):
        overlay.cut(criterion, None)


@hookimpl
def ketten_make_overlay(name: str, options: Mapping[str, Any], node: Node) -> IpfsOverlay | None:
    if name != "ipfs":
        return None
    return IpfsOverlay(node=node, options=IpfsOptions.parse(options, node.config.replication))

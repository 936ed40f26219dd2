"""``Reader``: the trio driver of :class:`~ketten._core.read.ReadAttempt`, and the
reading of committed events.

It asks a chain's leader for its confirmed commit position (the attempt
decides whom to ask and when), then returns the committed events: from this
node's copy when it holds the commit, else fetched from the chain's brokers,
or, for a long stretch and an overlay that can (``fetch_chain``, as the
``ipfs`` overlay has), from any nodes that provide the chain.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .._core.event import Event
from .._core.membership import Member, Pos
from .._core.messages import CommitQuery, CommitReply
from .._core.read import ReadAction, ReadAttempt, ReadStep
from ..errors import KettenError, QuorumUnavailable
from .broker import Broker
from .local_chains import LocalChains
from .replica_sets import Creation, ReplicaSets
from .replicator import Replicator
from .rpc import Rpc

__all__ = ["Reader"]


@attrs.define(eq=False, repr=False)
class Reader:
    """Reads committed events, from any node."""

    rpc: Rpc
    chains: LocalChains
    sets: ReplicaSets
    replicator: Replicator
    broker: Broker
    own: bytes
    """This node's public key."""
    rng: random.Random
    fetch_chain: Callable[..., Awaitable[list[Event]]] | None = None
    """The overlay's ``fetch_chain`` (see :class:`~ketten.interfaces.Overlay`), if it has one."""
    fetch_above: int = 256
    """Events a reader's copy must lack before they are fetched from providers."""
    fetch_timeout: float = 30.0
    _steps: dict[ReadStep, Callable[[bytes, ReadAttempt, ReadAction], Awaitable[None]]] = (
        attrs.field(init=False))

    def __attrs_post_init__(self) -> None:
        self._steps = {ReadStep.ROUTE: self._route, ReadStep.ASK: self._ask,
                       ReadStep.WAIT: self._wait, ReadStep.FAIL: self._fail}

    async def committed_head(self, key: bytes, until: float) -> tuple[Pos | None, Member | None]:
        """The leader's confirmed commit position and a member that holds it.

        Raises :class:`~ketten.errors.QuorumUnavailable` if no leader confirmed
        one by ``until``."""
        attempt = ReadAttempt(key, until, self.rng)
        while (action := attempt.next(trio.current_time())).step is not ReadStep.DONE:
            await self._steps[action.step](key, attempt, action)
        return action.commit, action.source

    # -- the steps of a read attempt -------------------------------------------------

    async def _fail(self, key: bytes, attempt: ReadAttempt, action: ReadAction) -> None:
        raise QuorumUnavailable(f"no leader of criterion {key.hex()[:16]} confirmed a "
                                f"commit position in time ({action.message})")

    async def _wait(self, key: bytes, attempt: ReadAttempt, action: ReadAction) -> None:
        await trio.sleep_until(action.until)

    async def _route(self, key: bytes, attempt: ReadAttempt, action: ReadAction) -> None:
        try:
            found = await self.sets.route(key, refresh=action.refresh)
        except KettenError as exc:
            attempt.routed(None, trio.current_time(), error=str(exc))
            return
        attempt.routed(None if isinstance(found, Creation) else found, trio.current_time(),
                       absent=isinstance(found, Creation))

    async def _ask(self, key: bytes, attempt: ReadAttempt, action: ReadAction) -> None:
        assert action.target is not None
        reply = await self._ask_commit(key, action.target, action.urge, attempt.deadline)
        self.sets.answered(key, None if reply is None else reply.route)
        attempt.answered(action.target, reply, trio.current_time())

    async def _ask_commit(self, key: bytes, target: Member, urge: bool,
                          until: float) -> CommitReply | None:
        if target.key == self.own:
            try:
                return await self.broker.commit(key, urge=urge)
            except KettenError:
                return None
        with trio.move_on_after(max(0.01, until - trio.current_time())):
            try:
                _, reply = await self.rpc.call(self.sets.address(target),
                                               CommitQuery(key, urge), retransmit=True,
                                               expect=target.key)
            except KettenError:
                return None
            return reply if isinstance(reply, CommitReply) else None
        return None

    async def committed(self, key: bytes, commit: Pos, source: Member | None,
                        since: int) -> list[Event]:
        """The committed events of ``key`` from ``since`` up to ``commit``.

        A copy of this node's own that holds ``commit`` answers alone. A
        reader's copy (no replication state here) is extended with the
        missing committed events; a chain this node is a member of changes
        only through its leader, so what it lacks is fetched and not kept.
        Raises :class:`~ketten.errors.QuorumUnavailable` if no broker served
        them, :class:`~ketten.errors.StoreCorrupted` if this node's copy is
        damaged.
        """
        chains = self.chains
        if await chains.hash_at(key, commit[0]) == commit[1]:
            return await chains.range(key, max(since, 0), commit[0] + 1)
        route = self.sets.cached(key)
        sources = ([source] if source is not None else []) + (
            list(route.config.members()) if route is not None else [])
        sources = [member for member in sources if member.key != self.own]
        if not self.replicator.holds(key):
            if self.fetch_chain is not None:
                await self._from_providers(key, commit)
                if await chains.hash_at(key, commit[0]) == commit[1]:
                    return await chains.range(key, max(since, 0), commit[0] + 1)
            for member in sources:
                await self.replicator.pull_committed(self.sets.address(member), key)
                if await chains.hash_at(key, commit[0]) == commit[1]:
                    return await chains.range(key, max(since, 0), commit[0] + 1)
            raise _unserved(key, commit)
        await self.replicator.repair(key)
        replica = self.replicator.loaded(key)
        base = None if replica is None else replica.commit
        if base is not None and await chains.hash_at(key, base[0]) != base[1]:
            base = None
        if base is not None and base[0] >= commit[0]:
            base = None
        prefix = [] if base is None else await chains.range(key, max(since, 0), base[0] + 1)
        for member in sources:
            try:
                tail = await self.replicator.fetch_committed(self.sets.address(member), key,
                                                             base, commit)
            except KettenError:
                continue
            if tail and tail[-1].seq == commit[0] and tail[-1].hash == commit[1]:
                return prefix + [e for e in tail if e.seq >= since]
        raise _unserved(key, commit)

    async def _from_providers(self, key: bytes, commit: Pos) -> None:
        """Extend this node's copy towards ``commit`` from the chain's providers, when
        it lacks more than :attr:`fetch_above` events (a short tail is one request
        to a broker). What they serve is kept only if it links to ``commit`` and
        every event checks out as from a broker; a failure leaves the brokers to
        serve it."""
        assert self.fetch_chain is not None
        head = await self.chains.head(key)
        if commit[0] - (-1 if head is None else head.seq) <= self.fetch_above:
            return
        policy: Any = None if head is None else await self.chains.policy(key)
        try:
            # Signatures and the writer policy are checked once, by accept_committed.
            events = await self.fetch_chain(key, head=commit, after=head, policy=policy,
                                            timeout=self.fetch_timeout, signatures=False)
            await self.chains.accept_committed(key, events)
        except KettenError:
            pass


def _unserved(key: bytes, commit: Pos) -> QuorumUnavailable:
    return QuorumUnavailable(f"no broker of criterion {key.hex()[:16]} served its "
                             f"committed events up to seq {commit[0]}")

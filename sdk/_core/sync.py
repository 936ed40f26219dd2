"""Anti-entropy between brokers, sans-IO: one digest exchange per peer pair over
every chain the two share.

A chain's *entry* is ``(criterion, epoch, commit seq)``. The chains two
brokers share fall into 16 buckets by the first four bits of their key; a
bucket's digest is the XOR of 128-bit hashes of its entries, so it is the
same on both sides exactly when (but for hash collisions) their entries in
it are. A round with one peer:

1. send the 16 bucket digests (:meth:`SyncRound.request`);
2. the peer answers with its own (:meth:`Digests.buckets_for`); if all
   match, the two are in step and the peer is asked less often
   (:class:`DigestPacing`);
3. otherwise list the entries of the differing buckets
   (:meth:`SyncRound.on_buckets`); the peer answers with its entries of them
   and pulls what it is behind in (:meth:`Digests.answer_listing`), and this
   side pulls the chains where the peer is ahead.

Bucket digests are kept per peer until something changes on this node (the
caller's *activity* count), and the hash of each entry until the entry
changes, so an idle round costs a few dictionary lookups per peer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from .messages import _DIGEST_BUCKETS as BUCKETS
from .messages import Digest, DigestReply
from .pacing import DigestPacing

__all__ = ["BUCKETS", "Digests", "Entry", "SyncRound", "bucket_of"]

MAX_FOREIGN = BUCKETS * 64
"""Entries of chains a peer lists but this node does not share with it that one
answer looks at (a confused or hostile peer may list many)."""

Entry = tuple[bytes, int, int]
"""``(criterion, epoch, commit seq)``; epoch 0 and seq -1: nothing of the chain."""


def bucket_of(criterion: bytes) -> int:
    return criterion[0] >> 4


@attrs.define(eq=False)
class SyncRound:
    """One digest exchange with the peer ``key`` over ``chains``, begun in background
    round ``round_`` at activity count ``activity``."""

    key: bytes
    chains: Sequence[bytes]
    mine: tuple[bytes, ...]
    round_: int
    activity: int
    _pacing: DigestPacing

    def request(self) -> Digest:
        return Digest(self.mine)

    def failed(self) -> None:
        """The peer did not answer: exchange with it every round until it does."""
        self._pacing.out_of_step(self.key)

    def on_buckets(self, answered_by: bytes, reply: DigestReply,
                   entry: Callable[[bytes], Entry]) -> Digest | None:
        """The peer's bucket digests: the request listing this side's entries of the
        differing buckets, or ``None`` when the round is over (in step, or the answer
        was not the peer's own or not a digest)."""
        if answered_by != self.key or len(reply.buckets) != BUCKETS:
            self._pacing.out_of_step(self.key)
            return None
        differing = tuple(i for i in range(BUCKETS) if reply.buckets[i] != self.mine[i])
        if not differing:
            self._pacing.in_step(self.key, self.round_, self.activity)
            return None
        self._pacing.out_of_step(self.key)
        wanted = set(differing)
        return Digest((), differing,
                      tuple(entry(c) for c in self.chains if bucket_of(c) in wanted))


@attrs.define(eq=False)
class Digests:
    """A node's side of anti-entropy: which peers are due, the bucket digests per
    peer, and the answers to a peer's digest."""

    pacing: DigestPacing = attrs.field(factory=DigestPacing)
    _hashes: dict[bytes, tuple[int, int, int]] = attrs.field(factory=dict)
    """Per chain: the epoch and commit seq last hashed, and the hash."""
    _cache: dict[bytes, tuple[int, Sequence[bytes], tuple[bytes, ...]]] = attrs.field(
        factory=dict)
    """Per peer: the activity count and chains the buckets were worked out for."""

    def due(self, shared: Mapping[bytes, Sequence[bytes]], round_: int,
            activity: int) -> list[bytes]:
        """The peers (keys, sorted) to exchange digests with in round ``round_``."""
        if len(self.pacing) > len(shared):
            self.pacing.keep_only(shared)
        return [key for key in sorted(shared) if self.pacing.due(key, round_, activity)]

    def fresh(self, key: bytes, chains: Sequence[bytes], activity: int) -> bool:
        """Are the buckets for ``key`` worked out for exactly this (the caller need not
        make the chains' entries available)?"""
        cached = self._cache.get(key)
        return cached is not None and cached[0] == activity and cached[1] is chains

    def buckets_for(self, key: bytes, chains: Sequence[bytes], activity: int,
                    entry: Callable[[bytes], Entry], *, peers: int,
                    held: int) -> tuple[bytes, ...]:
        """The bucket digests of ``chains`` (those shared with peer ``key``), worked out
        again only when ``activity`` or ``chains`` changed. ``peers`` and ``held``: how
        many peers share chains with this node and how many chains it holds (they
        bound the caches)."""
        if self.fresh(key, chains, activity):
            return self._cache[key][2]
        if len(self._hashes) > 2 * held + 1024:
            self._hashes.clear()
        buckets = self.buckets(entry(c) for c in chains)
        if len(self._cache) > 4 * peers + 64:
            self._cache.clear()
        self._cache[key] = (activity, chains, buckets)
        return buckets

    def buckets(self, entries: Iterable[Entry]) -> tuple[bytes, ...]:
        acc = [0] * BUCKETS
        hashed = self._hashes
        for criterion, epoch, commit in entries:
            known = hashed.get(criterion)
            if known is None or known[0] != epoch or known[1] != commit:
                digest = hashlib.sha256(criterion + epoch.to_bytes(8, "big")
                                        + (commit + 1).to_bytes(8, "big")).digest()
                known = hashed[criterion] = (epoch, commit, int.from_bytes(digest[:16], "big"))
            acc[bucket_of(criterion)] ^= known[2]
        return tuple(a.to_bytes(16, "big") for a in acc)

    def start(self, key: bytes, chains: Sequence[bytes], mine: tuple[bytes, ...],
              round_: int, activity: int) -> SyncRound:
        return SyncRound(key, chains, mine, round_, activity, self.pacing)

    @staticmethod
    def answer_listing(request: Digest, shared: Collection[bytes], entry: Callable[[bytes], Entry],
                       elsewhere: Callable[[bytes], Entry | None]) -> tuple[DigestReply, list[Entry]]:
        """Answer a peer that listed its entries of the ``wanted`` buckets: this side's
        entries of them, and the peer's entries of chains both share (to pull those
        where the peer is ahead).

        Chains the peer believes it shares with this node but does not (it was
        left out of a newer configuration, or holds a rival chain) are answered
        with ``elsewhere(criterion)``, where this node stands on them (``None``:
        nothing to tell).
        """
        wanted = set(request.wanted)
        mine = set(shared)
        entries = [entry(c) for c in shared if bucket_of(c) in wanted]
        theirs = {c: (e, k) for c, e, k in request.entries}
        for criterion in list(theirs)[:MAX_FOREIGN]:
            if criterion in mine:
                continue
            told = elsewhere(criterion)
            if told is not None:
                entries.append(told)
        behind = [(c, e, k) for c, (e, k) in theirs.items() if c in mine]
        return DigestReply((), tuple(entries)), behind

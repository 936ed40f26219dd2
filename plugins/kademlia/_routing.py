"""The Kademlia routing table, sans-IO.

256 k-buckets indexed by the length of the common prefix with the own id,
least-recently seen first. A full bucket keeps newcomers in a replacement
cache and asks the driver to ping its least-recently seen contact
(ping-before-evict): old, proven contacts are preferred over new ones. A
separate sibling list holds the nodes closest to the own id regardless of
bucket capacity (S/Kademlia), for replica sets around the own id.

Only authenticated peers may be observed: the driver passes the peer a
transport authenticated, so a contact's id is always the hash of its key.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import math
import random
from collections.abc import Sequence

import attrs

from ketten.errors import UsageError

from ._ids import ID_BITS, Contact, bucket_index, id_in_bucket, puzzle_ok

__all__ = ["Observation", "Outcome", "RoutingTable", "TableStatistics"]


class Outcome(enum.Enum):
    ADDED = "added"
    """A new contact entered the table (a peer joined)."""
    UPDATED = "updated"
    """A known contact was seen again (moved to most-recently seen)."""
    CACHED = "cached"
    """Its bucket is full: kept as a replacement candidate."""
    REFUSED = "refused"
    """The own id, or an id that does not solve the puzzle."""


@attrs.frozen
class Observation:
    outcome: Outcome
    ping: Contact | None = None
    """Set when the driver should ping this contact before anything is evicted."""


@attrs.frozen
class TableStatistics:
    contacts: int
    siblings: int
    replacements: int
    buckets_used: int
    evictions: int
    refused: int


@attrs.define(eq=False, slots=True)
class _Entry:
    contact: Contact
    last_seen: float
    failures: int = 0
    in_bucket: bool = False
    sibling: bool = False


@attrs.define(eq=False)
class RoutingTable:
    """k-buckets, replacement caches and a sibling list around ``own_id``.

    ``stale_after`` is how many failed requests in a row remove a contact (one
    failed ping-before-evict is enough when a replacement is waiting).
    """

    own_id: int
    k: int = 20
    sibling_size: int = 20
    difficulty: int = 0
    stale_after: int = 5
    _entries: dict[int, _Entry] = attrs.field(factory=dict, init=False)
    _buckets: list[dict[int, _Entry]] = attrs.field(init=False)
    _replacements: list[dict[int, Contact]] = attrs.field(init=False)
    _siblings: list[tuple[int, int]] = attrs.field(factory=list, init=False)
    _touched: list[float] = attrs.field(init=False)
    _checking: dict[int, int] = attrs.field(factory=dict, init=False)
    _deepest: int = attrs.field(default=-1, init=False)
    _evictions: int = attrs.field(default=0, init=False)
    _refused: int = attrs.field(default=0, init=False)
    _version: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.k < 1 or self.sibling_size < 0 or self.stale_after < 1:
            raise UsageError("k and stale_after must be positive, sibling_size not negative")
        self._buckets = [{} for _ in range(ID_BITS)]
        self._replacements = [{} for _ in range(ID_BITS)]
        self._touched = [-math.inf] * ID_BITS

    # -- queries -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def version(self) -> int:
        """Changes whenever the answer of :meth:`closest` may have changed (a contact
        came, went, or moved to another address)."""
        return self._version

    def __contains__(self, node_id: int) -> bool:
        return node_id in self._entries

    def get(self, node_id: int) -> Contact | None:
        entry = self._entries.get(node_id)
        return entry.contact if entry is not None else None

    def contacts(self) -> list[Contact]:
        return [entry.contact for entry in self._entries.values()]

    def bucket(self, index: int) -> list[Contact]:
        """Contacts of bucket ``index``, least-recently seen first."""
        return [entry.contact for entry in self._buckets[index].values()]

    def replacements(self, index: int) -> list[Contact]:
        return list(self._replacements[index].values())

    def siblings(self) -> list[Contact]:
        """The known nodes closest to the own id, nearest first."""
        return [self._entries[node_id].contact for _, node_id in self._siblings]

    def unheard_siblings(self, since: float) -> list[Contact]:
        """The siblings no message came from at or after ``since``, nearest first
        (a sibling that spoke up recently needs no liveness ping)."""
        entries = self._entries
        return [entries[node_id].contact for _, node_id in self._siblings
                if entries[node_id].last_seen < since]

    def closest(self, target: int, count: int, exclude: int | None = None) -> list[Contact]:
        """The ``count`` known contacts closest to ``target``, nearest first."""
        if count <= 0:
            return []
        first = bucket_index(self.own_id, target)
        candidates: list[_Entry] = []
        buckets = self._buckets
        if first < ID_BITS:
            candidates.extend(buckets[first].values())
            # Buckets deeper than ``first`` all lie at the same XOR magnitude from
            # the target; shallower ones are each strictly further than the last.
            for index in range(first + 1, self._deepest + 1):
                bucket = buckets[index]
                if bucket:
                    candidates.extend(bucket.values())
        index = min(first, self._deepest + 1) - 1
        while len(candidates) < count + 1 and index >= 0:
            candidates.extend(buckets[index].values())
            index -= 1
        for _, node_id in self._siblings:
            entry = self._entries[node_id]
            if not entry.in_bucket:
                candidates.append(entry)
        chosen = heapq.nsmallest(
            count,
            (e.contact for e in candidates if e.contact.id != exclude),
            key=lambda contact: contact.id ^ target,
        )
        return chosen

    def stale_buckets(self, now: float, interval: float) -> list[int]:
        """Buckets not touched by a lookup for ``interval``, up to the deepest used one."""
        return [i for i in range(self._deepest + 1)
                if now - self._touched[i] >= interval]

    def joined(self, closest: Sequence[Contact], now: float) -> None:
        """The own id's lookup of a join found ``closest`` (nearest first, at most
        ``k``). If it found ``k``, every node of a bucket deeper than the farthest
        one's is nearer to the own id than that node, so it is among them: such a
        bucket holds what the network has there and counts as refreshed ``now``."""
        if len(closest) < self.k:
            return
        farthest = bucket_index(self.own_id, closest[-1].id)
        for index in range(farthest + 1, ID_BITS):
            self._touched[index] = now

    def refresh_target(self, index: int, rng: random.Random) -> int:
        return id_in_bucket(self.own_id, index, rng)

    def touch(self, target: int, now: float) -> None:
        """A lookup for ``target`` ran: its bucket needs no refresh for a while."""
        index = bucket_index(self.own_id, target)
        if index < ID_BITS:
            self._touched[index] = now

    def statistics(self) -> TableStatistics:
        return TableStatistics(
            contacts=len(self._entries),
            siblings=len(self._siblings),
            replacements=sum(len(r) for r in self._replacements),
            buckets_used=sum(1 for b in self._buckets if b),
            evictions=self._evictions,
            refused=self._refused,
        )

    # -- updates -------------------------------------------------------------

    def observe(self, contact: Contact, now: float) -> Observation:
        """An authenticated message came from ``contact``."""
        node_id = contact.id
        if node_id == self.own_id or not puzzle_ok(contact.node_id, self.difficulty):
            self._refused += 1
            return Observation(Outcome.REFUSED)
        index = bucket_index(self.own_id, node_id)
        entry = self._entries.get(node_id)
        if entry is not None:
            if entry.contact != contact:
                entry.contact = contact
                self._version += 1
            entry.last_seen = now
            entry.failures = 0
            if entry.in_bucket:
                bucket = self._buckets[index]
                del bucket[node_id]
                bucket[node_id] = entry
                if self._checking.get(index) == node_id:
                    del self._checking[index]
                return Observation(Outcome.UPDATED)
            admitted = self._admit(entry, index)
            if admitted is not None:
                return admitted
            return Observation(Outcome.UPDATED)
        entry = _Entry(contact, now)
        sibling = self._offer_sibling(entry)
        admitted = self._admit(entry, index)
        if entry.in_bucket or sibling:
            self._entries[node_id] = entry
            self._version += 1
            return Observation(Outcome.ADDED, admitted.ping if admitted else None)
        assert admitted is not None
        return admitted

    def _admit(self, entry: _Entry, index: int) -> Observation | None:
        """Put ``entry`` in its bucket, or in the replacement cache if the bucket is full."""
        bucket = self._buckets[index]
        node_id = entry.contact.id
        if len(bucket) < self.k:
            bucket[node_id] = entry
            entry.in_bucket = True
            self._deepest = max(self._deepest, index)
            self._replacements[index].pop(node_id, None)
            return None
        cache = self._replacements[index]
        cache.pop(node_id, None)
        cache[node_id] = entry.contact
        if len(cache) > self.k:
            del cache[next(iter(cache))]
        ping = None
        if index not in self._checking:
            oldest = next(iter(bucket.values()))
            self._checking[index] = oldest.contact.id
            ping = oldest.contact
        return Observation(Outcome.CACHED, ping)

    def _offer_sibling(self, entry: _Entry) -> bool:
        if self.sibling_size == 0:
            return False
        key = (entry.contact.id ^ self.own_id, entry.contact.id)
        siblings = self._siblings
        if len(siblings) >= self.sibling_size and key >= siblings[-1]:
            return False
        bisect.insort(siblings, key)
        entry.sibling = True
        if len(siblings) > self.sibling_size:
            _, dropped_id = siblings.pop()
            dropped = self._entries[dropped_id]
            dropped.sibling = False
            if not dropped.in_bucket:
                del self._entries[dropped_id]
                self._version += 1
        return True

    def failed(self, node_id: int, now: float) -> Contact | None:
        """A request to ``node_id`` failed. Returns a replacement that entered the table.

        A contact is removed after ``stale_after`` failures in a row (any
        answer resets the count), so that lost messages do not make the
        table flap; or at once when it failed the ping that decides whether
        a newcomer waiting in the replacement cache takes its place.
        """
        entry = self._entries.get(node_id)
        index = bucket_index(self.own_id, node_id)
        checked = index < ID_BITS and self._checking.get(index) == node_id
        if checked:
            del self._checking[index]
        if entry is None:
            if index < ID_BITS:
                self._replacements[index].pop(node_id, None)
            return None
        entry.failures += 1
        waiting = bool(self._replacements[index])
        if entry.failures < self.stale_after and not (checked and waiting):
            return None
        return self._remove(entry, index, now)

    def remove(self, node_id: int, now: float) -> Contact | None:
        """Forget ``node_id``; returns a replacement that entered the table."""
        entry = self._entries.get(node_id)
        if entry is None:
            return None
        return self._remove(entry, bucket_index(self.own_id, node_id), now)

    def _remove(self, entry: _Entry, index: int, now: float) -> Contact | None:
        node_id = entry.contact.id
        del self._entries[node_id]
        self._version += 1
        self._evictions += 1
        if entry.sibling:
            pos = bisect.bisect_left(self._siblings, (node_id ^ self.own_id, node_id))
            del self._siblings[pos]
        promoted: Contact | None = None
        if entry.in_bucket:
            bucket = self._buckets[index]
            del bucket[node_id]
            promoted = self._promote(index, now)
            if index == self._deepest and not bucket:
                self._deepest = max((i for i in range(index) if self._buckets[i]), default=-1)
        if entry.sibling:
            self._refill_siblings()
        return promoted

    def _promote(self, index: int, now: float) -> Contact | None:
        """Move the most recently seen replacement into bucket ``index``."""
        cache = self._replacements[index]
        if not cache:
            return None
        _, promoted = cache.popitem()
        existing = self._entries.get(promoted.id)
        if existing is not None:
            existing.in_bucket = True
            existing.last_seen = now
            self._buckets[index][promoted.id] = existing
            return None
        fresh = _Entry(promoted, now, in_bucket=True)
        self._buckets[index][promoted.id] = fresh
        self._entries[promoted.id] = fresh
        self._version += 1
        self._offer_sibling(fresh)
        return promoted

    def _refill_siblings(self) -> None:
        chosen = self.closest(self.own_id, self.sibling_size)
        keep = {c.id for c in chosen}
        for _, node_id in self._siblings:
            if node_id not in keep:
                entry = self._entries[node_id]
                entry.sibling = False
                if not entry.in_bucket:
                    del self._entries[node_id]
        self._version += 1
        self._siblings = [(c.id ^ self.own_id, c.id) for c in chosen]
        for c in chosen:
            self._entries[c.id].sibling = True

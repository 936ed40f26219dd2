"""Provider records, sans-IO: who announced that it holds the blocks of a key.

A node that holds a chain (its blocks) announces itself as a provider of the
chain's key to the nodes closest to that key; a reader asks those nodes for
providers and fetches from any of them. As in IPFS, a record expires after
``ttl`` seconds unless the provider announces it again (republish), and
every table here is bounded: so many providers per key, so many keys, and
so many records per provider, so one peer cannot fill a node's memory with
records.

A record names the provider by the key and address the transport
authenticated when it announced itself: a node can announce only itself.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from ketten.interfaces import Peer

__all__ = ["ProviderRecords", "Republisher"]


@attrs.define(eq=False)
class ProviderRecords:
    """The provider records this node keeps for the keys near it."""

    ttl: float = 48 * 3600.0
    """Seconds a record lives unless announced again."""
    per_key: int = 20
    """Providers kept per key (the most recently announced)."""
    max_keys: int = 65536
    """Keys kept (the least recently announced key goes first)."""
    per_provider: int = 1024
    """Keys one provider may hold records for here."""
    max_records: int = 65536
    """Records kept in all (the least recently announced key goes first)."""
    _records: OrderedDict[bytes, OrderedDict[bytes, tuple[str, float]]] = attrs.field(
        factory=OrderedDict, init=False)
    """key -> {provider public key: (address, expiry)}, oldest announcement first."""
    _held: dict[bytes, int] = attrs.field(factory=dict, init=False)
    """provider public key -> records it holds here."""
    _count: int = attrs.field(default=0, init=False)
    refused: int = attrs.field(default=0, init=False)
    """Announcements refused because their provider holds ``per_provider`` records."""

    def __len__(self) -> int:
        return self._count

    def add(self, key: bytes, provider: Peer, now: float) -> bool:
        """Record (or renew) ``provider`` for ``key``; False if refused for the bound."""
        records = self._records.get(key)
        if records is not None and provider.public_key in records:
            del records[provider.public_key]
            records[provider.public_key] = (provider.address, now + self.ttl)
            self._records.move_to_end(key)
            return True
        if self._held.get(provider.public_key, 0) >= self.per_provider:
            self.refused += 1
            return False
        if records is None:
            while self._records and (len(self._records) >= self.max_keys
                                     or self._count >= self.max_records):
                self._drop_key(next(iter(self._records)))
            records = self._records[key] = OrderedDict()
        while len(records) >= self.per_key:
            self._forget(records, next(iter(records)))
        while self._count >= self.max_records:
            oldest = next(iter(self._records))
            if oldest == key:
                self._forget(records, next(iter(records)))
            else:
                self._drop_key(oldest)
        records[provider.public_key] = (provider.address, now + self.ttl)
        self._count += 1
        self._held[provider.public_key] = self._held.get(provider.public_key, 0) + 1
        self._records.move_to_end(key)
        return True

    def providers(self, key: bytes, now: float, limit: int | None = None) -> list[Peer]:
        """The live providers of ``key``, the most recently announced first."""
        records = self._records.get(key)
        if records is None:
            return []
        for public_key in [k for k, (_, expiry) in records.items() if expiry <= now]:
            self._forget(records, public_key)
        if not records:
            del self._records[key]
            return []
        found = [Peer(address, public_key) for public_key, (address, _) in reversed(records.items())]
        return found if limit is None else found[:limit]

    def expire(self, now: float) -> int:
        """Forget every expired record; how many were forgotten."""
        before = len(self)
        for key in list(self._records):
            self.providers(key, now)
        return before - len(self)

    def _forget(self, records: OrderedDict[bytes, tuple[str, float]], public_key: bytes) -> None:
        del records[public_key]
        self._count -= 1
        left = self._held[public_key] - 1
        if left:
            self._held[public_key] = left
        else:
            del self._held[public_key]

    def _drop_key(self, key: bytes) -> None:
        records = self._records.pop(key)
        for public_key in list(records):
            self._forget(records, public_key)


@attrs.define(eq=False)
class Republisher:
    """When this node announces the keys it provides: at once when it starts to
    provide one, then every ``interval`` seconds (less than the records' ``ttl``,
    so they never lapse while it still holds the blocks)."""

    interval: float = 12 * 3600.0
    _due: dict[bytes, float] = attrs.field(factory=dict, init=False)

    def __contains__(self, key: bytes) -> bool:
        return key in self._due

    def __len__(self) -> int:
        return len(self._due)

    def provide(self, key: bytes, now: float) -> bool:
        """Start providing ``key`` (announced at the next :meth:`due`); False if already."""
        if key in self._due:
            return False
        self._due[key] = now
        return True

    def stop(self, key: bytes) -> None:
        """Stop announcing ``key`` (its records elsewhere lapse after their ttl)."""
        self._due.pop(key, None)

    def due(self, now: float) -> list[bytes]:
        """The keys to announce now; each is due again ``interval`` later."""
        keys = [key for key, at in self._due.items() if at <= now]
        for key in keys:
            self._due[key] = now + self.interval
        return keys

    def failed(self, key: bytes, now: float, retry: float) -> None:
        """An announcement of ``key`` reached nobody: try again after ``retry`` seconds."""
        if key in self._due:
            self._due[key] = min(self._due[key], now + retry)

    def next_due(self) -> float | None:
        """When :meth:`due` next has something (``None``: nothing provided)."""
        return min(self._due.values(), default=None)

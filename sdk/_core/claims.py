"""Which claimed addresses a node has proven, sans-IO.

A peer that sends a request proves its key in the handshake but only
*claims* the address it listens at: anyone can claim anyone's address. An
address counts for a node only once a request sent there was answered with
that node's key. :class:`AddressClaims` remembers the pairs ``(node id,
address)`` proven that way, so a peer heard again is taken at once, and says
when a claim heard for the first time is worth one ping to check it: once
per pair per ``retry_after`` seconds, one per node and at most
``max_checks`` at a time, so two nodes that cannot keep each other (in a
routing table's bucket, say) do not ping each other without end, and a flood
of claims costs a bounded number of pings. It also remembers the claims a
check refuted. The node uses it for the nodes it remembers near keys, and
overlays for the contacts they let into their routing tables.

Every memory is bounded (least recently used first out).
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

__all__ = ["AddressClaims"]

Pair = tuple[int, str]


@attrs.define(eq=False)
class AddressClaims:
    """Proven ``(node id, address)`` pairs, and the claims being checked."""

    limit: int = 4096
    """Pairs remembered: proven, tried and refuted, each."""
    retry_after: float = 600.0
    """Seconds before an unproven claim is checked again."""
    max_checks: int = 20
    """Claims checked at the same time."""
    _proven: OrderedDict[Pair, None] = attrs.field(factory=OrderedDict, init=False)
    _tried: OrderedDict[Pair, float] = attrs.field(factory=OrderedDict, init=False)
    _checking: set[Pair] = attrs.field(factory=set, init=False)
    _checking_ids: set[int] = attrs.field(factory=set, init=False)
    _refuted: OrderedDict[Pair, float] = attrs.field(factory=OrderedDict, init=False)
    checks: int = attrs.field(default=0, init=False)
    """Checks settled (see :meth:`settle`)."""
    refutations: int = attrs.field(default=0, init=False)
    """Of those, the ones not answered with the claimant's key."""

    def proven(self, node_id: int, address: str) -> bool:
        """Whether a request sent to ``address`` was answered with this node's key."""
        pair = (node_id, address)
        if pair not in self._proven:
            return False
        self._proven.move_to_end(pair)
        return True

    def prove(self, node_id: int, address: str) -> None:
        """A request sent to ``address`` was answered with this node's key."""
        pair = (node_id, address)
        self._proven[pair] = None
        self._proven.move_to_end(pair)
        self._tried.pop(pair, None)
        self._refuted.pop(pair, None)
        while len(self._proven) > self.limit:
            self._proven.popitem(last=False)

    def check(self, node_id: int, address: str, now: float) -> bool:
        """A claim was heard: ``True`` if the driver should ping ``address`` now
        (and call :meth:`checked` when the ping ends, answered or not)."""
        pair = (node_id, address)
        if pair in self._proven or node_id in self._checking_ids:
            return False  # proven, or this node's claim (one at a time) is being checked
        if len(self._checking) >= self.max_checks:
            return False
        last = self._tried.get(pair)
        if last is not None and now - last < self.retry_after:
            return False
        self._tried[pair] = now
        self._tried.move_to_end(pair)
        while len(self._tried) > self.limit:
            self._tried.popitem(last=False)
        self._checking.add(pair)
        self._checking_ids.add(node_id)
        return True

    def checked(self, node_id: int, address: str) -> None:
        """The ping :meth:`check` asked for ended."""
        if (node_id, address) in self._checking:
            self._checking.discard((node_id, address))
            self._checking_ids.discard(node_id)

    def settle(self, node_id: int, address: str, answered: bytes | None,
               expected: bytes) -> bool:
        """The request :meth:`check` asked for ended: ``answered`` is the key that
        answered at ``address`` (``None``: nobody did). ``True`` when it was
        ``expected``, the claimant's key, which proves the claim (the driver
        then takes the claimant); the pings out and refuted are counted."""
        self.checked(node_id, address)
        self.checks += 1
        if answered == expected:
            self.prove(node_id, address)
            return True
        self.refutations += 1
        return False

    def refute(self, node_id: int, address: str, now: float) -> None:
        """The ping :meth:`check` asked for found nobody answering there as this node."""
        pair = (node_id, address)
        self._refuted[pair] = now
        self._refuted.move_to_end(pair)
        while len(self._refuted) > self.limit:
            self._refuted.popitem(last=False)

    def refuted(self, node_id: int, address: str, now: float) -> bool:
        """Whether this claim was checked and found false within ``retry_after``."""
        when = self._refuted.get((node_id, address))
        return when is not None and now - when < self.retry_after

    @property
    def checking(self) -> int:
        """Pings out now."""
        return len(self._checking)

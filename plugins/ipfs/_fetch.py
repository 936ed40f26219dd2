"""Fetching a chain's blocks from several providers at once, sans-IO.

The chain is a list of blocks linked backwards (each names its predecessor's
CID), so only its head CID (the root) is known at first. The fetch asks
providers two things, in the style of Bitswap's want-have and want-block:

* **have**: the CIDs ``0, segment, 2 * segment, ...`` links behind the root. These
  are claims: they let the fetch ask for many segments of the chain in
  parallel, from different providers, before the links that prove them
  arrived.
* **want**: up to ``count`` blocks from a CID back along the links.

Every block is checked against the CID it was asked under (its content must
hash to it) before it is kept, and the chain is assembled only by following
links from the root through checked blocks, so a claim is believed only once
the block before it links to it. A provider that sends a block that does
not match its CID, or whose claims a link refutes, is asked nothing more; a
provider that does not have a segment, or does not answer, is not asked for
it again, and the segment goes to another. The fetch fails at its deadline,
or when no provider is left for a block it still lacks, naming that block.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from ketten.errors import DecodeError
from ketten.interfaces import Peer
from ketten.ipld import EventBlock, cid_text, decode_block

__all__ = ["ChainFetch", "FetchRequest", "Kind"]


class Kind(enum.Enum):
    HAVE = "have"
    WANT = "want"


@attrs.frozen
class FetchRequest:
    """One request to send: ``kind`` for ``count`` blocks (or claims, every
    ``stride`` links) from ``root`` (the block at ``seq``) back, to ``provider``."""

    provider: Peer
    kind: Kind
    root: bytes
    seq: int
    count: int
    stride: int = 1


@attrs.define(eq=False)
class ChainFetch:
    """One fetch of a chain's blocks, from ``root`` (at ``root_seq``) back to seq
    ``stop_seq``."""

    root: bytes
    root_seq: int
    providers: Sequence[Peer]
    deadline: float
    segment: int = 256
    """Blocks asked for in one want."""
    per_provider: int = 2
    """Requests one provider has open at a time."""
    stop_seq: int = 0
    """The lowest seq fetched (the caller holds the blocks before it)."""
    max_blocks: int = 1_000_000
    """The most blocks one fetch holds (a bound on what providers can make it keep)."""
    max_claims: int = 4096
    """Claims taken from one have answer."""
    max_rounds: int = 2
    """Times every provider is asked again for a block they all failed to serve."""
    _kept: dict[bytes, EventBlock] = attrs.field(factory=dict, init=False)
    _queued: dict[bytes, int] = attrs.field(factory=dict, init=False)
    """Wants not yet sent: start CID -> its seq."""
    _open: dict[bytes, Peer] = attrs.field(factory=dict, init=False)
    """Wants sent and not answered: start CID -> the provider asked."""
    _refused: dict[bytes, set[bytes]] = attrs.field(factory=dict, init=False)
    """start CID -> keys of providers that did not serve it."""
    _load: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _rounds: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _bad: set[bytes] = attrs.field(factory=set, init=False)
    _claimed_by: dict[bytes, bytes] = attrs.field(factory=dict, init=False)
    """A claimed CID -> the key of the provider that claimed it."""
    _asked_have: bool = attrs.field(default=False, init=False)
    _chain: list[EventBlock] = attrs.field(factory=list, init=False)
    """The blocks proven by links from the root, newest first."""
    _gap: bytes | None = attrs.field(init=False)
    """The first block the proven chain lacks (``None``: complete)."""
    _result: list[EventBlock] | None = attrs.field(default=None, init=False)
    _error: str | None = attrs.field(default=None, init=False)
    rejected: int = attrs.field(default=0, init=False)
    """Blocks that did not match the CID they were sent under."""
    received: int = attrs.field(default=0, init=False)
    """Blocks received that matched their CIDs."""
    served: dict[bytes, int] = attrs.field(factory=dict, init=False)
    """Provider key -> blocks it served that were kept."""

    def __attrs_post_init__(self) -> None:
        self._queued[self.root] = self.root_seq
        self._gap = self.root

    # -- state ---------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def error(self) -> str | None:
        """Why the fetch failed (``None``: it has not)."""
        return self._error

    @property
    def result(self) -> list[EventBlock]:
        """The blocks from ``stop_seq`` to the root, oldest first (once :attr:`done`)."""
        assert self._result is not None
        return self._result

    @property
    def bad_providers(self) -> frozenset[bytes]:
        return frozenset(self._bad)

    # -- driving ----------------------------------------------------------------

    def requests(self, now: float) -> list[FetchRequest]:
        """The requests to send now (each is answered with :meth:`answered`)."""
        if self._result is not None or self._error is not None:
            return []
        if now >= self.deadline:
            self._fail(f"the deadline passed with block {cid_text(self._gap or self.root)} "
                       "still missing")
            return []
        out: list[FetchRequest] = []
        if not self._asked_have:
            # One provider tells where the segments start; the root's want goes
            # out meanwhile, so a short chain costs no extra round trip.
            first = self._usable(None)
            if first is not None:
                self._asked_have = True
                self._load[first.public_key] = self._load.get(first.public_key, 0) + 1
                out.append(FetchRequest(first, Kind.HAVE, self.root, self.root_seq,
                                        self.max_claims, self.segment))
        for start in list(self._queued):
            provider = self._usable(start)
            if provider is None and start == self._gap and self._unservable(start):
                # Every provider failed the block the chain waits for: ask them all
                # again (an answer lost to a passing fault), a few rounds at most.
                rounds = self._rounds.get(start, 0)
                if rounds < self.max_rounds:
                    self._rounds[start] = rounds + 1
                    self._refused.pop(start, None)
                    provider = self._usable(start)
            if provider is None:
                if self._unservable(start):
                    if start == self._gap:
                        self._fail(f"no provider served block {cid_text(start)}")
                        return []
                    # A claim nobody serves (its claimer may just have timed out).
                    del self._queued[start]
                    self._claimed_by.pop(start, None)
                continue
            seq = self._queued.pop(start)
            self._open[start] = provider
            self._load[provider.public_key] = self._load.get(provider.public_key, 0) + 1
            count = max(1, min(self.segment, seq - self.stop_seq + 1))
            out.append(FetchRequest(provider, Kind.WANT, start, seq, count))
        return out

    def answered(self, request: FetchRequest, answer: list[bytes] | None) -> None:
        """The answer to ``request``: claimed CIDs (have) or block data (want), in
        order from its root; ``None`` if it failed (no answer, an error)."""
        key = request.provider.public_key
        self._load[key] = max(0, self._load.get(key, 0) - 1)
        if request.kind is Kind.HAVE:
            if answer and key not in self._bad and answer[0] == self.root:
                self._claims(key, answer[1:])
        else:
            self._open.pop(request.root, None)
            if key not in self._bad:
                self._blocks(request, answer or [])
        self._assemble()

    def _claims(self, key: bytes, cids: list[bytes]) -> None:
        for index, cid in enumerate(cids[: self.max_claims], start=1):
            seq = self.root_seq - index * self.segment
            if type(cid) is not bytes or seq < self.stop_seq:
                return
            if cid in self._kept or cid in self._queued or cid in self._open:
                continue
            self._claimed_by.setdefault(cid, key)
            self._queued[cid] = seq

    def _blocks(self, request: FetchRequest, datas: list[bytes]) -> None:
        key = request.provider.public_key
        expected: bytes | None = request.root
        got = 0
        for data in datas[: request.count]:
            if expected is None:
                break  # blocks past the genesis
            try:
                block = decode_block(expected, data)
            except DecodeError:
                self.rejected += 1
                self._bad.add(key)
                break
            self.received += 1
            if len(self._kept) < self.max_blocks:
                self._kept[expected] = block
                self.served[key] = self.served.get(key, 0) + 1
            got += 1
            if block.event.seq <= self.stop_seq:
                break
            expected = block.prev_binary
        if got == 0:
            self._refused.setdefault(request.root, set()).add(key)
            self._queued[request.root] = request.seq
        elif (got < request.count and expected is not None and expected not in self._kept
              and expected not in self._open and request.seq - got >= self.stop_seq):
            # The rest of the segment (cut short by the answer's size, a gap at the
            # provider, or a wrong block) is asked for at once, not when reached.
            self._queued.setdefault(expected, request.seq - got)

    def _assemble(self) -> None:
        """Follow the links from the proven chain's end through kept blocks; want the
        first gap."""
        chain = self._chain
        cid = self._gap
        while cid is not None:
            block = self._kept.get(cid)
            if block is None:
                break
            chain.append(block)
            self._claimed_by.pop(cid, None)
            cid = None if block.event.seq <= self.stop_seq else block.prev_binary
        self._gap = cid
        if cid is None:
            self._result = [b for b in reversed(chain) if b.event.seq >= self.stop_seq]
            self._queued.clear()
            return
        if len(chain) >= self.max_blocks:
            self._fail(f"the chain is longer than max_blocks ({self.max_blocks})")
            return
        if cid not in self._queued and cid not in self._open:
            self._queued[cid] = chain[-1].event.seq - 1 if chain else self.root_seq
            self._refute_claims(chain)

    def _refute_claims(self, chain: list[EventBlock]) -> None:
        """A gap right after the proven chain: every claim still pending that no
        link reached while the chain passed its position was false."""
        if not chain:
            return
        lowest = chain[-1].event.seq
        for cid in list(self._claimed_by):
            block = self._kept.get(cid)
            if block is not None and block.event.seq >= lowest:
                self._bad.add(self._claimed_by.pop(cid))

    def _usable(self, start: bytes | None) -> Peer | None:
        refused = self._refused.get(start, set()) if start is not None else set()
        best: Peer | None = None
        for provider in self.providers:
            key = provider.public_key
            if key in self._bad or key in refused or self._load.get(key, 0) >= self.per_provider:
                continue
            if best is None or self._load.get(key, 0) < self._load.get(best.public_key, 0):
                best = provider
        return best

    def _unservable(self, start: bytes) -> bool:
        """No provider can still serve ``start``: each is bad or refused it."""
        refused = self._refused.get(start, set())
        return all(p.public_key in self._bad or p.public_key in refused for p in self.providers)

    def _fail(self, message: str) -> None:
        self._error = message
        self._queued.clear()

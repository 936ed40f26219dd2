"""The in-memory index of a ``file`` store and the log replay that rebuilds it, sans-IO.

The index maps every chain position, orphan, event hash and command id to
the frame that holds the event. It is rebuilt at every open by replaying the
segments (:func:`replay`), and a running store applies each durable batch to
it through the same methods, so a reopened store is the store that closed.

A frame that fails its checksum but whose chain is known (from a gap in the
chain that follows it, or from the ``quarantine`` file) becomes a *damaged
position*: its hash is ``None`` and reading it raises
:class:`~ketten.errors.StoreCorrupted` until the chain is quarantined.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from hashlib import sha256

import attrs

from ketten.errors import StoreCorrupted

from .._store_records import parse_position
from . import _format as fmt

__all__ = ["ChainIndex", "Frozen", "Index", "Loc", "Segment", "layout", "replay"]

Loc = tuple[int, int, int]
"""``(segment number, frame offset, frame end)``."""


def _size(loc: Loc) -> int:
    return loc[2] - loc[1]


@attrs.define(eq=False)
class ChainIndex:
    locs: list[Loc] = attrs.field(factory=list)
    hashes: list[bytes | None] = attrs.field(factory=list)
    command_of: list[tuple[bytes, int] | None] = attrs.field(factory=list)
    commands: dict[tuple[bytes, int], int] = attrs.field(factory=dict)
    orphans: list[tuple[Loc, int, bytes | None]] = attrs.field(factory=list)

    @property
    def height(self) -> int:
        return len(self.locs)

    def head(self) -> tuple[int, bytes | None] | None:
        return (len(self.locs) - 1, self.hashes[-1]) if self.locs else None

    def cut(self, seq: int) -> list[tuple[Loc, int, bytes | None]]:
        """Remove the main chain from ``seq`` on; return ``(loc, seq, hash)`` of what went."""
        removed = [(self.locs[s], s, self.hashes[s]) for s in range(seq, len(self.locs))]
        for command in self.command_of[seq:]:
            if command is not None:
                self.commands.pop(command, None)
        del self.locs[seq:], self.hashes[seq:], self.command_of[seq:]
        return removed


@attrs.define(eq=False)
class Index:
    """Where every event of a file store lives."""

    chains: dict[bytes, ChainIndex] = attrs.field(factory=dict)
    by_hash: dict[bytes, Loc] = attrs.field(factory=dict)
    quarantined: dict[bytes, tuple[int, int]] = attrs.field(factory=dict)
    live: int = 0
    """Bytes of the frames that hold main-chain events and orphans."""
    _damage: list[tuple[Loc, tuple[bytes, int] | None]] = attrs.field(factory=list)

    def heads(self) -> dict[bytes, tuple[int, bytes | None]]:
        return {c: head for c, chain in self.chains.items() if (head := chain.head()) is not None}

    def add_event(
        self, loc: Loc, criterion: bytes, seq: int, prev: bytes | None,
        author: bytes, command: int | None, digest: bytes,
    ) -> str | None:
        """Put an event at the end of its chain; return why it does not fit, or ``None``."""
        chain = self.chains.get(criterion)
        if chain is None:
            chain = self.chains[criterion] = ChainIndex()
        while seq > chain.height and self._damage:
            self._fill(criterion, chain)
        if seq != chain.height:
            return f"seq {seq} does not extend a chain of height {chain.height}"
        last = chain.hashes[-1] if chain.locs else None
        if (chain.locs and last is not None and prev != last) or (not chain.locs and prev):
            return f"seq {seq} does not link to the head"
        if chain.locs and last is None and prev is not None:
            self.by_hash[prev] = chain.locs[-1]  # a damaged event, known by its successor
        chain.locs.append(loc)
        chain.hashes.append(digest)
        self.live += _size(loc)
        key = (author, command) if command is not None else None
        chain.command_of.append(key)
        if key is not None:
            chain.commands[key] = seq
        self.by_hash[digest] = loc
        return None

    def _fill(self, criterion: bytes, chain: ChainIndex) -> None:
        want = (criterion, chain.height)
        pick = next((i for i, (_, hint) in enumerate(self._damage) if hint == want), 0)
        loc, _ = self._damage.pop(pick)
        chain.locs.append(loc)
        chain.hashes.append(None)
        chain.command_of.append(None)
        self.live += _size(loc)

    def add_orphan(self, loc: Loc, criterion: bytes, seq: int, digest: bytes) -> None:
        """An event that lost a fork (a base segment lists them)."""
        self.chains.setdefault(criterion, ChainIndex()).orphans.append((loc, seq, digest))
        self.by_hash.setdefault(digest, loc)
        self.live += _size(loc)

    def mark(self, criterion: bytes, low: int, high: int) -> None:
        """A quarantined range not yet refilled (a base segment lists them)."""
        self.chains.setdefault(criterion, ChainIndex())
        self.quarantined[criterion] = (low, high)

    def add_damaged(self, loc: Loc, hint: tuple[bytes, int] | None) -> None:
        """A frame that failed its checksum; it is placed once its chain shows a gap."""
        self._damage.append((loc, hint))

    def replace(self, criterion: bytes, seq: int) -> str | None:
        chain = self.chains.setdefault(criterion, ChainIndex())
        if not 0 <= seq <= chain.height:
            return f"replace from seq {seq} of a chain of height {chain.height}"
        chain.orphans.extend(chain.cut(seq))
        return None

    def quarantine(self, criterion: bytes, from_seq: int, old_height: int) -> int:
        """Cut a chain back to ``from_seq`` and drop its damaged orphans; return the cut size."""
        chain = self.chains.setdefault(criterion, ChainIndex())
        removed = chain.cut(min(from_seq, chain.height))
        kept = [o for o in chain.orphans if o[2] is not None]
        self.live -= sum(_size(loc) for loc, _, _ in removed)
        self.live -= sum(_size(o[0]) for o in chain.orphans) - sum(_size(o[0]) for o in kept)
        chain.orphans = kept
        orphan_locs = {digest: loc for loc, _, digest in chain.orphans}
        damaged = {loc for loc, _, digest in removed if digest is None}
        if damaged:
            for key in [k for k, loc in self.by_hash.items() if loc in damaged]:
                del self.by_hash[key]
        for _, _, digest in removed:
            if digest is None:
                continue
            if digest in orphan_locs:
                self.by_hash[digest] = orphan_locs[digest]
            else:
                self.by_hash.pop(digest, None)
        if removed:
            low, high = self.quarantined.get(criterion, (from_seq, old_height))
            self.quarantined[criterion] = (min(low, from_seq), max(high, old_height))
        return len(removed)

    def drop(self, criterion: bytes) -> int:
        """Forget a chain, main chain and orphans; return how many events went."""
        chain = self.chains.pop(criterion, None)
        self.quarantined.pop(criterion, None)
        # Damaged frames of the chain waiting for their place (a replay) go with it.
        self._damage = [(loc, hint) for loc, hint in self._damage
                        if hint is None or hint[0] != criterion]
        if chain is None:
            return 0
        locs = set(chain.locs) | {loc for loc, _, _ in chain.orphans}
        self.live -= sum(_size(loc) for loc in chain.locs) + sum(
            _size(loc) for loc, _, _ in chain.orphans)
        for digest in [d for d in chain.hashes if d is not None] + [
                d for _, _, d in chain.orphans if d is not None]:
            if self.by_hash.get(digest) in locs:
                del self.by_hash[digest]
        if None in chain.hashes or any(d is None for _, _, d in chain.orphans):
            for key in [k for k, loc in self.by_hash.items() if loc in locs]:
                del self.by_hash[key]
        return len(locs)

    def freeze(self) -> Frozen:
        """A copy of the locations and hashes, cheap to take (list copies in C), for
        :func:`layout` to work on while the index changes."""
        return Frozen(
            [(list(c.locs), list(c.hashes), list(c.orphans)) for c in self.chains.values()],
            dict(self.quarantined))

    def relocation_parts(self, below: int, size: int) -> Iterator[tuple[list[bytes], bool]]:
        """The parts of the index that may name segments numbered below ``below``,
        about ``size`` entries each, for :meth:`relocate`: chains first, then the
        hash entries (listed only once the chains are done, so that every entry
        that names an old segment then is listed; later ones name the base)."""
        part: list[bytes] = []
        count = 0
        for criterion in list(self.chains):
            chain = self.chains.get(criterion)
            if chain is None:
                continue
            part.append(criterion)
            count += chain.height + len(chain.orphans)
            if count >= size:
                yield part, False
                part, count = [], 0
        if part:
            yield part, False
        old = [digest for digest, loc in self.by_hash.items() if loc[0] < below]
        for at in range(0, len(old), size):
            yield old[at : at + size], True

    def relocate(self, part: tuple[list[bytes], bool], moved: dict[Loc, Loc], below: int) -> None:
        """Point the locations of one part (see :meth:`relocation_parts`) at their copies."""
        keys, hashes = part
        if not hashes:
            for criterion in keys:
                chain = self.chains.get(criterion)
                if chain is not None:
                    chain.locs = [moved.get(loc, loc) for loc in chain.locs]
                    chain.orphans = [(moved.get(loc, loc), seq, d) for loc, seq, d in chain.orphans]
            return
        for digest in keys:
            loc = self.by_hash.get(digest)
            if loc is None or loc[0] >= below:
                continue
            new = moved.get(loc)
            if new is None:
                del self.by_hash[digest]  # names nothing the base holds: not ours to serve
            else:
                self.by_hash[digest] = new

    def finish(self) -> list[Loc]:
        """Place damaged frames that end a chain; return the locations of the others."""
        left = []
        for loc, hint in self._damage:
            if hint is not None:
                chain = self.chains.get(hint[0])
                if chain is not None and chain.height == hint[1]:
                    chain.locs.append(loc)
                    chain.hashes.append(None)
                    chain.command_of.append(None)
                    self.live += _size(loc)
                    continue
            left.append(loc)
        self._damage = []
        return left


@attrs.frozen
class Frozen:
    """The index as :meth:`Index.freeze` took it."""

    chains: list[tuple[list[Loc], list[bytes | None], list[tuple[Loc, int, bytes | None]]]]
    quarantined: dict[bytes, tuple[int, int]]


def layout(frozen: Frozen) -> tuple[list[tuple[int, Loc, bytes]], list[tuple[bytes, int, int]]] | None:
    """What a base segment must hold to rebuild the index: ``(kind, location, hash)``
    of every main-chain event (in chain order) and orphan (in list order), and the
    quarantined ranges. ``None`` while a damaged record waits to be quarantined (it
    cannot be copied, and its place in the chain would be lost)."""
    records: list[tuple[int, Loc, bytes]] = []
    for locs, hashes, orphans in frozen.chains:
        for loc, digest in zip(locs, hashes):
            if digest is None:
                return None
            records.append((fmt.EVENT, loc, digest))
        for loc, _, digest in orphans:
            if digest is None:
                return None
            records.append((fmt.ORPHAN, loc, digest))
    return records, [(c, low, high) for c, (low, high) in frozen.quarantined.items()]


@attrs.frozen
class Segment:
    number: int
    path: str
    data: fmt.Buffer
    size: int


def _hint(body: bytes) -> tuple[bytes, int] | None:
    try:
        criterion, seq, *_ = parse_position(body)
    except (ValueError, IndexError):
        return None
    return criterion, seq


def replay(
    index: Index, segments: Sequence[Segment], spans: dict[tuple[int, int], int]
) -> tuple[int, int]:
    """Apply every committed batch of ``segments`` to ``index``.

    Returns ``(segment number, offset)`` where valid data ends: anything
    after it is a torn write (a batch without its COMMIT). Raises
    :class:`~ketten.errors.StoreCorrupted` for damage in the middle of the
    log that cannot be attributed to a chain position.
    """
    end = (segments[-1].number, 0) if segments else (0, 0)
    for i, seg in enumerate(segments):
        later = any(s.size > 0 for s in segments[i + 1 :])
        buf, size, pos = seg.data, seg.size, 0
        batch: list[tuple[int, Loc, bytes]] = []
        committed = 0
        while pos < size:
            span = spans.get((seg.number, pos))
            if span is not None:
                loc = (seg.number, pos, pos + span)
                batch.append((0, loc, bytes(buf[pos + fmt.HEADER_SIZE : pos + span])))
                pos += span
                continue
            found = fmt.parse_frame(buf, pos, size)
            if found is None:
                if not later and fmt.find_commit(buf, pos, size) is None:
                    break  # a torn write: nothing committed follows
                frame_end = fmt.plausible_length(buf, pos, size)
                if frame_end is None or (fmt.parse_frame(buf, frame_end, size) is None and (
                    frame_end != size
                )):
                    raise StoreCorrupted(
                        "damaged frame in the middle of the log (framing lost)",
                        path=seg.path, offset=pos,
                    )
                loc = (seg.number, pos, frame_end)
                batch.append((0, loc, bytes(buf[pos + fmt.HEADER_SIZE : frame_end])))
                pos = frame_end
                continue
            kind, body_at, frame_end = found
            loc = (seg.number, pos, frame_end)
            if kind == fmt.COMMIT:
                (count,) = fmt.COMMIT_BODY.unpack_from(buf, body_at)
                if count != len(batch):
                    raise StoreCorrupted(
                        f"a commit counts {count} frames, the batch has {len(batch)}",
                        path=seg.path, offset=pos,
                    )
                _apply(index, seg.path, batch)
                batch = []
                committed = frame_end
            else:
                batch.append((kind, loc, bytes(buf[body_at:frame_end])))
            pos = frame_end
        if committed < size and later:
            raise StoreCorrupted("uncommitted frames before a later segment",
                                 path=seg.path, offset=committed)
        end = (seg.number, committed)
    return end


_CONTROL = {fmt.REPLACE: fmt.REPLACE_BODY, fmt.QUARANTINE: fmt.QUARANTINE_BODY,
            fmt.DROP: fmt.DROP_BODY, fmt.MARK: fmt.MARK_BODY, fmt.BASE: fmt.BASE_BODY}


def _apply(index: Index, path: str, batch: list[tuple[int, Loc, bytes]]) -> None:
    for kind, loc, body in batch:
        problem: str | None = None
        if kind == 0:
            index.add_damaged(loc, _hint(body))
        elif kind in fmt.RECORDS:
            try:
                criterion, seq, prev, author, command = parse_position(body)
            except (ValueError, IndexError):
                raise StoreCorrupted("an event frame holds no event", path=path,
                                     offset=loc[1]) from None
            if kind == fmt.ORPHAN:
                index.add_orphan(loc, criterion, seq, sha256(body).digest())
            else:
                problem = index.add_event(
                    loc, criterion, seq, prev, author, command, sha256(body).digest()
                )
        elif kind in _CONTROL:
            shape = _CONTROL[kind]
            if len(body) != shape.size:
                raise StoreCorrupted(f"a control frame of type {kind} holds {len(body)} bytes, "
                                     f"not {shape.size}", path=path, offset=loc[1])
            if kind == fmt.REPLACE:
                criterion, seq = shape.unpack(body)
                problem = index.replace(criterion, seq)
            elif kind == fmt.QUARANTINE:
                criterion, from_seq, old_height = shape.unpack(body)
                index.quarantine(criterion, from_seq, old_height)
            elif kind == fmt.MARK:
                index.mark(*shape.unpack(body))
            elif kind == fmt.DROP:
                index.drop(shape.unpack(body)[0])
            elif loc[1] != 0:
                problem = "a base frame that does not open its segment"
        if problem is not None:
            raise StoreCorrupted(f"the log is inconsistent: {problem}", path=path, offset=loc[1])

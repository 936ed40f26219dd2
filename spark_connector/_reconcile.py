"""Which replica of a chain to read when several store directories hold it.

Sans-IO: the caller supplies each replica's head and a way to look up the
hash a replica holds at a seq.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from ketten._core.chain import choose_branch

__all__ = ["ChainView", "reconcile"]


@attrs.frozen
class ChainView:
    """One chain as the replicas that were read show it."""

    criterion: bytes
    source: str
    """The replica whose chain is read (one holding the winning branch)."""
    height: int
    """Number of events on the source's chain (its head seq + 1)."""
    head_hash: bytes
    replicas: tuple[str, ...]
    """Every replica holding this chain, the source first."""
    diverged: tuple[str, ...] = ()
    """Replicas whose chain is on another branch than the source's."""

    @property
    def others(self) -> tuple[str, ...]:
        return self.replicas[1:]


def reconcile(
    criterion: bytes,
    heads: Mapping[str, tuple[int, bytes]],
    hash_at: Callable[[str, int], bytes | None],
) -> ChainView:
    """Pick the branch to read among replicas with heads ``{path: (seq, hash)}``.

    A replica *supports* a branch when its chain is a prefix of it (replicas
    that are behind support every branch they are a prefix of). The branch
    with the most support wins; ties go to the longer branch, then to the
    lowest head hash (:func:`ketten.choose_branch`), as replicas decide forks.
    ``hash_at(path, seq)`` is the hash of that replica's event at ``seq``
    (``None`` if it cannot be read). ``heads`` must not be empty.
    """
    paths = list(heads)
    first = heads[paths[0]][1]
    if all(head_hash == first for _, head_hash in heads.values()):
        seq, head_hash = heads[paths[0]]
        return ChainView(criterion, paths[0], seq + 1, head_hash, tuple(paths))

    def contains(outer: str, inner: str) -> bool:
        inner_seq, inner_hash = heads[inner]
        outer_seq, outer_hash = heads[outer]
        if inner_hash == outer_hash:
            return True
        if inner_seq >= outer_seq:
            return False
        return hash_at(outer, inner_seq) == inner_hash

    support: dict[str, list[str]] = {p: [q for q in paths if contains(p, q)] for p in paths}
    maximal = [p for p in paths if not any(q != p and heads[q][1] != heads[p][1]
                                           and p in support[q] for q in paths)]
    votes: dict[bytes, int] = {}
    heights: dict[bytes, int] = {}
    for path in maximal:
        seq, head_hash = heads[path]
        votes[head_hash] = len(support[path])
        heights[head_hash] = seq
    winner = choose_branch(votes, heights)
    source = next(p for p in paths if heads[p][1] == winner)
    on_branch = set(support[source])
    ordered = [source, *(p for p in paths if p != source)]
    return ChainView(
        criterion,
        source,
        heads[source][0] + 1,
        winner,
        tuple(ordered),
        tuple(p for p in ordered if p not in on_branch),
    )

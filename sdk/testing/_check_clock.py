"""Conformance suite for clocks."""

from __future__ import annotations

import random
from collections.abc import Callable

from ..errors import DecodeError
from ..interfaces import Clock, ClockOrder

__all__ = ["check_clock"]

_MIRROR = {
    ClockOrder.BEFORE: ClockOrder.AFTER,
    ClockOrder.AFTER: ClockOrder.BEFORE,
    ClockOrder.EQUAL: ClockOrder.EQUAL,
    ClockOrder.CONCURRENT: ClockOrder.CONCURRENT,
}

_GARBAGE: tuple[object, ...] = (
    b"",
    b"\x00",
    b"\xff",
    b"\xa0\x00",
    b"\x80",
    b"\x9f\xff",
    b"\xbf\xff",
    b"\x5f\x41\x00\xff",
    b"\xc1\x00",
    b"\xfb\x7f\xf8\x00\x00\x00\x00\x00\x00",
    b"\x1b\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\xa1\x41\x00\x01",
    b"\x82\x01\x41\x00",
    b"\x9b\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\xbb\x00\x00\x00\x01\x00\x00\x00\x00",
    b"\x81" * 100 + b"\x00",
    bytes(200_000),
    "not bytes",
    None,
    12,
)


def _fail(message: str) -> AssertionError:
    return AssertionError(f"check_clock: {message}")


def _order(clock: Clock, a: bytes, b: bytes) -> ClockOrder:
    order = clock.compare(a, b)
    if not isinstance(order, ClockOrder):
        raise _fail(f"compare returned {order!r}, not a ClockOrder")
    return order


def _history(
    factory: Callable[[bytes], Clock], rng: random.Random, clocks: int, steps: int
) -> tuple[list[Clock], list[bytes], list[int]]:
    """Run a random message history; return the clocks, every stamp issued and
    for each stamp the bitset of stamps that happened before it (the truth)."""
    owners = [rng.randbytes(32) for _ in range(clocks)]
    procs = [factory(owner) for owner in owners]
    stamps: list[bytes] = []
    past: list[int] = []
    knows = [0] * clocks  # bitset of stamps each process has seen (sent or received)
    last_own: list[int | None] = [None] * clocks
    for _ in range(steps):
        p = rng.randrange(clocks)
        if stamps and rng.random() < 0.5:
            i = rng.randrange(len(stamps))
            procs[p].observe(stamps[i])
            knows[p] |= past[i] | (1 << i)
            continue
        index = len(stamps)
        stamp = procs[p].stamp()
        if not isinstance(stamp, bytes):
            raise _fail(f"stamp() returned {type(stamp).__name__}, not bytes")
        previous = last_own[p]
        if (
            previous is not None
            and _order(procs[p], stamps[previous], stamp) is not ClockOrder.BEFORE
        ):
            raise _fail("a clock's later stamp does not compare AFTER its earlier one")
        stamps.append(stamp)
        past.append(knows[p])
        knows[p] |= 1 << index
        last_own[p] = index
    return procs, stamps, past


def _check_laws(
    clock: Clock, stamps: list[bytes], past: list[int], rng: random.Random, exact: bool
) -> None:
    n = len(stamps)
    orders: dict[tuple[int, int], ClockOrder] = {}
    for i in range(n):
        for j in range(n):
            order = _order(clock, stamps[i], stamps[j])
            orders[i, j] = order
            if (order is ClockOrder.EQUAL) != (stamps[i] == stamps[j]):
                raise _fail(f"compare gave {order.value} for stamps {i} and {j}: "
                            "EQUAL must hold exactly for identical stamps")
            if i != j and stamps[i] == stamps[j]:
                raise _fail(f"two different events got the same stamp ({i} and {j})")
            if j < i and _MIRROR[orders[j, i]] is not order:
                raise _fail(f"compare is not antisymmetric on stamps {i} and {j}")
            if (past[j] >> i) & 1 and order is not ClockOrder.BEFORE:
                raise _fail(f"stamp {i} happened before stamp {j} but compares {order.value}")
            if order is ClockOrder.CONCURRENT and ((past[j] >> i) & 1 or (past[i] >> j) & 1):
                raise _fail(f"stamps {i} and {j} are causally related but compare concurrent")
            if exact and i != j and order is ClockOrder.BEFORE and not (past[j] >> i) & 1:
                raise _fail(f"stamp {i} compares BEFORE {j} but did not happen before it")
    for _ in range(min(4000, n**3)):
        i, j, k = rng.randrange(n), rng.randrange(n), rng.randrange(n)
        chained = orders[i, j] is ClockOrder.BEFORE and orders[j, k] is ClockOrder.BEFORE
        if chained and orders[i, k] is not ClockOrder.BEFORE:
            raise _fail(f"compare is not transitive on stamps {i}, {j}, {k}")


def _check_rejects(factory: Callable[[bytes], Clock], valid: bytes, rng: random.Random) -> None:
    owner = rng.randbytes(32)
    clock = factory(owner)
    twin = factory(owner)
    clock.observe(valid)
    twin.observe(valid)
    samples: list[object] = list(_GARBAGE)
    samples += [valid + b"\x00", valid[:-1], valid[: len(valid) // 2], bytearray(b"\xff")]
    for _ in range(300):
        mutated = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] ^= 1 << rng.randrange(8)
        samples.append(bytes(mutated))
    for sample in samples:
        for attempt in ("observe", "compare-left", "compare-right"):
            try:
                if attempt == "observe":
                    clock.observe(sample)  # type: ignore[arg-type]
                    twin.observe(sample)  # type: ignore[arg-type]
                elif attempt == "compare-left":
                    _order(clock, sample, valid)  # type: ignore[arg-type]
                else:
                    _order(clock, valid, sample)  # type: ignore[arg-type]
            except DecodeError:
                continue
            except Exception as exc:
                raise _fail(f"{attempt} of {sample!r:.60} raised {type(exc).__name__}: {exc}, "
                            "not DecodeError") from exc
    if clock.stamp() != twin.stamp():
        raise _fail("a rejected stamp changed the clock")


def check_clock(
    factory: Callable[[bytes], Clock], *, exact: bool = False, seed: int = 0
) -> None:
    """Check that clocks built by ``factory(owner_public_key)`` behave as a
    :class:`~ketten.interfaces.Clock`; raise :class:`AssertionError` if not.

    Checked on random message histories between several clocks (seeded by
    ``seed``, so a failure replays): stamps are bytes and every stamp of a
    clock compares ``AFTER`` its earlier ones; ``observe`` merges (a stamp
    issued after observing ``s`` compares ``AFTER`` ``s``); ``compare`` is
    antisymmetric and transitive, answers ``EQUAL`` exactly for identical
    stamps, ``BEFORE`` whenever the first event happened before the second
    and ``CONCURRENT`` only for unrelated events; with ``exact=True`` (vector
    clocks) ``BEFORE`` holds *only* when the first event happened before the
    second. Stamps are deterministic (same owner and history, same bytes)
    and self-contained (any instance compares any stamps). ``observe`` and
    ``compare`` reject garbage, truncated, extended and bit-flipped stamps
    and non-bytes with :class:`~ketten.errors.DecodeError` and no other
    exception, and a rejected stamp leaves the clock unchanged.
    """
    rng = random.Random(seed)
    for clocks, steps in ((2, 12), (3, 40), (5, 70)):
        history_seed = rng.getrandbits(64)
        procs, stamps, past = _history(factory, random.Random(history_seed), clocks, steps)
        again, stamps_again, _ = _history(factory, random.Random(history_seed), clocks, steps)
        if stamps != stamps_again:
            raise _fail("the same history produced different stamp bytes")
        stranger = factory(rng.randbytes(32))
        _check_laws(stranger, stamps, past, rng, exact)
        for i, stamp in enumerate(stamps):
            receiver = factory(rng.randbytes(32))
            receiver.observe(stamp)
            if _order(receiver, stamp, receiver.stamp()) is not ClockOrder.BEFORE:
                raise _fail(f"a stamp issued after observing stamp {i} does not compare AFTER it")
        if stamps:
            _check_rejects(factory, stamps[-1], rng)
        del procs, again

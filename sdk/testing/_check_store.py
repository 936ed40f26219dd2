"""Conformance suite for stores: :func:`check_store`."""

from __future__ import annotations

import random
import secrets
from collections.abc import Awaitable, Callable, Sequence

import trio

from .._core.chain import Chain, Verify
from .._core.event import Event
from .._core.identity import Identity
from ..errors import StoreConflict, StoreError
from ..interfaces import Store

__all__ = ["check_store"]

StoreFactory = Callable[[str], Store]


class _Section:
    """Names the part of the suite that failed in every assertion message."""

    def __init__(self, name: str) -> None:
        self.name = name

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            raise AssertionError(f"check_store [{self.name}]: {message}")

    async def conflict(self, what: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except StoreConflict:
            return
        raise AssertionError(f"check_store [{self.name}]: {what} must raise StoreConflict")


def _ids(events: Sequence[Event | None]) -> list[str]:
    return [f"seq {e.seq} {e.hash.hex()[:8]}" if e is not None else "None" for e in events]


def _make(
    identity: Identity,
    criterion: bytes,
    prev: Event | None,
    payload: bytes,
    *,
    command: int | None = None,
    seq: int | None = None,
) -> Event:
    return Event.create(
        identity,
        criterion=criterion,
        seq=(prev.seq + 1 if prev is not None else 0) if seq is None else seq,
        prev=prev.hash if prev is not None else None,
        payload=payload,
        time=1_700_000_000_000,
        command=command,
    )


def _run_of(
    identity: Identity, criterion: bytes, after: Event | None, count: int, tag: bytes,
    *, first_command: int | None = None,
) -> list[Event]:
    events: list[Event] = []
    prev = after
    for i in range(count):
        command = None if first_command is None else first_command + i
        prev = _make(identity, criterion, prev, tag + b"-%d" % i, command=command)
        events.append(prev)
    return events


def _key(name: str) -> bytes:
    return (name.encode() * 32)[:32]


async def _opened(factory: StoreFactory, location: str) -> Store:
    store = factory(location)
    await store.open()
    return store


async def _same_chain(s: _Section, store: Store, criterion: bytes, expected: list[Event],
                      what: str) -> None:
    got = await store.range(criterion)
    s.expect(
        [e.to_bytes() for e in got] == [e.to_bytes() for e in expected],
        f"{what}: range() returned {_ids(got)}, expected {_ids(expected)}",
    )
    head = await store.head(criterion)
    want = expected[-1] if expected else None
    s.expect(head == want, f"{what}: head() is {_ids([head])}, expected {_ids([want])}")
    heads = await store.heads()
    if expected:
        s.expect(
            heads.get(criterion) == (expected[-1].seq, expected[-1].hash),
            f"{what}: heads()[criterion] is {heads.get(criterion)!r}, expected "
            f"(seq {expected[-1].seq}, hash of the head)",
        )
    else:
        s.expect(criterion not in heads, f"{what}: heads() lists a chain that has no events")


async def _check_empty(factory: StoreFactory, location: str) -> None:
    s = _Section("empty store")
    store = await _opened(factory, location)
    try:
        key = _key("empty")
        s.expect(dict(await store.heads()) == {}, "a new location must give an empty store")
        s.expect(await store.head(key) is None, "head() of an unknown criterion must be None")
        s.expect(await store.range(key) == [], "range() of an unknown criterion must be []")
        s.expect(await store.get(b"\0" * 32) is None, "get() of an unknown hash must be None")
        s.expect(await store.orphans(key) == [], "orphans() of an unknown criterion must be []")
        s.expect(await store.by_command(key, b"\1" * 32, 1) is None,
                 "by_command() of an unknown criterion must be None")
        s.expect(await store.get_cursor("nobody") is None, "an unknown cursor must be None")
        await store.append([])
        s.expect(dict(await store.heads()) == {}, "append([]) must not create anything")
    finally:
        await store.aclose()


async def _check_append_read(factory: StoreFactory, location: str) -> None:
    s = _Section("append and read")
    ident = Identity.from_seed(b"\x11" * 32)
    a, b, c = _key("a"), _key("b"), _key("c")
    store = await _opened(factory, location)
    try:
        a0 = _make(ident, a, None, b"a0")
        b0 = _make(ident, b, None, b"b0")
        a1 = _make(ident, a, a0, b"a1")
        a2 = _make(ident, a, a1, b"a2")
        b1 = _make(ident, b, b0, b"b1")
        await store.append([a0, b0, a1, a2, b1])
        chain_a = [a0, a1, a2]
        more = _run_of(ident, a, a2, 7, b"more")
        for event in more:
            await store.append([event])
        chain_a += more
        await _same_chain(s, store, a, chain_a, "after a mixed batch and single appends")
        await _same_chain(s, store, b, [b0, b1], "second criterion of a mixed batch")
        await _same_chain(s, store, c, [], "criterion never written")
        heads = dict(await store.heads())
        s.expect(set(heads) == {a, b}, f"heads() has {len(heads)} chains, expected 2")
        for start, stop in [(0, 1), (3, 5), (9, None), (10, None), (4, 4), (6, 2), (0, 100),
                            (5, None)]:
            got = await store.range(a, start, stop)
            want = chain_a[start:stop]
            s.expect(
                [e.hash for e in got] == [e.hash for e in want],
                f"range(a, {start}, {stop}) returned {_ids(got)}, expected {_ids(want)}",
            )
        for event in [*chain_a, b0, b1]:
            got_event = await store.get(event.hash)
            s.expect(
                got_event is not None and got_event.to_bytes() == event.to_bytes(),
                f"get() of seq {event.seq} did not return the stored event",
            )
            s.expect(isinstance(got_event, Event), "get() must return ketten.Event objects")
    finally:
        await store.aclose()


async def _check_conflicts(factory: StoreFactory, location: str) -> None:
    s = _Section("append conflicts are all-or-none")
    ident = Identity.from_seed(b"\x12" * 32)
    other = Identity.from_seed(b"\x13" * 32)
    a, b = _key("a"), _key("b")
    store = await _opened(factory, location)
    try:
        chain = _run_of(ident, a, None, 3, b"a")
        b0 = _make(ident, b, None, b"b0")
        await store.append([*chain, b0])
        head = chain[-1]
        fresh = _make(ident, a, head, b"next")
        cases: list[tuple[str, list[Event]]] = [
            ("an event whose seq is taken", [_make(ident, a, chain[0], b"fork")]),
            ("a second genesis", [_make(other, a, None, b"genesis again")]),
            ("an event linking to a non-head hash",
             [_make(ident, a, chain[0], b"bad link", seq=head.seq + 1)]),
            ("an event leaving a gap", [_make(ident, a, fresh, b"gap")]),
            ("a non-genesis first event of a chain",
             [_make(ident, _key("new"), chain[0], b"orphan start", seq=1)]),
            ("a batch whose second event does not extend the first",
             [fresh, _make(ident, a, head, b"also on head")]),
            ("a batch whose events of one criterion are out of order",
             [_make(ident, a, fresh, b"x"), fresh]),
            ("a batch with a good event of one chain and a bad one of another",
             [fresh, _make(ident, b, None, b"b genesis again")]),
            ("the same event twice in one batch", [fresh, fresh]),
        ]
        for what, batch in cases:

            def append(batch: list[Event] = batch) -> Awaitable[None]:
                return store.append(batch)

            await s.conflict(f"appending {what}", append)
            await _same_chain(s, store, a, chain, f"after refusing {what}")
            await _same_chain(s, store, b, [b0], f"after refusing {what}")
            s.expect(await store.get(fresh.hash) is None,
                     f"after refusing {what}: an event of the refused batch is stored")
        await store.append([fresh])
        await _same_chain(s, store, a, [*chain, fresh], "appending after refused batches")
    finally:
        await store.aclose()


async def _check_commands(factory: StoreFactory, location: str) -> None:
    s = _Section("command index")
    alice = Identity.from_seed(b"\x14" * 32)
    bob = Identity.from_seed(b"\x15" * 32)
    a, b = _key("a"), _key("b")
    store = await _opened(factory, location)
    try:
        a0 = _make(alice, a, None, b"a0", command=1)
        a1 = _make(alice, a, a0, b"a1", command=2)
        a2 = _make(bob, a, a1, b"a2", command=1)
        b0 = _make(alice, b, None, b"b0", command=1)
        a3 = _make(alice, a, a2, b"a3")
        await store.append([a0, a1, a2, b0, a3])
        for event, owner, number in [(a0, alice, 1), (a1, alice, 2), (a2, bob, 1)]:
            found = await store.by_command(a, owner.public_key, number)
            s.expect(found == event,
                     f"by_command(a, author, {number}) returned {_ids([found])}, "
                     f"expected {_ids([event])}")
        found_b = await store.by_command(b, alice.public_key, 1)
        s.expect(found_b == b0, "the same command id in another chain must be its own entry")
        s.expect(await store.by_command(a, bob.public_key, 2) is None,
                 "by_command() of a command the author never used must be None")
        s.expect(await store.by_command(a, alice.public_key, 3) is None,
                 "by_command() of an unused command number must be None")
        reused = _make(alice, a, a3, b"same id, other content", command=1)
        await s.conflict("appending a reused command id (author, command)",
                         lambda: store.append([reused]))
        twice = [_make(alice, a, a3, b"x", command=7)]
        twice.append(_make(alice, a, twice[0], b"y", command=7))
        await s.conflict("a batch using one command id twice", lambda: store.append(twice))
        await _same_chain(s, store, a, [a0, a1, a2, a3], "after refused command reuse")
        s.expect(await store.by_command(a, alice.public_key, 7) is None,
                 "a refused batch left its command id in the index")
        ok = _make(alice, a, a3, b"new id", command=3)
        await store.append([ok])
        s.expect(await store.by_command(a, alice.public_key, 3) == ok,
                 "a fresh command id must be indexed")
    finally:
        await store.aclose()


async def _check_forks(factory: StoreFactory, location: str) -> None:
    s = _Section("forks and orphans")
    ident = Identity.from_seed(b"\x16" * 32)
    rival = Identity.from_seed(b"\x17" * 32)
    a = _key("a")
    store = await _opened(factory, location)
    try:
        chain = _run_of(ident, a, None, 6, b"main", first_command=10)
        await store.append(chain)
        winner = _run_of(rival, a, chain[2], 2, b"winner")
        winner[1] = _make(ident, a, winner[0], b"winner reuses", command=14)
        removed = await store.replace_from(a, 3, winner)
        s.expect(removed == chain[3:],
                 f"replace_from(a, 3, ...) returned {_ids(removed)}, expected the orphaned "
                 f"{_ids(chain[3:])}")
        main = [*chain[:3], *winner]
        await _same_chain(s, store, a, main, "after replace_from")
        orphans = await store.orphans(a)
        s.expect(orphans == chain[3:], f"orphans() is {_ids(orphans)}, expected "
                 f"{_ids(chain[3:])}")
        for event in chain:
            s.expect(await store.get(event.hash) == event,
                     f"get() must still find seq {event.seq} after it became an orphan")
        s.expect(await store.by_command(a, ident.public_key, 13) is None,
                 "by_command() must not return an orphaned event")
        s.expect(await store.by_command(a, ident.public_key, 14) == winner[1],
                 "a replacement may reuse the command id of an orphaned event")
        s.expect(await store.by_command(a, ident.public_key, 12) == chain[2],
                 "events before the fork keep their command ids")

        bad_link = [_make(rival, a, chain[0], b"bad", seq=3)]
        other_criterion = [_make(ident, _key("x"), winner[1], b"x")]
        kept_command = [_make(ident, a, winner[1], b"r", command=11)]
        refused: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("replace_from beyond the head", lambda: store.replace_from(a, 7, [])),
            ("replace_from with a replacement that does not link",
             lambda: store.replace_from(a, 3, bad_link)),
            ("replace_from with a replacement of another criterion",
             lambda: store.replace_from(a, 5, other_criterion)),
            ("replace_from reusing a command id of the kept chain",
             lambda: store.replace_from(a, 5, kept_command)),
        ]
        for what, call in refused:
            await s.conflict(what, call)
            await _same_chain(s, store, a, main, f"after refusing {what}")
            s.expect(await store.orphans(a) == chain[3:], f"{what} changed the orphans")

        removed = await store.replace_from(a, 4, [])
        s.expect(removed == winner[1:], "replace_from(a, 4, []) must orphan seq 4 only")
        main = main[:4]
        await _same_chain(s, store, a, main, "after replacing a tail by nothing")
        s.expect(await store.orphans(a) == [*chain[3:], winner[1]],
                 "orphans must list every lost branch, oldest first")
        extra = _make(ident, a, main[-1], b"extend")
        s.expect(await store.replace_from(a, 4, [extra]) == [],
                 "replace_from at the height must orphan nothing")
        main.append(extra)
        await _same_chain(s, store, a, main, "after replace_from at the height")
        restored = await store.replace_from(a, 3, chain[3:])
        s.expect(restored == [winner[0], extra], "switching back must orphan the other branch")
        await _same_chain(s, store, a, chain, "after switching back to an orphaned branch")
        s.expect(await store.get(chain[4].hash) == chain[4],
                 "an event that is both main and orphan must be found")
        await store.replace_from(a, 0, [])
        await _same_chain(s, store, a, [], "after replacing the whole chain by nothing")
        genesis = _make(rival, a, None, b"new genesis")
        await store.append([genesis])
        await _same_chain(s, store, a, [genesis], "after a new genesis on an emptied chain")
    finally:
        await store.aclose()


async def _check_drop(factory: StoreFactory, location: str) -> None:
    s = _Section("drop")
    ident = Identity.from_seed(b"\x19" * 32)
    a, b = _key("a"), _key("b")
    store = await _opened(factory, location)
    try:
        s.expect(await store.drop(a) == 0, "drop() of a chain never held must return 0")
        chain = _run_of(ident, a, None, 5, b"dropped", first_command=1)
        kept = _run_of(ident, b, None, 3, b"kept", first_command=1)
        await store.append(chain)
        await store.append(kept)
        winner = _run_of(ident, a, chain[1], 2, b"winner")
        await store.replace_from(a, 2, winner)
        await store.put_cursor("drop-test", b"kept")
        went = await store.drop(a)
        s.expect(went == 7, f"drop() returned {went}, expected 7 (4 main-chain events and "
                 "3 orphans)")

        async def gone(what: str) -> None:
            await _same_chain(s, store, a, [], what)
            s.expect(await store.orphans(a) == [], f"{what}: orphans() must be []")
            for event in [*chain, *winner]:
                s.expect(await store.get(event.hash) is None,
                         f"{what}: get() still finds seq {event.seq} of the dropped chain")
            s.expect(await store.by_command(a, ident.public_key, 1) is None,
                     f"{what}: by_command() still finds an event of the dropped chain")
            await _same_chain(s, store, b, kept, f"{what}: another chain")
            s.expect(await store.get_cursor("drop-test") == b"kept",
                     f"{what}: drop() must leave cursors alone")

        await gone("after drop()")
        s.expect(await store.drop(a) == 0, "drop() of a dropped chain must return 0")
        await store.aclose()
        await store.open()
        await gone("after drop(), close and reopen")
        again = _run_of(ident, a, None, 2, b"again", first_command=1)
        await store.append(again)
        await _same_chain(s, store, a, again,
                          "a new chain with the same command ids after drop()")
        await store.aclose()
        await store.open()
        await _same_chain(s, store, a, again, "the new chain after close and reopen")
        s.expect(await store.orphans(a) == [], "the new chain after reopen has no orphans")
    finally:
        await store.aclose()


async def _check_cursors(factory: StoreFactory, location: str) -> None:
    s = _Section("cursors")
    store = await _opened(factory, location)
    try:
        values = {"a": b"1", "sub/\u00fc\u2603": b"\x00\xff" * 100, "empty": b"", "x" * 300: b"2"}
        for name, value in values.items():
            await store.put_cursor(name, value)
        await store.put_cursor("a", b"3")
        values["a"] = b"3"
        for name, value in values.items():
            got = await store.get_cursor(name)
            s.expect(got == value, f"get_cursor({name[:20]!r}) is {got!r:.40}, expected {value!r:.40}")
            s.expect(type(got) is bytes, "get_cursor() must return bytes")
    finally:
        await store.aclose()


async def _check_persistence(factory: StoreFactory, location: str) -> None:
    s = _Section("persistence across close and reopen")
    ident = Identity.from_seed(b"\x18" * 32)
    a, b = _key("a"), _key("b")
    store = await _opened(factory, location)
    chain_a = _run_of(ident, a, None, 5, b"a", first_command=1)
    chain_b = _run_of(ident, b, None, 3, b"b")
    branch = _run_of(ident, a, chain_a[1], 2, b"branch")
    await store.append(chain_a)
    await store.append(chain_b)
    await store.replace_from(a, 2, branch)
    await store.put_cursor("sub", b"cursor-1")
    await store.aclose()
    main_a = [*chain_a[:2], *branch]

    async def same(store: Store, what: str) -> None:
        await _same_chain(s, store, a, main_a, what)
        await _same_chain(s, store, b, chain_b, what)
        s.expect(await store.orphans(a) == chain_a[2:], f"{what}: orphans changed")
        s.expect(await store.get(chain_a[4].hash) == chain_a[4], f"{what}: orphan lost")
        s.expect(await store.by_command(a, ident.public_key, 2) == chain_a[1],
                 f"{what}: command index lost")
        s.expect(await store.get_cursor("sub") == b"cursor-1", f"{what}: cursor lost")

    reopened = await _opened(factory, location)
    try:
        await same(reopened, "a new store object on the same location")
        reuse = [_make(ident, a, main_a[-1], b"x", command=1)]
        await s.conflict("reusing a command id after reopening", lambda: reopened.append(reuse))
        more = _make(ident, a, main_a[-1], b"after reopen")
        await reopened.append([more])
        main_a.append(more)
        await reopened.put_cursor("sub", b"cursor-2")
    finally:
        await reopened.aclose()
    await reopened.open()
    try:
        await _same_chain(s, reopened, a, main_a, "the same store object opened again")
        s.expect(await reopened.get_cursor("sub") == b"cursor-2",
                 "a cursor overwritten before close was not kept")
    finally:
        await reopened.aclose()
    for call in ("append", "heads"):
        try:
            if call == "append":
                await reopened.append([_make(ident, b, chain_b[-1], b"closed")])
            else:
                await reopened.heads()
        except StoreError:
            continue
        raise AssertionError(f"check_store [{s.name}]: {call}() on a closed store must raise "
                             "StoreError")


async def _check_concurrency(
    factory: StoreFactory, location: str, writers: int, appends: int, criteria_count: int
) -> None:
    s = _Section("concurrent writers and readers")
    store = await _opened(factory, location)
    criteria = [_key(f"concurrent-{i}") for i in range(criteria_count)]
    identities = [Identity.from_seed(bytes([0x40 + w]) * 32) for w in range(writers)]
    sizes: dict[tuple[int, int], int] = {}
    done = False

    def check_batches(events: list[Event], complete: bool) -> None:
        position: dict[tuple[int, int], int] = {}
        prev_key: tuple[int, int] | None = None
        for event in events:
            writer, batch, index, count = (int(x) for x in event.payload.split(b":"))
            key = (writer, batch)
            expected = position.get(key, 0)
            s.expect(index == expected and (index == 0 or prev_key == key),
                     f"batch {key} of writer {writer} is interleaved or out of order at "
                     f"seq {event.seq}")
            position[key] = index + 1
            prev_key = key
            if index + 1 == count:
                position[key] = -1
        partial = [key for key, pos in position.items() if pos != -1]
        s.expect(not partial, f"a reader saw only part of the batches {partial[:3]}")
        if complete:
            s.expect(all(sizes.get(key) is not None for key in position),
                     "a chain holds a batch nobody appended")

    async def writer(w: int) -> None:
        rng = random.Random(w)
        ident = identities[w]
        for batch in range(appends):
            criterion = criteria[rng.randrange(criteria_count)]
            count = rng.randint(1, 3)
            while True:
                head = await store.head(criterion)
                events: list[Event] = []
                prev = head
                for i in range(count):
                    prev = _make(ident, criterion, prev, b"%d:%d:%d:%d" % (w, batch, i, count),
                                 command=batch * 4 + i)
                    events.append(prev)
                try:
                    await store.append(events)
                except StoreConflict:
                    continue
                break
            sizes[(w, batch)] = count

    async def reader() -> None:
        seen_heights = dict.fromkeys(criteria, 0)
        while not done:
            for criterion in criteria:
                events = await store.range(criterion)
                Chain(criterion, verify=Verify.LINKS, events=events)
                check_batches(events, complete=False)
                s.expect(len(events) >= seen_heights[criterion],
                         "a chain got shorter while only appends happened")
                seen_heights[criterion] = len(events)
                heads = await store.heads()
                if criterion in heads:
                    s.expect(heads[criterion][0] + 1 >= len(events),
                             "heads() lags behind a range() read before it")
            await trio.sleep(0)

    try:
        async with trio.open_nursery() as outer:
            for _ in range(2):
                outer.start_soon(reader)
            async with trio.open_nursery() as nursery:
                for w in range(writers):
                    nursery.start_soon(writer, w)
            done = True
        total = 0
        for criterion in criteria:
            events = await store.range(criterion)
            try:
                Chain(criterion, verify=Verify.FULL, events=events)
            except Exception as exc:
                raise AssertionError(
                    f"check_store [{s.name}]: a chain does not validate: {exc}"
                ) from exc
            check_batches(events, complete=True)
            total += len(events)
        expected = sum(sizes.values())
        s.expect(len(sizes) == writers * appends, "not every append returned")
        s.expect(total == expected,
                 f"the chains hold {total} events, {expected} were appended (lost or duplicated)")
    finally:
        await store.aclose()


async def check_store(
    factory: StoreFactory,
    *,
    writers: int = 10,
    appends: int = 100,
    criteria: int = 4,
) -> None:
    """Check that the stores made by ``factory`` behave like a ketten :class:`~ketten.interfaces.Store`.

    ``factory(location)`` returns a new, unopened store object. The same
    ``location`` string must give a store on the same underlying data (the
    suite closes stores and opens them again); a location it has not seen
    must give an empty store. A store kept in files typically maps the
    location to a subdirectory of a temporary directory::

        async def test_my_store(tmp_path):
            await ketten.testing.check_store(lambda loc: MyStore(path=tmp_path / loc))

    The suite covers appending and reading (``append``, ``get``, ``head``,
    ``heads``, ``range``), all-or-none refusal of batches that do not extend
    their chain head, the command index (a reused ``(author, command)`` is a
    :class:`~ketten.errors.StoreConflict`), forks (``replace_from`` and
    ``orphans``), dropping a chain (``drop``), cursors, persistence of all of it across ``aclose()`` and
    ``open()``, :class:`~ketten.errors.StoreError` on a closed store, and
    ``writers`` concurrent tasks each making ``appends`` appends of 1-3
    events over ``criteria`` chains (retrying on conflicts) while readers
    check that no batch is ever seen in part, interleaved, lost or duplicated.

    Each check uses fresh locations. A failure raises :class:`AssertionError`
    naming the section and what was expected; an unexpected exception from
    the store carries a note naming the section.
    """
    run = secrets.token_hex(4)
    sections: list[tuple[str, Callable[[str], Awaitable[None]]]] = [
        ("empty", lambda loc: _check_empty(factory, loc)),
        ("append-read", lambda loc: _check_append_read(factory, loc)),
        ("conflicts", lambda loc: _check_conflicts(factory, loc)),
        ("commands", lambda loc: _check_commands(factory, loc)),
        ("forks", lambda loc: _check_forks(factory, loc)),
        ("cursors", lambda loc: _check_cursors(factory, loc)),
        ("drop", lambda loc: _check_drop(factory, loc)),
        ("persistence", lambda loc: _check_persistence(factory, loc)),
        ("concurrency",
         lambda loc: _check_concurrency(factory, loc, writers, appends, criteria)),
    ]
    for name, section in sections:
        try:
            await section(f"check-store-{run}-{name}")
        except AssertionError:
            raise
        except BaseException as exc:
            exc.add_note(f"raised by the store during check_store section {name!r}")
            raise

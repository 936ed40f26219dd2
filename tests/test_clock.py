"""Lamport and vector clocks: conformance, seed 001's vector ADT, codecs, plugins."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from ketten import DecodeError, Identity, NodeConfig, installed_names, open_node, plugin_manager
from ketten._core.codec import dumps
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import ConfigError, UsageError
from ketten.interfaces import Clock, ClockOrder
from ketten.plugins._clock_vector import (
    VectorDecoder,
    compare_vectors,
    decode_vector,
    encode_vector,
    merge_into,
)
from ketten.plugins.lamport_clock import LamportClock, decode_lamport, encode_lamport
from ketten.plugins.vector_clock import VectorClock
from ketten.testing import check_clock


def key(i: int) -> bytes:
    """Seed 001 numbers processes 1, 2, 3, ...; here they become author keys."""
    return i.to_bytes(32, "big")


def vec(*counters: int) -> dict[bytes, int]:
    return {key(i + 1): c for i, c in enumerate(counters) if c}


# -- conformance -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_vector_clock_conforms(seed: int) -> None:
    check_clock(VectorClock, exact=True, seed=seed)


@pytest.mark.parametrize("seed", range(4))
def test_lamport_clock_conforms(seed: int) -> None:
    check_clock(LamportClock, seed=seed)


def test_lamport_is_not_an_exact_clock() -> None:
    with pytest.raises(AssertionError, match="did not happen before"):
        check_clock(LamportClock, exact=True)


def test_check_clock_catches_a_clock_that_forgets_observations() -> None:
    class Forgetful(VectorClock):
        def observe(self, stamp: bytes) -> None:
            decode_vector(stamp)

    with pytest.raises(AssertionError, match="check_clock"):
        check_clock(Forgetful)


def test_check_clock_catches_a_clock_raising_the_wrong_error() -> None:
    class Sloppy(LamportClock):
        def observe(self, stamp: bytes) -> None:
            if not stamp:
                raise IndexError("empty")
            super().observe(stamp)

    with pytest.raises(AssertionError, match="not DecodeError"):
        check_clock(Sloppy)


# -- seed 001, section 2.2 -----------------------------------------------------------


def test_sync_pads_vectors_of_different_sizes() -> None:
    # syncVT({3,[1,4,3]}, {4,[2,3,1,5]}) = {3,[2,4,3,5]}
    clock = VectorClock(key(3))
    clock.observe(encode_vector(vec(1, 4, 3)))
    clock.observe(encode_vector(vec(2, 3, 1, 5)))
    assert clock.vector() == vec(2, 4, 3, 5)
    merged = vec(1, 4, 3)
    merge_into(merged, vec(2, 3, 1, 5))
    assert merged == vec(2, 4, 3, 5)


def test_tick_increments_only_the_own_entry() -> None:
    # tickVT({2,[2,1]}) = {2,[2,2]}
    clock = VectorClock(key(2))
    clock.observe(encode_vector(vec(2, 1)))
    assert decode_vector(clock.stamp()) == vec(2, 2)


@pytest.mark.parametrize(
    ("a", "b", "order"),
    [
        ((1, 2), (1, 2, 0), ClockOrder.EQUAL),
        ((1, 2), (1, 2, 1), ClockOrder.BEFORE),
        ((2, 2, 1), (1, 2), ClockOrder.AFTER),
        ((1, 3), (2, 2, 0, 0), ClockOrder.CONCURRENT),
        ((), (0, 0, 1), ClockOrder.BEFORE),
    ],
)
def test_compare_pads_with_zeros(a: tuple[int, ...], b: tuple[int, ...], order: ClockOrder) -> None:
    clock = VectorClock(key(9))
    assert clock.compare(encode_vector(vec(*a)), encode_vector(vec(*b))) is order


def test_zero_entries_are_not_encoded() -> None:
    assert encode_vector(vec(1, 0, 2)) == encode_vector({key(1): 1, key(3): 2, key(2): 0})
    assert decode_vector(encode_vector(vec(0, 0))) == {}


# -- strict codecs -------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        dumps({key(1): 0}),  # zero counter
        dumps({key(1): -1}),
        dumps({key(1)[:31]: 1}),  # short key
        dumps({"a" * 32: 1}),
        dumps([1, 2]),
        dumps({key(1): 1}) + b"\x00",  # trailing byte
        b"\xa1\x58\x20" + key(1) + b"\x18\x01",  # counter 1 in a two-byte form
        b"\xa2\x58\x20" + key(2) + b"\x01\x58\x20" + key(1) + b"\x01",  # keys unsorted
        b"\xa2\x58\x20" + key(1) + b"\x01\x58\x20" + key(1) + b"\x02",  # duplicate key
        dumps({key(1): 2**63}),
    ],
)
def test_vector_decoder_rejects_non_canonical_stamps(data: bytes) -> None:
    with pytest.raises(DecodeError, match="vector stamp"):
        decode_vector(data)


@pytest.mark.parametrize("authors", [3, 30, 300])
def test_vector_decoder_rejects_indefinite_length_maps(authors: int) -> None:
    canonical = encode_vector({key(i): 5 for i in range(1, authors + 1)})
    head = 1 if authors < 24 else 2 if authors < 256 else 3
    entries = canonical[head:]
    # same entries behind an indefinite-length head, and with one counter in a
    # two-byte form: as long as the canonical encoding from 24 authors on
    first = 2 + 32
    longer = entries[:first] + b"\x18\x05" + entries[first + 1:]
    for data in (b"\xbf" + entries + b"\xff", b"\xbf" + longer + b"\xff"):
        with pytest.raises(DecodeError, match="vector stamp"):
            decode_vector(data)
        with pytest.raises(DecodeError, match="vector stamp"):
            VectorDecoder()(data)


def test_vector_decoder_bounds_the_number_of_authors() -> None:
    stamp = encode_vector({key(i): 1 for i in range(1, 11)})
    assert len(decode_vector(stamp, max_authors=10)) == 10
    with pytest.raises(DecodeError):
        decode_vector(stamp, max_authors=9)
    with pytest.raises(DecodeError):
        VectorClock(key(1), max_authors=9).observe(stamp)


@pytest.mark.parametrize(
    "data",
    [
        dumps([0, key(1)]),
        dumps([1, key(1)[:5]]),
        dumps([1]),
        dumps({1: key(1)}),
        b"\x82\x18\x01\x58\x20" + key(1),  # counter 1 in a two-byte form
    ],
)
def test_lamport_decoder_rejects_bad_stamps(data: bytes) -> None:
    with pytest.raises(DecodeError, match="lamport stamp"):
        decode_lamport(data)


def test_clock_owner_must_be_a_public_key() -> None:
    with pytest.raises(UsageError):
        VectorClock(b"short")
    with pytest.raises(UsageError):
        LamportClock(b"short")


# -- properties -------------------------------------------------------------------------

authors = st.integers(min_value=1, max_value=6).map(key)
vectors = st.dictionaries(authors, st.integers(min_value=1, max_value=2**63 - 1), max_size=6)
small_vectors = st.dictionaries(authors, st.integers(min_value=0, max_value=4), max_size=6)


def padded(v: dict[bytes, int]) -> list[int]:
    return [v.get(key(i), 0) for i in range(1, 7)]


@given(vectors)
def test_vector_encoding_round_trips(v: dict[bytes, int]) -> None:
    data = encode_vector(v)
    assert decode_vector(data) == v
    assert encode_vector(decode_vector(data)) == data


@given(st.binary(max_size=200))
def test_vector_decoder_raises_only_decode_error(data: bytes) -> None:
    try:
        v = decode_vector(data)
    except DecodeError:
        return
    assert encode_vector(v) == data


widths = st.sampled_from([(1, 23), (24, 255), (256, 2**16 - 1), (2**16, 2**32 - 1),
                          (2**32, 2**63 - 1)])
counters = widths.flatmap(lambda r: st.integers(min_value=r[0], max_value=r[1]))


@settings(max_examples=60)
@given(
    st.lists(st.dictionaries(authors, counters, max_size=6), min_size=1, max_size=8),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=12),
)
def test_the_layout_cache_accepts_exactly_what_the_decoder_accepts(
    vectors: list[dict[bytes, int]], edits: list[tuple[int, int]]
) -> None:
    decoder = VectorDecoder(max_layouts=4)
    stamps = [encode_vector(v) for v in vectors]
    for data in stamps * 2:  # the second time round, layouts are known
        assert decoder(data) == decode_vector(data)
    for n, (where, value) in enumerate(edits):
        edited = bytearray(stamps[n % len(stamps)])
        edited[where % len(edited)] = value
        data = bytes(edited)
        try:
            expected = decode_vector(data)
        except DecodeError:
            with pytest.raises(DecodeError, match="vector stamp"):
                decoder(data)
        else:
            assert decoder(data) == expected


def test_the_layout_cache_keeps_the_author_bound() -> None:
    decoder = VectorDecoder(max_authors=2)
    assert decoder(encode_vector(vec(1, 2))) == vec(1, 2)
    assert decoder(encode_vector(vec(3, 4))) == vec(3, 4)
    with pytest.raises(DecodeError):
        decoder(encode_vector(vec(1, 2, 3)))
    with pytest.raises(DecodeError, match="expected bytes"):
        decoder("not bytes")  # type: ignore[arg-type]


@given(st.integers(min_value=1, max_value=2**63 - 1), authors)
def test_lamport_encoding_round_trips(counter: int, author: bytes) -> None:
    assert decode_lamport(encode_lamport(counter, author)) == (counter, author)


@given(st.binary(max_size=60))
def test_lamport_decoder_raises_only_decode_error(data: bytes) -> None:
    try:
        counter, author = decode_lamport(data)
    except DecodeError:
        return
    assert encode_lamport(counter, author) == data


@given(small_vectors, small_vectors)
def test_compare_matches_the_padded_definition(a: dict[bytes, int], b: dict[bytes, int]) -> None:
    x, y = padded(a), padded(b)
    le = all(p <= q for p, q in zip(x, y))
    ge = all(p >= q for p, q in zip(x, y))
    expected = (
        ClockOrder.EQUAL if le and ge
        else ClockOrder.BEFORE if le
        else ClockOrder.AFTER if ge
        else ClockOrder.CONCURRENT
    )
    assert compare_vectors(a, b) is expected
    clock = VectorClock(key(1))
    assert clock.compare(encode_vector(a), encode_vector(b)) is expected


@given(small_vectors, small_vectors, small_vectors)
def test_merge_is_the_least_upper_bound(
    a: dict[bytes, int], b: dict[bytes, int], c: dict[bytes, int]
) -> None:
    ab = dict(a)
    merge_into(ab, b)
    ba = dict(b)
    merge_into(ba, a)
    assert padded(ab) == padded(ba) == [max(p, q) for p, q in zip(padded(a), padded(b))]
    assert compare_vectors(a, ab) in (ClockOrder.BEFORE, ClockOrder.EQUAL)
    assert compare_vectors(b, ab) in (ClockOrder.BEFORE, ClockOrder.EQUAL)
    left = dict(ab)
    merge_into(left, c)
    bc = dict(b)
    merge_into(bc, c)
    right = dict(a)
    merge_into(right, bc)
    assert padded(left) == padded(right)


@settings(max_examples=50)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.integers(0, 1000)), max_size=40))
def test_vector_stamps_grow_and_observe_dominates(steps: list[tuple[int, bool, int]]) -> None:
    clocks = [VectorClock(key(i + 1)) for i in range(4)]
    issued: list[bytes] = []
    last: list[bytes | None] = [None] * 4
    for who, receive, pick in steps:
        clock = clocks[who]
        if receive and issued:
            seen = issued[pick % len(issued)]
            clock.observe(seen)
            after = clock.stamp()
            assert clock.compare(seen, after) is ClockOrder.BEFORE
        else:
            after = clock.stamp()
        previous = last[who]
        if previous is not None:
            assert clock.compare(previous, after) is ClockOrder.BEFORE
        last[who] = after
        issued.append(after)


# -- plugins ---------------------------------------------------------------------------------


def test_clocks_are_installed() -> None:
    assert {"lamport", "vector"} <= set(installed_names(plugin_manager(), "clock"))


@pytest.mark.parametrize(("name", "cls"), [("vector", VectorClock), ("lamport", LamportClock)])
async def test_node_stamps_its_events_with_the_configured_clock(
    name: str, cls: type[Clock]
) -> None:
    identity = Identity.from_seed(bytes(32))
    config = NodeConfig(
        clock=name, identity=identity, options={"transport": {"network": MemoryNetwork()}}
    )
    with trio.fail_after(10):
        async with open_node(config) as node:
            clock = node.clock
            assert isinstance(clock, cls)
            assert isinstance(clock, Clock)
            first = await node.append_local(key(1), b"one")
            second = await node.append_local(key(2), b"two")
    assert clock.compare(first.clock, second.clock) is ClockOrder.BEFORE
    if name == "vector":
        assert decode_vector(second.clock) == {identity.public_key: 2}
    else:
        assert decode_lamport(second.clock) == (2, identity.public_key)


async def test_clock_options_are_checked() -> None:
    config = NodeConfig(
        clock="vector",
        options={"transport": {"network": MemoryNetwork()}, "clock": {"max_author": 3}},
    )
    with pytest.raises(ConfigError, match="max_author"):
        async with open_node(config):
            pass  # pragma: no cover


def test_a_stamp_merged_before_is_not_decoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A node observes each event when it stores it and again when it delivers it.
    clock = VectorClock(key(9))
    decoded: list[bytes] = []
    decode = clock._decode

    def counting(data: bytes) -> dict[bytes, int]:
        decoded.append(bytes(data))
        return decode(data)

    monkeypatch.setattr(clock, "_decode", counting)
    first, second = encode_vector(vec(1, 4, 3)), encode_vector(vec(2, 3, 1, 5))
    for stamp in (first, second, first, bytes(second)):
        clock.observe(stamp)
    assert decoded == [first, second]
    assert clock.vector() == vec(2, 4, 3, 5)
    clock.observe(bytearray(encode_vector(vec(7))))  # not remembered, still merged
    clock.observe(bytearray(encode_vector(vec(7))))
    assert len(decoded) == 4 and clock.vector() == vec(7, 4, 3, 5)
    with pytest.raises(DecodeError):
        clock.observe(b"\xa1")
    with pytest.raises(DecodeError):
        clock.observe(b"\xa1")
    for n in range(3000):  # many stamps: the memory of them stays bounded, the merge exact
        clock.observe(encode_vector({key(100 + n % 50): n + 1}))
    assert clock.vector()[key(100 + 2999 % 50)] == 3000
    assert clock.vector()[key(1)] == 7

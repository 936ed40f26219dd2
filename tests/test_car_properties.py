"""CAR and block properties: the direct CID, varint and block encoders agree with the
``multiformats`` and ``dag-cbor`` packages, export then import gives the same bytes,
and damaged CARs are refused with ketten's errors only, storing nothing.
"""

from __future__ import annotations

import tempfile
from hashlib import sha256
from pathlib import Path
from typing import Any

import dag_cbor
import pytest
import trio
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from multiformats import CID, multihash, varint

from ketten import Event, Identity, criterion_key
from ketten._cli import main
from ketten._core import ipld
from ketten._core.car import car_header, car_section, read_car_header, read_car_sections
from ketten._core.chain_car import chain_blocks, chain_from_car
from ketten._core.ipld import (
    block_cid,
    cid_bytes,
    cid_from_bytes,
    cid_text,
    decode_block,
    event_block,
)
from ketten._core.ipld import varint as fast_varint
from ketten.errors import DecodeError, KettenError
from ketten.plugins.sqlite_store import SqliteStore

IDENTITIES = [Identity.from_seed(bytes([0x50 + i]) * 32) for i in range(3)]
CRIT = criterion_key("car-properties")
MAX_UINT = 2**63 - 1

events_fields = st.fixed_dictionaries({
    "payload": st.binary(max_size=300),
    "clock": st.binary(max_size=40),
    "time": st.integers(0, MAX_UINT),
    "command": st.none() | st.integers(0, MAX_UINT),
})


@st.composite
def chains(draw: st.DrawFn, max_size: int = 6) -> list[Event]:
    """A valid chain: random payloads, clocks, times, commands and writer lists."""
    writers = draw(st.none() | st.lists(st.sampled_from(IDENTITIES), min_size=1, max_size=3,
                                        unique_by=lambda i: i.public_key))
    authors = writers if writers is not None else IDENTITIES
    events: list[Event] = []
    for seq in range(draw(st.integers(1, max_size))):
        fields = draw(events_fields)
        author = draw(st.sampled_from(authors)) if seq else authors[0]
        events.append(Event.create(
            author, criterion=CRIT, seq=seq, prev=events[-1].hash if events else None,
            writers=[w.public_key for w in writers] if seq == 0 and writers else None,
            **fields))
    return events


def reference_block(event: Event, prev: CID | None) -> bytes:
    """The block as the dag-cbor package encodes it (the layout in ketten._core.ipld)."""
    return dag_cbor.encode({
        "version": 1, "criterion": event.criterion, "seq": event.seq, "prev": prev,
        "prevHash": event.prev, "author": event.author, "command": event.command,
        "clock": event.clock, "time": event.time, "payload": event.payload,
        "writers": list(event.writers) if event.writers is not None else None,
        "sig": event.sig,
    })


def car_of(events: list[Event]) -> bytes:
    blocks = list(chain_blocks(events))
    return car_header([blocks[-1].cid]) + b"".join(car_section(b.cid, b.data) for b in blocks)


def read(data: bytes) -> list[Event]:
    roots, offset = read_car_header(data)
    return chain_from_car(roots, read_car_sections(data, offset)).events


# -- the direct encoders against the packages ---------------------------------

@settings(max_examples=60, deadline=None)
@given(chains())
def test_blocks_and_cids_match_the_packages(events: list[Event]) -> None:
    prev: CID | None = None
    for block in chain_blocks(events):
        assert block.prev == prev
        assert block.data == reference_block(block.event, prev)
        expected = CID("base32", 1, "dag-cbor", multihash.wrap(sha256(block.data).digest(),
                                                               "sha2-256"))
        assert block.cid == expected and hash(block.cid) == hash(expected)
        assert bytes(block.cid) == bytes(expected) == block.binary
        assert cid_text(block.cid) == expected.encode("base32") == str(expected)
        assert block_cid(block.data) == expected
        assert CID.decode(block.binary) == cid_from_bytes(block.binary) == expected
        assert dag_cbor.decode(block.data)["prev"] == prev
        back = decode_block(expected, block.data)
        assert back.event.to_bytes() == block.event.to_bytes() and back.prev == prev
        assert decode_block(block.binary, block.data) == back
        assert event_block(block.event, prev) == block
        prev = expected


def test_the_direct_cid_constructor_is_the_public_one() -> None:
    assert ipld._cid_builder is ipld._cid_direct
    for n in range(20):
        binary = bytes([1, 0x71, 0x12, 32]) + sha256(b"%d" % n).digest()
        made, public = ipld._cid_direct(binary), ipld._cid_public(binary)
        assert made == public == CID.decode(binary) and hash(made) == hash(public)
        assert repr(made) == repr(public) and str(made) == str(public)
        assert bytes(made) == binary and made.digest == public.digest


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**63 - 1))
def test_varints_match_the_packages(n: int) -> None:
    assert fast_varint(n) == varint.encode(n)
    assert varint.decode(fast_varint(n)) == n


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=600), st.sampled_from(["dag-cbor", "raw", "dag-pb", "dag-json"]))
def test_sections_and_headers_match_the_packages(data: bytes, codec: str) -> None:
    cid = CID("base32", 1, codec, multihash.wrap(sha256(data).digest(), "sha2-256"))
    binary = bytes(cid)
    assert cid_bytes(cid) == binary and cid_from_bytes(binary) == cid
    framed = car_section(cid, data)
    assert framed == varint.encode(len(binary) + len(data)) + binary + data
    assert car_section(binary, data) == framed
    header = car_header([cid])
    assert header == varint.encode(len(dag_cbor.encode({"roots": [cid], "version": 1}))) + \
        dag_cbor.encode({"roots": [cid], "version": 1})
    roots, offset = read_car_header(header + framed)
    assert roots == [cid]
    [section] = read_car_sections(header + framed, offset)
    assert (section.cid, section.binary, section.data) == (cid, binary, data)


def test_a_cidv0_section_is_refused_naming_it() -> None:
    data = b"not an event"
    v0 = CID("base58btc", 0, "dag-pb", multihash.wrap(sha256(data).digest(), "sha2-256"))
    events = [Event.create(IDENTITIES[0], criterion=CRIT, seq=0, prev=None, payload=b"",
                           time=1)]
    blocks = list(chain_blocks(events))
    car = car_header([blocks[0].cid]) + car_section(v0, data) + \
        car_section(blocks[0].cid, blocks[0].data)
    assert cid_bytes(v0) == bytes(v0) == v0.digest
    with pytest.raises(DecodeError, match=f"block {v0}: not a CIDv1 dag-cbor"):
        read(car)


# -- export, import and damage ------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(chains(max_size=8))
def test_cars_round_trip_byte_for_byte(events: list[Event]) -> None:
    data = car_of(events)
    back = read(data)
    assert [e.to_bytes() for e in back] == [e.to_bytes() for e in events]
    assert car_of(back) == data


def _stored(path: Path) -> list[bytes]:
    async def run() -> list[bytes]:
        store = SqliteStore(path=str(path))
        await store.open()
        try:
            return [e.to_bytes() for e in await store.range(CRIT)]
        finally:
            await store.aclose()
    return trio.run(run)


def _fill(path: Path, events: list[Event]) -> None:
    async def run() -> None:
        store = SqliteStore(path=str(path))
        await store.open()
        await store.append(events)
        await store.aclose()
    trio.run(run)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=chains(max_size=5))
def test_cli_export_import_export_is_byte_identical(
        events: list[Event], capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _fill(root / "src", events)
        first, second = root / "a.car", root / "b.car"
        assert main(["export", CRIT.hex(), "--by-key", "--car", str(first),
                     "--data", str(root / "src")]) == 0
        assert main(["import", str(first), "--data", str(root / "dst")]) == 0
        assert _stored(root / "dst") == [e.to_bytes() for e in events]
        assert main(["export", CRIT.hex(), "--by-key", "--car", str(second),
                     "--data", str(root / "dst")]) == 0
        assert second.read_bytes() == first.read_bytes() == car_of(events)
    capsys.readouterr()


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0), st.integers(0, 255)),
)


def mutate(data: bytes, mutation: tuple[str, int, int]) -> bytes:
    kind, at, value = mutation
    if not data:
        return bytes([value])
    at %= len(data)
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ value]) + data[at + 1:]
    if kind == "cut":
        return data[:at]
    return data[:at] + bytes([value]) + data[at:]


def test_a_header_whose_version_is_true_is_refused() -> None:
    """One flipped byte turns ``version: 1`` into ``version: true``, and ``True == 1``
    in Python: found by the mutation property below."""
    genesis = Event.create(IDENTITIES[0], criterion=CRIT, seq=0, prev=None, payload=b"",
                           time=1)
    cid = next(iter(chain_blocks([genesis]))).cid
    body = dag_cbor.encode({"roots": [cid], "version": True})
    with pytest.raises(DecodeError, match="not a CARv1 header"):
        read_car_header(bytes(varint.encode(len(body))) + body)


@settings(max_examples=400, deadline=None)
@given(chains(max_size=4), st.lists(mutations, min_size=1, max_size=3))
def test_mutated_cars_raise_ketten_errors(events: list[Event],
                                          changes: list[tuple[str, int, int]]) -> None:
    data = original = car_of(events)
    for change in changes:
        data = mutate(data, change)
    assume(data != original)
    try:
        read(data)
    except KettenError:
        return
    except Exception as exc:  # anything else is a bug
        raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
    raise AssertionError("a damaged CAR was accepted")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_decode_errors(data: bytes) -> None:
    with pytest.raises(DecodeError):
        read(data)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=chains(max_size=4), change=mutations)
def test_cli_import_of_a_mutated_car_stores_nothing(
        events: list[Event], change: tuple[str, int, int],
        capsys: pytest.CaptureFixture[str]) -> None:
    data = mutate(car_of(events), change)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        car = root / "bad.car"
        car.write_bytes(data)
        assert main(["import", str(car), "--data", str(root / "dst")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ketten: error: ") and err.count("\n") == 1
        assert not (root / "dst").exists()


def test_a_block_with_a_foreign_tag_or_bad_link_is_refused() -> None:
    genesis = Event.create(IDENTITIES[0], criterion=CRIT, seq=0, prev=None, payload=b"g",
                           time=1)
    first = event_block(genesis, None)
    block = event_block(
        Event.create(IDENTITIES[0], criterion=CRIT, seq=1, prev=genesis.hash, payload=b"x",
                     time=2), first.cid)
    value: dict[str, Any] = dag_cbor.decode(block.data)
    for bad, message in [
        (block.data.replace(b"\xd8\x2a", b"\xd8\x2b", 1), "malformed dag-cbor"),
        (block.data.replace(b"\xd8\x2a\x58\x25\x00", b"\xd8\x2a\x58\x25\x01", 1),
         "malformed dag-cbor"),
        (dag_cbor.encode({**value, "prev": CID("base32", 1, "raw", first.cid.digest)}),
         "prev must be null or a CIDv1 dag-cbor sha2-256 link"),
        (dag_cbor.encode({**value, "extra": 1}), "not a ketten event block"),
    ]:
        with pytest.raises(DecodeError, match=message):
            decode_block(block_cid(bad), bad)

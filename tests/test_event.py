"""The event model: canonical encoding, signing, decoding of untrusted bytes."""

from __future__ import annotations

import attrs
import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ketten import DecodeError, Event, Identity, InvalidSignature, UsageError, criterion_key

IDENTITY = Identity.from_seed(b"\x01" * 32)
OTHER = Identity.from_seed(b"\x02" * 32)

hashes = st.binary(min_size=32, max_size=32)
uints = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def events(draw: st.DrawFn) -> Event:
    seq = draw(uints)
    genesis = seq == 0
    writers = None
    if genesis and draw(st.booleans()):
        writers = draw(st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=4))
    return Event.create(
        IDENTITY,
        criterion=draw(hashes),
        seq=seq,
        prev=None if genesis else draw(hashes),
        payload=draw(st.binary(max_size=300)),
        time=draw(uints),
        command=draw(st.none() | uints),
        clock=draw(st.binary(max_size=40)),
        writers=writers,
    )


@given(events())
def test_encoding_round_trips(event: Event) -> None:
    data = event.to_bytes()
    decoded = Event.from_bytes(data)
    assert decoded == event
    assert decoded.to_bytes() == data
    assert attrs.asdict(decoded, filter=lambda a, _: not a.name.startswith("_")) == attrs.asdict(
        event, filter=lambda a, _: not a.name.startswith("_")
    )
    assert decoded.hash == event.hash
    assert attrs.evolve(event).to_bytes() == data  # the constructor encodes the same bytes
    decoded.verify()


@given(events())
def test_encoding_is_canonical_cbor(event: Event) -> None:
    assert cbor2.dumps(cbor2.loads(event.to_bytes()), canonical=True) == event.to_bytes()


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        Event.from_bytes(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(events(), st.data())
def test_mutated_encodings_raise_only_decode_error_or_fail_verification(
    event: Event, data: st.DataObject
) -> None:
    raw = bytearray(event.to_bytes())
    mutation = data.draw(st.sampled_from(["flip", "truncate", "append", "insert"]))
    if mutation == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
    elif mutation == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)) :]
    elif mutation == "append":
        raw += data.draw(st.binary(min_size=1, max_size=8))
    else:
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    try:
        decoded = Event.from_bytes(bytes(raw))
    except DecodeError:
        return
    # A mutation that still decodes is a different event: the signature catches it.
    assert decoded.hash != event.hash
    with pytest.raises(InvalidSignature):
        decoded.verify()


def _fields(event: Event) -> list[object]:
    return list(cbor2.loads(event.to_bytes()))


GOOD = Event.create(
    IDENTITY, criterion=criterion_key("x"), seq=3, prev=b"p" * 32, payload=b"hi", time=5, command=7
)


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [
        (0, 2, "version"),
        (1, b"short", "criterion"),
        (2, -1, "seq"),
        (2, "3", "seq"),
        (3, None, "prev"),
        (4, b"k" * 31, "author"),
        (5, 1.5, "command"),
        (6, "text", "clock"),
        (7, -5, "time"),
        (8, 42, "payload"),
        (9, [b"w" * 32], "writers"),
        (10, b"s" * 63, "sig"),
    ],
)
def test_wrong_field_types_are_named(index: int, value: object, message: str) -> None:
    fields = _fields(GOOD)
    fields[index] = value
    with pytest.raises(DecodeError, match=message):
        Event.from_bytes(cbor2.dumps(fields, canonical=True))


@pytest.mark.parametrize("count", [0, 10, 12])
def test_missing_or_extra_fields(count: int) -> None:
    fields = (_fields(GOOD) + [b"x"])[:count]
    with pytest.raises(DecodeError, match="11 fields"):
        Event.from_bytes(cbor2.dumps(fields, canonical=True))


def test_trailing_bytes_and_oversize_and_non_canonical() -> None:
    raw = GOOD.to_bytes()
    with pytest.raises(DecodeError, match="trailing"):
        Event.from_bytes(raw + b"\x00")
    with pytest.raises(DecodeError, match="exceeds"):
        Event.from_bytes(raw, max_size=len(raw) - 1)
    # seq 3 written with a one-byte argument instead of inline: same value, not canonical
    fields = _fields(GOOD)
    prefix = cbor2.dumps(fields[:2], canonical=True)[1:]
    rest = b"".join(cbor2.dumps(f, canonical=True) for f in fields[3:])
    with pytest.raises(DecodeError, match="canonical"):
        Event.from_bytes(b"\x8b" + prefix + b"\x18\x03" + rest)
    # a bignum-tagged seq decodes to an int but is not canonical either
    with pytest.raises(DecodeError):
        Event.from_bytes(b"\x8b" + prefix + b"\xc2\x41\x03" + rest)


def test_deep_nesting_and_huge_lengths_are_decode_errors() -> None:
    with pytest.raises(DecodeError):
        Event.from_bytes(b"\x81" * 100_000)
    with pytest.raises(DecodeError):
        Event.from_bytes(b"\x5b" + b"\xff" * 8)
    with pytest.raises(DecodeError):
        Event.from_bytes(b"\x9f" * 1000)
    with pytest.raises(DecodeError, match="expected bytes"):
        Event.from_bytes("text")  # type: ignore[arg-type]


def test_signature_covers_every_field() -> None:
    for change in [
        {"payload": b"other"},
        {"seq": 4},
        {"command": 8},
        {"time": 6},
        {"clock": b"c"},
        {"criterion": criterion_key("y")},
    ]:
        forged = attrs.evolve(GOOD, **change)  # type: ignore[arg-type]
        assert forged.hash != GOOD.hash
        with pytest.raises(InvalidSignature):
            forged.verify()
    stolen = attrs.evolve(GOOD, author=OTHER.public_key)
    with pytest.raises(InvalidSignature):
        stolen.verify()


def test_create_rejects_bad_arguments() -> None:
    c = criterion_key("x")
    with pytest.raises(UsageError, match="prev"):
        Event.create(IDENTITY, criterion=c, seq=0, prev=b"p" * 32, payload=b"", time=0)
    with pytest.raises(UsageError, match="prev"):
        Event.create(IDENTITY, criterion=c, seq=1, prev=None, payload=b"", time=0)
    with pytest.raises(UsageError, match="writers"):
        Event.create(IDENTITY, criterion=c, seq=1, prev=b"p" * 32, payload=b"", time=0,
                     writers=[OTHER.public_key])
    with pytest.raises(UsageError):
        Event.create(IDENTITY, criterion=c, seq=0, prev=None, payload=b"", time=0, writers=[])


def test_events_are_frozen_and_compare_by_hash() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        GOOD.seq = 9  # type: ignore[misc]
    assert Event.from_bytes(GOOD.to_bytes()) == GOOD
    assert len({GOOD, Event.from_bytes(GOOD.to_bytes())}) == 1
    assert GOOD.signed_bytes() == cbor2.dumps(_fields(GOOD)[:10], canonical=True)

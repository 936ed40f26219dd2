"""Decoding chain configurations from the wire: what comes back, what is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ketten._core.membership import ChainConfig, Member
from ketten.errors import DecodeError

keys = st.binary(min_size=32, max_size=32)
addresses = st.text(min_size=1, max_size=40)
members = st.lists(st.tuples(keys, addresses), max_size=5, unique_by=lambda m: m[0])


@st.composite
def configs(draw: st.DrawFn) -> ChainConfig:
    voters = draw(members.filter(bool))
    old = draw(members)
    return ChainConfig(draw(st.integers(1, 2**63 - 1)), [Member(*m) for m in voters],
                       [Member(*m) for m in old], draw(st.integers(-1, 2**63 - 1)),
                       draw(st.integers(0, 2**63 - 1)))


@given(configs())
def test_a_configuration_comes_back_as_it_was_sent_addresses_included(
        config: ChainConfig) -> None:
    for _ in range(2):  # the second time from the decoded ones kept
        decoded = ChainConfig.decode(config.encode(), where="test")
        assert decoded == config
        assert [(m.key, m.address) for m in decoded.members()] == [
            (m.key, m.address) for m in config.members()]
        assert decoded.keys() == config.keys()


def _valid() -> list[Any]:
    return ChainConfig(3, [Member(bytes([n]) * 32, f"127.0.0.1:{9000 + n}") for n in (1, 2, 3)],
                       (), 5, 2).encode()


def _bad(path: tuple[int, ...], value: Any) -> list[Any]:
    wire = copy.deepcopy(_valid())
    target = wire
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return wire


@pytest.mark.parametrize(("wire", "message"), [
    (_bad((0,), True), "bad epoch"),
    (_bad((0,), 0), "bad epoch"),
    (_bad((3,), False), "bad position"),
    (_bad((3,), -2), "bad position"),
    (_bad((4,), 1.0), "bad term"),
    (_bad((1,), []), "at least one voter"),
    (_bad((1, 0), [b"\x01" * 31, "127.0.0.1:9001"]), "32-byte key"),
    (_bad((1, 0), [b"\x01" * 32, ""]), "32-byte key"),
    (_bad((1, 0), [b"\x01" * 32, "a" * 256]), "32-byte key"),
    (_bad((1, 0), [bytearray(b"\x01" * 32), "127.0.0.1:9001"]), "32-byte key"),
    (_bad((1, 1), [b"\x01" * 32, "127.0.0.1:9002"]), "sorted by key and unique"),
    (_bad((1, 0), [b"\x09" * 32, "127.0.0.1:9001"]), "sorted by key and unique"),
    (_bad((2,), [[b"\x01" * 32]]), "32-byte key"),
    (_bad((2,), {}), "at most 64 members"),
    ([1, [], [], -1], "a configuration is"),
])
def test_a_malformed_configuration_is_refused_even_after_the_valid_one_was_decoded(
        wire: list[Any], message: str) -> None:
    ChainConfig.decode(_valid(), where="test")
    with pytest.raises(DecodeError, match=message):
        ChainConfig.decode(wire, where="test")


def test_a_configuration_of_many_members_comes_back_too() -> None:
    voters = [Member(bytes([n]) * 32, f"10.0.0.{n}:4000") for n in range(1, 41)]
    config = ChainConfig(7, voters, voters[:20], 12, 3)
    for _ in range(2):
        decoded = ChainConfig.decode(config.encode(), where="test")
        assert decoded == config and decoded.old == config.old
        assert [m.address for m in decoded.voters] == [m.address for m in voters]

"""``ketten.tune_gc``: the collector settings of a node process."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import ketten
from ketten._serve import build_config
from ketten.errors import UsageError


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_what_exists_and_raises_the_youngest_threshold() -> None:
    gc.unfreeze()
    _, second, third = gc.get_threshold()
    kept = [[n] for n in range(1000)]  # objects the collector tracks
    ketten.tune_gc()
    assert gc.get_threshold() == (50_000, second, third)
    assert gc.get_freeze_count() >= len(kept)
    ketten.tune_gc(1234)
    assert gc.get_threshold()[0] == 1234


@pytest.mark.usefixtures("restored_gc")
@pytest.mark.parametrize("bad", [-1, 1.5, "50000", True])
def test_tune_gc_refuses_what_is_no_threshold_and_zero_changes_nothing(bad: object) -> None:
    before = gc.get_threshold()
    with pytest.raises(UsageError, match="gc threshold"):
        ketten.tune_gc(bad)  # type: ignore[arg-type]
    ketten.tune_gc(0)
    assert gc.get_threshold() == before


def test_serve_takes_gc_threshold_as_a_setting(tmp_path: Path) -> None:
    config = build_config({"store": "memory", "gc_threshold": 0, "key": str(tmp_path / "k")})
    assert config.store == "memory"

"""Identities, node ids, key files and criterion keys."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from ketten import ConfigError, DecodeError, Identity, UsageError, criterion_key, verify_signature


def test_node_id_is_sha256_of_public_key() -> None:
    identity = Identity.generate()
    assert identity.node_id == hashlib.sha256(identity.public_key).digest()
    assert len(identity.public_key) == 32


def test_sign_and_verify() -> None:
    identity = Identity.generate()
    sig = identity.sign(b"data")
    assert verify_signature(identity.public_key, sig, b"data")
    assert not verify_signature(identity.public_key, sig, b"date")
    assert not verify_signature(Identity.generate().public_key, sig, b"data")
    assert not verify_signature(b"short", sig, b"data")


def test_key_file_is_private_and_round_trips(tmp_path: Path) -> None:
    identity = Identity.generate()
    path = tmp_path / "node.key"
    identity.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Identity.load(path).public_key == identity.public_key
    with pytest.raises(UsageError, match="overwrite"):
        identity.save(path)


def test_key_file_checks(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    Identity.generate().save(path)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        Identity.load(path)
    with pytest.raises(ConfigError, match="does not exist"):
        Identity.load(tmp_path / "missing.key")
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"hello")
    os.chmod(garbage, 0o600)
    with pytest.raises(DecodeError, match="not a ketten key file"):
        Identity.load(garbage)


def test_criterion_key() -> None:
    assert criterion_key("orders") == hashlib.sha256(b"orders").digest()
    assert criterion_key(b"orders") == criterion_key("orders")
    with pytest.raises(UsageError):
        criterion_key("")
    with pytest.raises(UsageError):
        criterion_key(5)  # type: ignore[arg-type]


def test_from_seed_is_deterministic() -> None:
    assert Identity.from_seed(b"\x07" * 32).node_id == Identity.from_seed(b"\x07" * 32).node_id
    with pytest.raises(UsageError):
        Identity.from_seed(b"short")

"""A node's identity and the store it owns.

A store holds what one node voted, acknowledged and promised; opened under
another identity, its chains would name the old node as their broker and
the new one as a stranger. So the store records the public key of the node
that first opened it, and refuses any other (as a Kafka broker refuses a
log directory whose ``meta.properties`` names another broker id).

A node whose configuration gives no identity keeps its key in its store's
directory (``node.key``, mode 0600), made when the store is first opened:
reopening the directory is the same node, as an IPFS repository keeps its
peer key. A store without a directory (``memory``) gets a fresh identity.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from .._core.identity import Identity
from ..errors import ConfigError, UsageError
from ..interfaces import Store
from .config import NodeConfig

__all__ = ["KEY_FILE", "OWNER_CURSOR", "KeptIdentity", "claim_store", "keep", "kept_identity"]

KEY_FILE = "node.key"
OWNER_CURSOR = "ketten/owner"
"""The public key of the node that owns the store."""


def _store_directory(config: NodeConfig) -> Path | None:
    path = config.options_for("store").get("path")
    if config.store == "memory" or not isinstance(path, str | os.PathLike):
        return None
    return Path(path)


@attrs.frozen
class KeptIdentity:
    """A node's identity, and where to keep its key once its store exists."""

    identity: Identity
    save_to: Path | None = None


def kept_identity(config: NodeConfig) -> KeptIdentity:
    """``config.identity``, else the one kept in the store's directory, else a fresh
    one (kept there by :func:`keep` once the store is open: a store refuses a
    directory that holds other files and no store yet). Raises
    :class:`~ketten.errors.ConfigError` for a key file that cannot be read."""
    if config.identity is not None:
        return KeptIdentity(config.identity)
    directory = _store_directory(config)
    if directory is None:
        return KeptIdentity(Identity.generate())
    key = directory / KEY_FILE
    if not key.exists():
        return KeptIdentity(Identity.generate(), key)
    return KeptIdentity(_load(key))


def _load(key: Path) -> Identity:
    try:
        return Identity.load(key)
    except ConfigError:
        raise
    except Exception as exc:  # a damaged key file is the operator's to fix
        raise ConfigError(f"{key}: not a ketten key file ({exc})") from None


def keep(kept: KeptIdentity) -> None:
    """Write the key file :func:`kept_identity` left to write, if any. Raises
    :class:`~ketten.errors.ConfigError` if it cannot be written, or if another
    process wrote one meanwhile (the node opened with another key)."""
    if kept.save_to is None:
        return
    try:
        kept.identity.save(kept.save_to)
    except UsageError:
        raise ConfigError(f"{kept.save_to}: another process made this store's key "
                          "meanwhile; open the node again") from None
    except OSError as exc:
        raise ConfigError(f"{kept.save_to}: cannot keep the node's key there: "
                          f"{exc.strerror}") from None


async def claim_store(store: Store, identity: Identity, config: NodeConfig) -> None:
    """Record ``identity`` as the owner of the (open) ``store``, or check it is.

    Raises :class:`~ketten.errors.ConfigError` if another node owns it."""
    if _owner_unset(await store.get_cursor(OWNER_CURSOR), identity, config):
        await store.put_cursor(OWNER_CURSOR, identity.public_key)


def _owner_unset(owner: bytes | None, identity: Identity, config: NodeConfig) -> bool:
    """Whether the store has no owner yet; raises if it has another."""
    if owner is None:
        return True
    if owner != identity.public_key:
        where = _store_directory(config) or f"the {config.store} store"
        raise ConfigError(
            f"{where} belongs to node {owner.hex()[:16]}, not to this node "
            f"({identity.public_key.hex()[:16]}): open it with the identity that wrote it "
            f"(NodeConfig(identity=Identity.load(...)); a node configured without one keeps "
            f"its key in the store directory as {KEY_FILE}), or give this node a store of "
            "its own")
    return False

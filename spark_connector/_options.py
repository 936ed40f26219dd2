"""The options of the ``ketten`` data source, parsed and checked."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from collections.abc import Mapping

import attrs

from ketten._core.chain import Verify
from ketten._core.identity import criterion_key
from ketten.errors import UsageError

__all__ = ["DEFAULT_BATCH_ROWS", "DEFAULT_PARTITION_EVENTS", "ReadOptions", "peer_copy"]

DEFAULT_PARTITION_EVENTS = 250_000
DEFAULT_BATCH_ROWS = 8192

_TABLE_PROPERTIES = frozenset({"location", "is_managed_location", "external", "comment",
                               "provider", "owner", "table_type", "collation"})
"""What Spark's catalog adds to the options of a table (``CREATE TABLE ... USING
ketten``): not ours to refuse. An external table's ``location`` is its store
directory when no ``path``, ``paths`` or ``peers`` option names one."""

def _local_path(location: str) -> str:
    """A location as Spark gives a table's (``file:/dir``) as a path; plain paths
    and other schemes are kept (the store check names what does not exist)."""
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    return location


_KNOWN = {
    "path": "store directory",
    "paths": "store directories",
    "peers": "live peer addresses",
    "criteria": "criterion names",
    "keys": "criterion keys (hex)",
    "startingseq": "first seq",
    "endingseq": "seq to stop before",
    "verify": "none | links | full",
    "includeorphans": "true | false",
    "skipdamaged": "true | false",
    "damagedpath": "directory for damage reports",
    "maxeventsperpartition": "events per Spark partition",
    "maxeventspertrigger": "events per micro-batch",
    "startingoffsets": "earliest | latest",
    "batchrows": "rows per Arrow record batch",
    "peertimeout": "seconds",
    "peerstore": "sqlite | file",
    "peerdirectory": "where copies of peers' chains are kept",
    "replication": "the network's r",
    "puzzledifficulty": "the network's id-puzzle difficulty",
}


def peer_copy(directory: str, peer: str) -> str:
    """The store directory holding the local copy of ``peer``'s chains."""
    return os.path.join(directory, "peer-" + hashlib.sha256(peer.encode()).hexdigest()[:16])


def _split_list(name: str, value: str) -> tuple[str, ...]:
    """A list option: a JSON array of strings, or comma-separated items."""
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            raise UsageError(f"option {name}: not a valid JSON array: {value!r}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise UsageError(f"option {name}: expected a JSON array of strings, got {value!r}")
        parts = [i.strip() for i in items]
    else:
        parts = [p.strip() for p in text.split(",")]
    parts = [p for p in parts if p]
    if not parts:
        raise UsageError(f"option {name} is empty")
    return tuple(dict.fromkeys(parts))


def _bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise UsageError(f"option {name} must be true or false, got {value!r}")


def _int(name: str, value: str, *, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise UsageError(f"option {name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise UsageError(f"option {name} must be at least {minimum}, got {number}")
    return number


def _key(text: str) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise UsageError(f"option keys: {text!r} is not hexadecimal") from None
    if len(key) != 32:
        raise UsageError(f"option keys: {text!r} is not a 32-byte key (64 hex digits)")
    return key


@attrs.frozen
class ReadOptions:
    """What a read asks for. Build with :meth:`parse`."""

    paths: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()
    keys: frozenset[bytes] | None = None
    """Criterion keys to read; ``None`` reads every chain."""
    names: Mapping[bytes, str] = attrs.field(factory=dict)
    """The names given in ``criteria``, by key (the ``name`` column)."""
    starting_seq: int = 0
    ending_seq: int | None = None
    """Exclusive upper bound on seq, or ``None`` for the head."""
    verify: Verify = Verify.LINKS
    include_orphans: bool = False
    skip_damaged: bool = False
    damaged_path: str | None = None
    max_events_per_partition: int = DEFAULT_PARTITION_EVENTS
    max_events_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    batch_rows: int = DEFAULT_BATCH_ROWS
    peer_timeout: float = 10.0
    peer_store: str = "sqlite"
    peer_directory: str | None = None
    replication: int = 3
    puzzle_difficulty: int = 0

    def store_paths(self) -> tuple[str, ...]:
        """Every store directory read: the given paths, then the copies of the peers."""
        if not self.peers or self.peer_directory is None:
            return self.paths
        return self.paths + tuple(peer_copy(self.peer_directory, p) for p in self.peers)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Parse Spark options (names are case-insensitive).

        Raises :class:`~ketten.errors.UsageError` naming the bad option.
        """
        given = {str(k).lower(): str(v) for k, v in options.items()}
        table = {k: given.pop(k) for k in _TABLE_PROPERTIES if k in given}
        if table.get("external", "").lower() == "true" and "location" in table and not (
                {"path", "paths", "peers"} & set(given)):
            given["path"] = _local_path(table["location"])  # CREATE TABLE ... LOCATION '...'
        unknown = sorted(set(given) - set(_KNOWN))
        if unknown:
            raise UsageError(
                f"unknown option(s) {', '.join(unknown)}; the ketten source takes: "
                + ", ".join(sorted(_KNOWN))
            )
        paths: tuple[str, ...] = ()
        if "path" in given:
            paths += _split_list("path", given["path"])
        if "paths" in given:
            paths += _split_list("paths", given["paths"])
        paths = tuple(_local_path(p) for p in paths)
        peers = _split_list("peers", given["peers"]) if "peers" in given else ()
        if not options:
            raise UsageError(
                "the ketten source was given no options at all. Spark (pyspark 4.3) gives a "
                "Python data source none when it reads a table made by CREATE TABLE ... USING "
                "ketten; define it as CREATE TEMPORARY VIEW name USING ketten OPTIONS (path "
                "'...') instead, or read it with spark.read.format('ketten')")
        if not paths and not peers:
            raise UsageError("the ketten source needs the option path, paths or peers")
        keys: set[bytes] | None = None
        names: dict[bytes, str] = {}
        if "criteria" in given:
            names = {criterion_key(name): name
                     for name in _split_list("criteria", given["criteria"])}
            keys = set(names)
        if "keys" in given:
            keys = (keys or set()) | {_key(k.lower()) for k in _split_list("keys", given["keys"])}
        starting = _int("startingSeq", given.get("startingseq", "0"), minimum=0)
        ending = (
            _int("endingSeq", given["endingseq"], minimum=0) if "endingseq" in given else None
        )
        if ending is not None and ending < starting:
            raise UsageError(f"endingSeq ({ending}) is below startingSeq ({starting})")
        trigger = (
            _int("maxEventsPerTrigger", given["maxeventspertrigger"], minimum=1)
            if "maxeventspertrigger" in given
            else None
        )
        offsets = given.get("startingoffsets", "earliest").strip().lower()
        if offsets not in ("earliest", "latest"):
            raise UsageError(f"option startingOffsets must be earliest or latest, got {offsets!r}")
        peer_store = given.get("peerstore", "sqlite").strip().lower()
        if peer_store not in ("sqlite", "file"):
            raise UsageError(f"option peerStore must be sqlite or file, got {peer_store!r}")
        if peers and keys is None:
            raise UsageError("option peers needs criteria or keys: peers are asked for chains "
                             "by key and cannot list them")
        try:
            peer_timeout = float(given.get("peertimeout", "10"))
        except ValueError:
            raise UsageError(f"option peerTimeout must be a number of seconds, got "
                             f"{given['peertimeout']!r}") from None
        if not peer_timeout > 0:
            raise UsageError(f"option peerTimeout must be positive, got {peer_timeout}")
        damaged_path = given.get("damagedpath")
        skip = _bool("skipDamaged", given.get("skipdamaged", "false"))
        if damaged_path is not None and not skip:
            raise UsageError("option damagedPath only applies with skipDamaged=true")
        return cls(
            paths=tuple(dict.fromkeys(paths)),
            peers=peers,
            keys=frozenset(keys) if keys is not None else None,
            names=names,
            starting_seq=starting,
            ending_seq=ending,
            verify=Verify.parse(given.get("verify", "links").strip()),
            include_orphans=_bool("includeOrphans", given.get("includeorphans", "false")),
            skip_damaged=skip,
            damaged_path=damaged_path,
            max_events_per_partition=_int(
                "maxEventsPerPartition",
                given.get("maxeventsperpartition", str(DEFAULT_PARTITION_EVENTS)),
                minimum=1,
            ),
            max_events_per_trigger=trigger,
            starting_offsets=offsets,
            batch_rows=_int("batchRows", given.get("batchrows", str(DEFAULT_BATCH_ROWS)),
                            minimum=1),
            peer_timeout=peer_timeout,
            peer_store=peer_store,
            peer_directory=given.get("peerdirectory"),
            replication=_int("replication", given.get("replication", "3"), minimum=1),
            puzzle_difficulty=_int("puzzleDifficulty", given.get("puzzledifficulty", "0"),
                                   minimum=0),
        )

    def check_streaming(self) -> None:
        """Raise :class:`~ketten.errors.UsageError` for options a stream cannot honour."""
        if self.ending_seq is not None:
            raise UsageError("option endingSeq is for batch reads; a stream has no end")
        if self.include_orphans:
            raise UsageError("option includeOrphans is for batch reads")

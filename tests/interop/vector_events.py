"""Print the events of the IPLD test vectors (JSON, one chain from its genesis).

    .venv/bin/python tests/interop/vector_events.py > /tmp/events.json

See README.md for the command that turns them into vectors.json.
"""

from __future__ import annotations

import json

from ketten import Event, Identity, criterion_key

ALICE = Identity.from_seed(b"\x01" * 32)
BOB = Identity.from_seed(b"\x02" * 32)
CRITERION = criterion_key("ipld-vectors")


def events() -> list[tuple[str, Event]]:
    genesis = Event.create(ALICE, criterion=CRITERION, seq=0, prev=None, payload=b"genesis",
                           time=1_700_000_000_000, command=0,
                           writers=[ALICE.public_key, BOB.public_key])
    plain = Event.create(BOB, criterion=CRITERION, seq=1, prev=genesis.hash,
                         payload="text: ✓".encode(), time=1_700_000_000_001)
    binary = Event.create(ALICE, criterion=CRITERION, seq=2, prev=plain.hash,
                          payload=bytes(range(256)) * 2, time=(1 << 62) + 5, command=1 << 40,
                          clock=b"\x00\x01\x02")
    empty = Event.create(BOB, criterion=CRITERION, seq=3, prev=binary.hash, payload=b"",
                         time=0, command=23)
    return [("genesis with writers", genesis), ("no command, UTF-8 payload", plain),
            ("large time and command, clock, binary payload", binary),
            ("empty payload, time 0", empty)]


if __name__ == "__main__":
    print(json.dumps([{"name": name, "event": e.to_bytes().hex()} for name, e in events()],
                     indent=1))

"""ketten's CAR files and blocks read and written by the JavaScript IPLD reference
libraries (@ipld/car, @ipld/dag-cbor, multiformats; pinned in js/package-lock.json).

Needs Node.js; the libraries are installed with ``npm ci`` into js/node_modules
when it is missing (.ci/run installs them before the tests).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from ketten import Event, Identity, criterion_key
from ketten._cli import main
from ketten._core.car import read_car_header, read_car_sections
from ketten._core.chain_car import chain_blocks
from ketten._core.ipld import cid_text
from ketten.plugins.sqlite_store import SqliteStore

HERE = Path(__file__).parent
JS = HERE / "js"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node (Node.js) is not installed")

ALICE = Identity.from_seed(b"\x41" * 32)
BOB = Identity.from_seed(b"\x42" * 32)
CRIT = criterion_key("interop")
KEYS = sorted(["version", "criterion", "seq", "prev", "prevHash", "author", "command", "clock",
               "time", "payload", "writers", "sig"])


@pytest.fixture(scope="module")
def node_modules() -> Path:
    modules = JS / "node_modules"
    if not (modules / "@ipld" / "car").is_dir():
        npm = shutil.which("npm")
        assert npm is not None, "npm is needed to install the JavaScript libraries"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, check=True,
                       capture_output=True, timeout=300)
    return modules


def node(*args: str) -> str:
    assert NODE is not None
    done = subprocess.run([NODE, *args], cwd=JS, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def make_chain(n: int) -> list[Event]:
    events = [Event.create(ALICE, criterion=CRIT, seq=0, prev=None, payload=b"genesis",
                           time=1, writers=[ALICE.public_key, BOB.public_key])]
    for seq in range(1, n):
        author = BOB if seq % 3 else ALICE
        events.append(Event.create(author, criterion=CRIT, seq=seq, prev=events[-1].hash,
                                   payload=bytes([seq % 256]) * (seq % 50), time=1000 + seq,
                                   command=seq if seq % 2 else None, clock=b"c%d" % seq))
    return events


def test_vectors_are_reproduced_by_the_javascript_libraries(
        node_modules: Path, tmp_path: Path) -> None:
    events = subprocess.run([sys.executable, str(HERE / "vector_events.py")], check=True,
                            capture_output=True, text=True, timeout=60).stdout
    (tmp_path / "events.json").write_text(events)
    made = json.loads(node("vectors.mjs", str(tmp_path / "events.json")))
    assert made == json.loads((HERE / "vectors.json").read_text())


def test_javascript_reads_ketten_cars_and_ketten_imports_theirs(
        node_modules: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = make_chain(200)

    async def fill() -> None:
        store = SqliteStore(path=str(tmp_path / "src"))
        await store.open()
        await store.append(events)
        await store.aclose()

    trio.run(fill)
    ours = tmp_path / "ketten.car"
    assert main(["export", "interop", "--car", str(ours), "--data", str(tmp_path / "src")]) == 0
    blocks = list(chain_blocks(events))

    theirs = tmp_path / "js.car"
    report = json.loads(node("car.mjs", str(ours), str(theirs)))
    assert report["root"] == cid_text(blocks[-1].cid)
    walked = report["blocks"]
    assert [b["cid"] for b in walked] == [cid_text(b.cid) for b in reversed(blocks)]
    assert [b["seq"] for b in walked] == list(range(199, -1, -1))
    assert [b["prev"] for b in walked] == [
        cid_text(b.prev) if b.prev else None for b in reversed(blocks)]
    assert [b["prevHash"] for b in walked] == [
        e.prev.hex() if e.prev else None for e in reversed(events)]
    assert all(b["keys"] == KEYS for b in walked)

    # The JavaScript CAR: the same root and blocks, in another order.
    data = theirs.read_bytes()
    roots, offset = read_car_header(data)
    sections = list(read_car_sections(data, offset))
    assert roots == [blocks[-1].cid] and sections[0].cid == blocks[-1].cid
    assert sorted((bytes(s.cid), s.data) for s in sections) == sorted(
        (bytes(b.cid), b.data) for b in blocks)
    assert data != ours.read_bytes()

    capsys.readouterr()
    assert main(["import", str(theirs), "--data", str(tmp_path / "dst"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["added"] == 200

    async def stored() -> list[bytes]:
        store = SqliteStore(path=str(tmp_path / "dst"))
        await store.open()
        try:
            return [e.to_bytes() for e in await store.range(CRIT)]
        finally:
            await store.aclose()

    assert trio.run(stored) == [e.to_bytes() for e in events]
    assert main(["verify", str(theirs)]) == 0

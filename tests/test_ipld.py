"""Events as IPLD blocks and chains as CAR files: layout, CIDs, damage, the CLI.

The CIDs are checked against vectors computed by the JavaScript reference
libraries (tests/interop/vectors.json, made as tests/interop/README.md says).
"""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path

import cbor2
import dag_cbor
import pytest
import trio
from multiformats import CID

from ketten import Event, Identity, criterion_key
from ketten._cli import main
from ketten._core.car import car_header, car_section, read_car_header, read_car_sections
from ketten._core.chain_car import chain_blocks, chain_from_car
from ketten._core.ipld import EventBlock, block_cid, cid_text, decode_block, event_block
from ketten.errors import BrokenLink, DecodeError, InvalidSignature, UsageError
from ketten.interfaces import Store
from ketten.plugins.file_store import FileStore
from ketten.plugins.sqlite_store import SqliteStore

VECTORS = json.loads((Path(__file__).parent / "interop" / "vectors.json").read_text())
ALICE = Identity.from_seed(b"\x31" * 32)
MALLORY = Identity.from_seed(b"\x32" * 32)
CRIT = criterion_key("orders")


def chain(n: int, identity: Identity = ALICE, criterion: bytes = CRIT,
          tag: bytes = b"") -> list[Event]:
    events: list[Event] = []
    for seq in range(n):
        events.append(Event.create(identity, criterion=criterion, seq=seq,
                                   prev=events[-1].hash if events else None,
                                   payload=b"event %d" % seq + tag, time=1000 + seq,
                                   command=seq))
    return events


def car_bytes(roots: list[CID], blocks: list[EventBlock]) -> bytes:
    return car_header(roots) + b"".join(car_section(b.cid, b.data) for b in blocks)


def read(data: bytes) -> list[Event]:
    roots, offset = read_car_header(data)
    return chain_from_car(roots, read_car_sections(data, offset)).events


# -- blocks and CIDs --------------------------------------------------------

@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_cids_match_the_javascript_reference(vector: dict[str, str]) -> None:
    event = Event.from_bytes(bytes.fromhex(vector["event"]))
    prev = CID.decode(vector["prev"]) if vector["prev"] else None
    block = event_block(event, prev)
    assert block.data.hex() == vector["block"]
    assert cid_text(block.cid) == vector["cid"]
    assert cid_text(block.cid).startswith("bafyrei")  # CIDv1, dag-cbor, sha2-256, base32
    back = decode_block(CID.decode(vector["cid"]), bytes.fromhex(vector["block"]))
    assert back.event.to_bytes().hex() == vector["event"]
    back.event.verify()


def test_the_vectors_form_a_chain() -> None:
    events = [Event.from_bytes(bytes.fromhex(v["event"])) for v in VECTORS]
    blocks = list(chain_blocks(events))
    assert [cid_text(b.cid) for b in blocks] == [v["cid"] for v in VECTORS]
    assert [v["prev"] for v in VECTORS[1:]] == [v["cid"] for v in VECTORS[:-1]]


def test_a_block_is_a_dag_cbor_map_with_prev_as_a_link() -> None:
    genesis, second = chain(2)
    first = event_block(genesis, None)
    block = event_block(second, first.cid)
    value = dag_cbor.decode(block.data)
    assert set(value) == {"version", "criterion", "seq", "prev", "prevHash", "author",
                          "command", "clock", "time", "payload", "writers", "sig"}
    assert value["prev"] == first.cid and value["prevHash"] == genesis.hash
    assert value["sig"] == second.sig and value["payload"] == second.payload
    # The link is CBOR tag 42 holding the binary CID behind a zero byte.
    tagged = cbor2.loads(block.data)["prev"]
    assert tagged.tag == 42 and tagged.value == b"\x00" + bytes(first.cid)
    assert bytes(block.cid) == bytes([1, 0x71, 0x12, 32]) + sha256(block.data).digest()
    assert block.cid == block_cid(block.data)
    assert dag_cbor.decode(first.data)["prev"] is None


def test_the_event_is_rebuilt_byte_for_byte_and_verifies() -> None:
    events = chain(3)
    for block in chain_blocks(events):
        back = decode_block(block.cid, block.data)
        assert back.event.to_bytes() == block.event.to_bytes()
        assert back.event.hash == block.event.hash
        back.event.verify()
        assert back.prev == block.prev


def test_event_block_refuses_wrong_links() -> None:
    genesis, second = chain(2)
    first = event_block(genesis, None)
    with pytest.raises(UsageError):
        event_block(genesis, first.cid)
    with pytest.raises(UsageError):
        event_block(second, None)
    raw_cid = CID("base32", 1, "raw", first.cid.digest)
    with pytest.raises(UsageError, match="CIDv1 dag-cbor sha2-256"):
        event_block(second, raw_cid)


def test_decode_block_refuses_damage() -> None:
    genesis, second = chain(2)
    first = event_block(genesis, None)
    block = event_block(second, first.cid)
    name = cid_text(block.cid)
    flipped = bytearray(block.data)
    flipped[-1] ^= 1
    with pytest.raises(DecodeError, match=f"block {name}: content does not match the CID"):
        decode_block(block.cid, bytes(flipped))
    # Well-formed dag-cbor, right CID, wrong shape.
    other = dag_cbor.encode({"hello": 1})
    with pytest.raises(DecodeError, match="not a ketten event block"):
        decode_block(block_cid(other), other)
    # A link where bytes belong.
    value = dag_cbor.decode(block.data)
    value["author"] = first.cid
    bad = dag_cbor.encode(value)
    with pytest.raises(DecodeError, match="wrong type"):
        decode_block(block_cid(bad), bad)
    # prevHash without a link.
    value = dag_cbor.decode(block.data)
    value["prev"] = None
    bad = dag_cbor.encode(value)
    with pytest.raises(DecodeError, match="both be null"):
        decode_block(block_cid(bad), bad)
    # The same values, encoded otherwise (a longer integer head for seq).
    longer = block.data.replace(b"\x63seq\x01", b"\x63seq\x18\x01")
    assert longer != block.data
    with pytest.raises(DecodeError, match=f"block {cid_text(block_cid(longer))}"):
        decode_block(block_cid(longer), longer)
    with pytest.raises(DecodeError, match="not a CIDv1 dag-cbor"):
        decode_block(CID("base32", 1, "raw", block.cid.digest), block.data)


# -- CAR framing and chains -------------------------------------------------

def test_car_round_trip_keeps_every_block() -> None:
    events = chain(5)
    blocks = list(chain_blocks(events))
    data = car_bytes([blocks[-1].cid], blocks)
    roots, offset = read_car_header(data)
    assert roots == [blocks[-1].cid]
    sections = list(read_car_sections(data, offset))
    assert [(s.cid, s.data) for s in sections] == [(b.cid, b.data) for b in blocks]
    assert read(data) == events


def test_a_car_in_any_order_with_repeats_reads_the_same_chain() -> None:
    events = chain(6)
    blocks = list(chain_blocks(events))
    shuffled = [blocks[3], blocks[5], blocks[0], blocks[4], blocks[1], blocks[2], blocks[3]]
    assert read(car_bytes([blocks[-1].cid], shuffled)) == events


def test_a_root_inside_the_chain_reads_a_prefix() -> None:
    blocks = list(chain_blocks(chain(4)))
    assert len(read(car_bytes([blocks[2].cid], blocks[:3]))) == 3


def damaged(kind: str) -> tuple[bytes, str, type[Exception]]:
    """A damaged CAR of a 5-event chain, the text its error must hold, and its type."""
    events = chain(5)
    blocks = list(chain_blocks(events))
    root = [blocks[-1].cid]
    if kind == "wrong cid":
        data = bytearray(car_bytes(root, blocks))
        at = data.index(blocks[2].data) + len(blocks[2].data) - 70  # inside the signature
        data[at] ^= 0xFF
        return bytes(data), f"block {cid_text(blocks[2].cid)}: content does not match", \
            DecodeError
    if kind == "missing block":
        return (car_bytes(root, blocks[:2] + blocks[3:]),
                f"block {cid_text(blocks[2].cid)}: missing, linked from block "
                f"{cid_text(blocks[3].cid)} (seq 3)", DecodeError)
    if kind == "broken link":
        # seq 3 linking the block of seq 1: a valid block, in the wrong place.
        skip = event_block(events[3], blocks[1].cid)
        relinked = event_block(events[4], skip.cid)
        return (car_bytes([relinked.cid], [*blocks[:2], skip, relinked]),
                f"block {cid_text(skip.cid)} (seq 3) links block {cid_text(blocks[1].cid)} "
                f"(seq 1)", BrokenLink)
    if kind == "foreign predecessor":
        other = list(chain_blocks(chain(5, tag=b"!")))
        spliced = event_block(events[3], other[2].cid)
        return (car_bytes([spliced.cid], [*other[:3], spliced]),
                f"block {cid_text(spliced.cid)} (seq 3): prevHash is not the hash", BrokenLink)
    if kind == "bad signature":
        raw = bytearray(events[4].to_bytes())
        raw[-1] ^= 1
        forged = event_block(Event.from_bytes(bytes(raw)), blocks[3].cid)
        return (car_bytes([forged.cid], [*blocks[:4], forged]),
                f"block {cid_text(forged.cid)} (seq 4): seq 4: signature does not verify",
                InvalidSignature)
    if kind == "stray block":
        extra = event_block(chain(1, tag=b"x")[0], None)
        return (car_bytes(root, [*blocks, extra]),
                f"block {cid_text(extra.cid)}: not part of the chain", DecodeError)
    if kind == "two roots":
        return car_bytes([blocks[-1].cid, blocks[0].cid], blocks), "has 2", DecodeError
    if kind == "truncated":
        data = car_bytes(root, blocks)
        return data[:-10], "runs past the end of the file", DecodeError
    if kind == "carv2":
        header = dag_cbor.encode({"version": 2})
        return bytes([len(header)]) + header, "a CARv2 file", DecodeError
    raise AssertionError(kind)


DAMAGE = ["wrong cid", "missing block", "broken link", "foreign predecessor", "bad signature",
          "stray block", "two roots", "truncated", "carv2"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_cars_are_refused_naming_the_block(kind: str) -> None:
    data, message, error = damaged(kind)
    with pytest.raises(error) as caught:
        read(data)
    assert message in str(caught.value)


# -- the command line ---------------------------------------------------------

def make_store(kind: str, path: Path) -> Store:
    return SqliteStore(path=str(path)) if kind == "sqlite" else FileStore(path=str(path))


def fill(kind: str, path: Path, *chains: list[Event]) -> None:
    async def run() -> None:
        store = make_store(kind, path)
        await store.open()
        for events in chains:
            await store.append(events)
        await store.aclose()
    trio.run(run)


def stored(kind: str, path: Path, criterion: bytes = CRIT) -> list[Event]:
    async def run() -> list[Event]:
        store = make_store(kind, path)
        await store.open()
        try:
            return await store.range(criterion)
        finally:
            await store.aclose()
    return trio.run(run)


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_export_then_import_moves_a_chain_between_stores(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    events = chain(30)
    fill(kind, tmp_path / "src", events, chain(3, criterion=criterion_key("other")))
    car = tmp_path / "orders.car"
    assert main(["export", "orders", "--car", str(car), "--data", str(tmp_path / "src"),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    head = list(chain_blocks(events))[-1].cid
    assert report == {"car": str(car), "criterion": CRIT.hex(), "events": 30,
                      "root": cid_text(head), "bytes": car.stat().st_size}
    assert read(car.read_bytes()) == events
    assert main(["import", str(car), "--data", str(tmp_path / "dst"), "--store", kind]) == 0
    assert "30 events" in capsys.readouterr().out
    assert stored(kind, tmp_path / "dst") == events
    assert [e.to_bytes() for e in stored(kind, tmp_path / "dst")] == [e.to_bytes() for e in events]
    # Importing again adds nothing; the store still verifies.
    assert main(["import", str(car), "--data", str(tmp_path / "dst"), "--store", kind,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["added"] == 0
    assert main(["verify", str(tmp_path / "dst"), str(car)]) == 0
    out = capsys.readouterr().out
    assert out.count("30 events ok") == 2 and cid_text(head) in out


def test_import_extends_a_prefix_and_refuses_another_chain(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = chain(12)
    fill("sqlite", tmp_path / "src", events)
    fill("sqlite", tmp_path / "prefix", events[:5])
    fill("sqlite", tmp_path / "longer", chain(3, tag=b"?"))
    car = tmp_path / "c.car"
    assert main(["export", CRIT.hex(), "--by-key", "--car", str(car),
                 "--data", str(tmp_path / "src")]) == 0
    assert main(["import", str(car), "--data", str(tmp_path / "prefix"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["added"] == 7
    assert stored("sqlite", tmp_path / "prefix") == events
    assert main(["import", str(car), "--data", str(tmp_path / "longer")]) == 2
    assert "holds another chain" in capsys.readouterr().err
    assert len(stored("sqlite", tmp_path / "longer")) == 3


def test_export_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fill("sqlite", tmp_path / "src", chain(2))
    car = str(tmp_path / "x.car")
    assert main(["export", "nope", "--car", car, "--data", str(tmp_path / "src")]) == 2
    assert "no chain 'nope'" in capsys.readouterr().err
    assert main(["export", "orders", "--car", car, "--data", str(tmp_path)]) == 2
    assert "not a ketten store directory" in capsys.readouterr().err
    assert main(["export", "abc", "--by-key", "--car", car, "--data", str(tmp_path / "src")]) == 2
    assert "64-hex-digit key" in capsys.readouterr().err
    assert not (tmp_path / "x.car").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".x.car")] == []


@pytest.mark.parametrize("kind", ["wrong cid", "missing block", "broken link", "bad signature"])
def test_the_cli_refuses_damaged_cars_in_one_line(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    data, message, _ = damaged(kind)
    car = tmp_path / "bad.car"
    car.write_bytes(data)
    assert main(["import", str(car), "--data", str(tmp_path / "dst")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ketten: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "dst").exists()
    assert main(["verify", "--json", str(car)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and message in report["error"]

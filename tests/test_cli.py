"""The ketten command line: every command, in process or as a subprocess.

The network commands (publish, read, tail) run against nodes of the test on
loopback TCP with the Kademlia overlay, or a ``ketten serve`` process.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pluggy
import pytest
import trio

import ketten
from ketten import Node, NodeConfig, criterion_key, open_node
from ketten._cli import main
from ketten.adapters.memory import MemoryNetwork
from ketten.testing import deterministic_identity

CLI = [sys.executable, "-m", "ketten._cli"]


async def write_store(path: Path, store: str, plugins: pluggy.PluginManager) -> None:
    config = NodeConfig(store=store, options={"store": {"path": str(path)},
                                              "transport": {"network": MemoryNetwork()}})
    async with ketten.open_node(config, plugins=plugins) as node:
        for name in ("a", "b"):
            for i in range(20):
                await node.append_local(criterion_key(name), b"%s-%d" % (name.encode(), i))


@pytest.mark.parametrize("store", ["sqlite", "file"])
async def test_verify_store_directories(
    tmp_path: Path, store: str, plugins: pluggy.PluginManager, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_store(tmp_path / "n1", store, plugins)
    assert await trio.to_thread.run_sync(main, ["verify", str(tmp_path / "n1")]) == 0
    out = capsys.readouterr().out
    assert out.count("20 events ok") == 2
    assert await trio.to_thread.run_sync(main, ["verify", str(tmp_path)]) == 1
    assert "not a ketten store directory" in capsys.readouterr().out
    assert await trio.to_thread.run_sync(main, ["chains", str(tmp_path / "n1")]) == 0
    listing = capsys.readouterr().out
    assert "2 chains" in listing
    row = next(line for line in listing.splitlines() if criterion_key("a").hex() in line)
    assert row.split()[1] == "20"
    assert await trio.to_thread.run_sync(
        main, ["chains", "--json", str(tmp_path / "n1"), str(tmp_path)]) == 1
    listed, missing = map(json.loads, capsys.readouterr().out.splitlines())
    assert {c["criterion"]: c["events"] for c in listed["chains"]} == {
        criterion_key("a").hex(): 20, criterion_key("b").hex(): 20}
    assert missing["path"] == str(tmp_path) and "not a ketten store" in missing["error"]
    assert await trio.to_thread.run_sync(
        main, ["verify", "--json", "--verify", "links", str(tmp_path / "n1")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and [c["events"] for c in report["chains"]] == [20, 20]


async def test_verify_reports_a_damaged_chain(
    tmp_path: Path, plugins: pluggy.PluginManager, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_store(tmp_path / "n1", "sqlite", plugins)
    db = next((tmp_path / "n1").glob("*.sqlite3"))
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("select name from sqlite_master where type='table'")]
    raw = db.read_bytes()
    marker = b"a-7"
    index = raw.find(marker)
    assert index > 0, tables
    db.write_bytes(raw[:index] + b"a-8" + raw[index + 3 :])
    assert await trio.to_thread.run_sync(main, ["verify", str(tmp_path / "n1")]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and criterion_key("a").hex() in out
    assert out.count("20 events ok") == 1
    assert await trio.to_thread.run_sync(main, ["verify", "--json", str(tmp_path / "n1")]) == 1
    report = json.loads(capsys.readouterr().out)
    failed = {c["criterion"]: c for c in report["chains"] if not c["ok"]}
    assert not report["ok"] and list(failed) == [criterion_key("a").hex()]
    assert failed[criterion_key("a").hex()]["error"]


def test_plugins_and_keygen(tmp_path: Path) -> None:
    listed = subprocess.run([sys.executable, "-m", "ketten._cli", "plugins"],
                            check=True, capture_output=True, text=True).stdout
    assert "sqlite" in listed and "memory" in listed
    key = tmp_path / "node.key"
    out = subprocess.run([sys.executable, "-m", "ketten._cli", "keygen", str(key)],
                         check=True, capture_output=True, text=True).stdout.strip()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert ketten.Identity.load(key).node_id.hex() == out
    again = subprocess.run([sys.executable, "-m", "ketten._cli", "keygen", str(key)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "overwrite" in again.stderr
    missing = subprocess.run([sys.executable, "-m", "ketten._cli", "keygen",
                              str(tmp_path / "no" / "such" / "dir" / "k")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "No such file or directory" in missing.stderr and "no/such/dir" in missing.stderr
    version = subprocess.run([sys.executable, "-m", "ketten._cli", "--version"],
                             check=True, capture_output=True, text=True).stdout
    assert version.strip() == f"ketten {ketten.__version__}"
    as_json = json.loads(subprocess.run([sys.executable, "-m", "ketten._cli", "plugins", "--json"],
                                        check=True, capture_output=True, text=True).stdout)
    assert "sqlite" in as_json["store"] and "kademlia" in as_json["overlay"]


def test_sim_runs_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--seeds", "4-5", "--family", "joins", "--overlay", "static",
                 "--publishes", "60"]) == 0
    out = capsys.readouterr().out
    assert "seed 4: ok" in out and "seed 5: ok" in out and "all 2 runs passed" in out


def test_sim_is_named_ketten_sim(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ketten sim ") and "--jobs" in out and "python -m" not in out
    assert main(["sim", "--family", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ketten sim: error: unknown family 'nope'") and err.count("\n") == 1


def test_keygen_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "node.key"
    assert main(["keygen", "--json", str(key)]) == 0
    made = json.loads(capsys.readouterr().out)
    identity = ketten.Identity.load(key)
    assert made == {"path": str(key), "node_id": identity.node_id.hex(),
                    "public_key": identity.public_key.hex()}


def test_usage_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KETTEN_BOOTSTRAP", raising=False)
    boot = ["--bootstrap", "127.0.0.1:1"]
    payload = tmp_path / "payload"
    payload.write_bytes(b"x")
    cases = [
        (["frobnicate"], "No such command 'frobnicate'"),
        (["read", "orders"], "Missing option '--bootstrap'"),
        (["read", "orders", "--bogus", *boot], "--bogus"),
        (["read", "orders", "--from", "-1", *boot], "--from"),
        (["read", "orders", "--timeout", "0", *boot], "must be more than 0"),
        (["read", "abc", "--by-key", *boot], "not a 64-hex-digit key"),
        (["publish", "orders", "x", "--file", str(payload), *boot], "not both"),
        (["publish", "orders", "x", "--key", str(tmp_path / "none.key"), *boot],
         "no such key file"),
        (["chains", str(tmp_path / "absent")], "does not exist"),
        (["keygen", str(payload)], "refusing to overwrite"),
        (["serve", "--config", str(tmp_path / "absent.json")], "cannot read the configuration"),
        (["serve", "--key", str(tmp_path / "k"), "--store", "sqlite"], "needs a directory"),
        (["serve", "--key", str(tmp_path / "k"), "--store", "memory", "--log-level", "LOUD"],
         "log level must be"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        captured = capsys.readouterr()
        assert captured.out == "", args
        assert captured.err.startswith("ketten: error: ") and captured.err.count("\n") == 1, (
            args, captured.err)
        assert message in captured.err, (args, captured.err)


# -- the network commands ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def cluster(plugins: pluggy.PluginManager, count: int = 3,
                  bootstrap: str | None = None) -> AsyncIterator[list[Node]]:
    """``count`` nodes on loopback TCP with Kademlia, each joining through the first
    (or through ``bootstrap``)."""
    started: list[Node] = []
    async with trio.open_nursery() as nursery:

        async def run(index: int, task_status: trio.TaskStatus[Node]) -> None:
            seeds = [bootstrap] if bootstrap else [n.address for n in started[:1]]
            config = NodeConfig(identity=deterministic_identity(71, index), transport="tcp",
                                overlay="kademlia",
                                options={"transport": {"listen": "127.0.0.1:0"},
                                         "overlay": {"bootstrap": seeds}})
            async with open_node(config, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        for index in range(count):
            started.append(await nursery.start(run, index))
        yield started
        nursery.cancel_scope.cancel()


async def cli(*args: str) -> int:
    """``ketten ARGS`` in this process, on a thread of its own (it runs trio itself)."""
    return await trio.to_thread.run_sync(main, list(args))


async def test_publish_then_read(plugins: pluggy.PluginManager, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    async with cluster(plugins) as nodes:
        boot = ["--bootstrap", nodes[0].address]
        assert await cli("publish", "orders", "order #1\ncreated", *boot) == 0
        published_text = re.fullmatch(r"seq 0 hash ([0-9a-f]{64})\n", capsys.readouterr().out)
        assert published_text is not None
        blob = tmp_path / "blob"
        blob.write_bytes(b"\x00\xffnot text")
        assert await cli("publish", "orders", "--file", str(blob), "--json",
                         "-b", f"{nodes[1].address},{nodes[2].address}") == 0
        published = json.loads(capsys.readouterr().out)
        assert published["seq"] == 1 and published["encoding"] == "base64"
        assert base64.b64decode(published["payload"]) == b"\x00\xffnot text"
        assert published["criterion"] == criterion_key("orders").hex()

        assert await cli("read", "orders", *boot) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split()[0] for line in lines] == ["0", "1"]
        assert lines[0].endswith("  order #1\\ncreated")  # one event, one line
        assert lines[1].endswith("  " + b"\x00\xffnot text".hex())
        assert await cli("read", "orders", "--json", "--from", "1", *boot) == 0
        assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [published]
        assert await cli("read", criterion_key("orders").hex(), "--by-key", "--limit", "1",
                         "--json", *boot) == 0
        (first,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert first["payload"] == "order #1\ncreated" and first["encoding"] == "utf-8"
        assert first["hash"] == published_text.group(1)
        assert await cli("read", "nothing here", *boot) == 0
        assert capsys.readouterr().out == ""
        held = await nodes[0].read("orders")
        assert [e.hash.hex() for e in held] == [published_text.group(1), published["hash"]]
        # With --data and no --key the directory keeps the node's key: run after run,
        # the same node opens its store.
        data = tmp_path / "client"
        for _ in range(2):
            assert await cli("read", "orders", "--data", str(data), *boot) == 0
            assert len(capsys.readouterr().out.splitlines()) == 2
        assert (data / "node.key").exists()

        # A node of another network is named with the reason it refused.
        assert await cli("read", "orders", "--replication", "5", *boot) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert captured.err.startswith("ketten: error: no bootstrap node answered: handshake")
        assert "replication factor r=3 differs from ours (r=5)" in captured.err

    assert await cli("read", "orders", "--bootstrap", f"127.0.0.1:{free_port()}") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("ketten: error: no bootstrap node answered: cannot connect "
                                   "to 127.0.0.1:")


class Lines:
    """Lines from a subprocess pipe, waited for (no polling)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def line(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise EOFError(bytes(self._buffer).decode())
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        return line.decode()

    async def rest(self) -> str:
        while chunk := await self._stream.receive_some():
            self._buffer += chunk
        return bytes(self._buffer).decode()


async def start(*args: str) -> tuple[trio.Process, Lines, Lines]:
    proc = await trio.lowlevel.open_process([*CLI, *args], stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    return proc, Lines(proc.stdout), Lines(proc.stderr)


@pytest.mark.slow
async def test_tail_prints_events_as_they_commit_until_a_signal(
        plugins: pluggy.PluginManager) -> None:
    async with cluster(plugins) as nodes:
        before = await nodes[1].publish("news", b"before")
        seen = [before]
        for signum, extra in ((signal.SIGINT, []), (signal.SIGTERM, ["--json", "--from", "0"])):
            proc, out, err = await start("tail", "news", "-b", nodes[0].address, *extra)
            try:
                with trio.fail_after(60):
                    assert await err.line() == "ketten: following news"
                    event = await nodes[2].publish("news", b"after %d" % signum)
                    seen.append(event)
                    if extra:
                        records = [json.loads(await out.line()) for _ in seen]
                        assert [r["seq"] for r in records] == [e.seq for e in seen]
                        assert [r["hash"] for r in records] == [e.hash.hex() for e in seen]
                        assert records[-1]["payload"] == f"after {signum}"
                    else:
                        line = await out.line()
                        assert line.split()[0] == "1" and line.endswith(f"  after {signum}")
                    proc.send_signal(signum)
                    assert await proc.wait() == 0
                    assert await out.rest() == ""
                    assert "Traceback" not in await err.rest()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


@pytest.mark.slow
async def test_serve_runs_a_node_until_sigterm(plugins: pluggy.PluginManager, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "store": "memory",
                                  "options": {"replication": {"anti_entropy": 1.0}}}))
    key = tmp_path / "serve.key"
    proc, out, err = await start("serve", "--config", str(config), "--key", str(key),
                                 "--log-level", "WARNING")
    try:
        with trio.fail_after(60):
            line = await out.line()
        serving = re.fullmatch(r"ketten: serving at (\S+) node ([0-9a-f]{64})", line)
        assert serving is not None, line
        assert serving.group(1) == f"127.0.0.1:{port}"
        assert serving.group(2) == ketten.Identity.load(key).node_id.hex()
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        async with cluster(plugins, 2, bootstrap=serving.group(1)):
            assert await cli("publish", "notes", "through serve", "-b", serving.group(1)) == 0
            assert await cli("read", "notes", "-b", serving.group(1)) == 0
            assert capsys.readouterr().out.splitlines()[-1].endswith("  through serve")
        with trio.fail_after(60):
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
            assert "Traceback" not in await err.rest()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("overlay", ["kademlia", "ipfs", "gosskip"])
def test_serve_bootstraps_every_overlay_that_joins_through_addresses(
        overlay: str, tmp_path: Path) -> None:
    from ketten._serve import build_config

    config = build_config({"overlay": overlay, "store": "memory", "key": str(tmp_path / "k"),
                           "bootstrap": ["127.0.0.1:4001", "127.0.0.1:4002"]})
    assert config.overlay == overlay
    assert config.options["overlay"]["bootstrap"] == ["127.0.0.1:4001", "127.0.0.1:4002"]

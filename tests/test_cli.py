"""The ketten command line."""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pluggy
import pytest
import trio

import ketten
from ketten import NodeConfig, criterion_key
from ketten._cli import main
from ketten.adapters.memory import MemoryNetwork


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
    assert f"{criterion_key('a').hex()}          20 events" in listing


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

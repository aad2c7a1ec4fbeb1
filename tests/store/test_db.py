"""The results database: WAL, migrations from an older schema, concurrent writers, filters."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from gpuready.errors import InputError
from gpuready.store import SCHEMA_VERSION, ResultsDB
from gpuready.store.db import MIGRATIONS


def test_new_database_is_wal_and_current(tmp_path: Path) -> None:
    with ResultsDB(tmp_path / "a" / "r.db") as db:
        assert db.journal_mode == "wal"
        assert db.version == SCHEMA_VERSION


def test_a_version_1_database_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("INSERT INTO runs (started_at, kind, target) VALUES (1.0, 'probe', 'gpt2')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with ResultsDB(path) as db:
        assert db.version == SCHEMA_VERSION
        runs = db.runs()
        assert [r.target for r in runs] == ["gpt2"] and runs[0].max_value is None
        db.finish_run(runs[0].id, "ok", 7)
        assert db.runs()[0].max_value == 7


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match="newer"):
        ResultsDB(path)


def test_not_a_database_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputError, match="--db"):
        ResultsDB(path)


def _writer(path: str, n: int, tag: str) -> None:
    with ResultsDB(path) as db:
        run = db.start_run("probe", tag)
        for i in range(n):
            db.add_point(run, {"values": {"batch": i}, "ok": True, "status": "ok", "peak_device_bytes": i})
        db.finish_run(run, "ok")


def test_parallel_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "par.db")
    ResultsDB(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, 40, f"job{i}")) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with ResultsDB(path) as db:
        runs = db.runs(limit=None)
        assert len(runs) == 4 and all(len(r.points) == 40 for r in runs)
        assert len(db.runs(target="job2")) == 1
        assert db.runs(kind="command") == []

"""SQLite results database.

WAL journal mode so several trials writing at once lose nothing (readers never block the writer; writers
wait on `busy_timeout`); a schema version in `PRAGMA user_version` with ordered migrations, each run in one
transaction. Default file: the user's data folder (XDG_DATA_HOME or ~/.local/share on Linux, ~/Library/
Application Support on macOS, %LOCALAPPDATA% on Windows) / gpuready / results.db; `GPUREADY_DB` or
`--db PATH` override it. (SQLite WAL: https://www.sqlite.org/wal.html; user_version:
https://www.sqlite.org/pragma.html#pragma_user_version.)
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuready.errors import InputError

# Each entry moves the schema from version i to i + 1. Never edit a released entry; append.
MIGRATIONS: tuple[str, ...] = (
    # 1: runs and their points
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started_at REAL NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        variable TEXT,
        workload TEXT,
        host TEXT,
        gpu TEXT,
        status TEXT NOT NULL DEFAULT 'running'
    );
    CREATE TABLE points (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        vals TEXT NOT NULL,
        ok INTEGER NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        peak_allocated_bytes INTEGER,
        peak_reserved_bytes INTEGER,
        peak_device_bytes INTEGER,
        step_seconds REAL,
        throughput REAL,
        wall_seconds REAL,
        data TEXT
    );
    CREATE INDEX points_run ON points(run_id);
    """,
    # 2: a run remembers the max found and where it ended (find-max), and the target is searchable
    """
    ALTER TABLE runs ADD COLUMN max_value INTEGER;
    ALTER TABLE runs ADD COLUMN ended_at REAL;
    CREATE INDEX runs_target ON runs(target);
    """,
    # 3: bench records (`gpuready bench`): the figures compare and plan read, and the whole record as JSON
    """
    CREATE TABLE benches (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at REAL NOT NULL,
        host TEXT,
        label TEXT,
        gpu TEXT,
        gpu_count INTEGER,
        job TEXT NOT NULL,
        status TEXT NOT NULL,
        ready_seconds REAL,
        unit TEXT,
        median_per_second REAL,
        effective_per_second REAL,
        stable_seconds REAL,
        price_per_hour REAL,
        schema_version INTEGER NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX benches_gpu ON benches(gpu);
    """,
    # 4: per-GPU-model step-time factors (measured / predicted) fitted from the records (plan/calibrate.py)
    """
    CREATE TABLE gpu_efficiency (
        gpu TEXT PRIMARY KEY,
        factor REAL NOT NULL,
        records INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        detail TEXT
    );
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def default_db_path() -> Path:
    env = os.environ.get("GPUREADY_DB")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "gpuready" / "results.db"


@dataclass(frozen=True)
class RunRecord:
    id: int
    started_at: float
    kind: str
    target: str
    variable: str | None
    workload: dict[str, Any] | None
    host: str | None
    gpu: str | None
    status: str
    max_value: int | None
    points: list[dict[str, Any]]

    @property
    def outcome(self) -> str:
        """The status; runs recorded as "done" (before partial/failed were told apart) are read from their
        points: ok (all ran), partial (some), failed (none). Skipped points do not count."""
        if self.status != "done":
            return self.status
        tried = [p for p in self.points if p.get("status") != "skipped"]
        ran = sum(1 for p in tried if p.get("ok"))
        if tried and ran == len(tried):
            return "ok"
        return "partial" if ran else "failed"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "started_at": self.started_at,
            "kind": self.kind,
            "target": self.target,
            "variable": self.variable,
            "workload": self.workload,
            "host": self.host,
            "gpu": self.gpu,
            "status": self.outcome,
            "max": self.max_value,
            "points": self.points,
        }


_POINT_COLUMNS = (
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_device_bytes",
    "step_seconds",
    "throughput",
    "wall_seconds",
)


class ResultsDB:
    """Open (creating and migrating as needed) the database at `path`. One connection per instance."""

    def __init__(self, path: str | Path | None = None, *, timeout_seconds: float = 30.0) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=timeout_seconds, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute(f"PRAGMA busy_timeout = {int(timeout_seconds * 1000)}")
            self.journal_mode = str(self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            self.conn.execute("PRAGMA foreign_keys = ON")
            self.migrate()
        except sqlite3.DatabaseError as exc:
            raise InputError("--db", f"{self.path}: not a usable SQLite database ({exc})") from None
        except OSError as exc:
            raise InputError("--db", f"{self.path}: cannot open ({exc.strerror})") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front: two writers queue on busy_timeout, never deadlock
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def migrate(self) -> None:
        with self._tx() as conn:
            current = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if current > SCHEMA_VERSION:
                raise InputError(
                    "--db",
                    f"{self.path}: schema version {current} is newer than this gpuready ({SCHEMA_VERSION})",
                )
            for version in range(current, SCHEMA_VERSION):
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version + 1}")

    def start_run(
        self,
        kind: str,
        target: str,
        variable: str | None = None,
        workload: dict[str, Any] | None = None,
        gpu: str | None = None,
    ) -> int:
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO runs (started_at, kind, target, variable, workload, host, gpu) VALUES (?,?,?,?,?,?,?)",
                (
                    time.time(),
                    kind,
                    target,
                    variable,
                    json.dumps(workload) if workload else None,
                    platform.node(),
                    gpu,
                ),
            )
            return int(cur.lastrowid or 0)

    def add_point(self, run_id: int, point: dict[str, Any]) -> int:
        data = {k: v for k, v in point.items() if k not in (*_POINT_COLUMNS, "values", "ok", "status", "error")}
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO points (run_id, created_at, vals, ok, status, error, peak_allocated_bytes,"
                " peak_reserved_bytes, peak_device_bytes, step_seconds, throughput, wall_seconds, data)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    time.time(),
                    json.dumps(point.get("values", {})),
                    int(bool(point.get("ok"))),
                    str(point.get("status", "ok" if point.get("ok") else "failed")),
                    point.get("error"),
                    *(point.get(c) for c in _POINT_COLUMNS),
                    json.dumps(data, default=str),
                ),
            )
            if point.get("gpu"):
                conn.execute("UPDATE runs SET gpu = COALESCE(gpu, ?) WHERE id = ?", (point["gpu"], run_id))
            return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, status: str, max_value: int | None = None) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE runs SET status = ?, max_value = ?, ended_at = ? WHERE id = ?",
                (status, max_value, time.time(), run_id),
            )

    def add_bench(self, record: dict[str, Any]) -> int:
        """Store a bench record (BenchRecord.to_json()); returns its row id."""
        machine = record.get("machine") or {}
        gpus = machine.get("gpus") or []
        tp = record.get("throughput") or {}
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO benches (created_at, host, label, gpu, gpu_count, job, status, ready_seconds, unit,"
                " median_per_second, effective_per_second, stable_seconds, price_per_hour, schema_version, record)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    time.time(),
                    machine.get("host"),
                    machine.get("label"),
                    gpus[0].get("name") if gpus else None,
                    len(gpus),
                    (record.get("job") or {}).get("description", ""),
                    record.get("status", "failed"),
                    (record.get("ready") or {}).get("seconds"),
                    tp.get("unit"),
                    tp.get("median_per_second"),
                    tp.get("effective_per_second"),
                    tp.get("stable_seconds"),
                    (record.get("price") or {}).get("per_hour"),
                    int(record.get("schema_version", 1)),
                    json.dumps(record, default=str),
                ),
            )
            return int(cur.lastrowid or 0)

    def benches(self, *, gpu: str | None = None, limit: int | None = 50) -> list[tuple[int, dict[str, Any]]]:
        """Stored bench records, newest first (`gpu`: the GPU name contains this text): (row id, record JSON)."""
        sql = "SELECT id, record FROM benches"
        args: list[Any] = []
        if gpu is not None:
            sql += " WHERE gpu LIKE ?"
            args.append(f"%{gpu}%")
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [(int(row["id"]), json.loads(row["record"])) for row in self.conn.execute(sql, args).fetchall()]

    def runs(
        self,
        *,
        target: str | None = None,
        kind: str | None = None,
        status: str | None = None,
        gpu: str | None = None,
        limit: int | None = 50,
    ) -> list[RunRecord]:
        """Newest first. Filters match case-insensitively; `target` and `gpu` as substrings."""
        where, args = [], []
        for column, value, like in (
            ("target", target, True),
            ("kind", kind, False),
            ("status", status, False),
            ("gpu", gpu, True),
        ):
            if value is not None:
                where.append(f"{column} LIKE ?" if like else f"lower({column}) = lower(?)")
                args.append(f"%{value}%" if like else value)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self.conn.execute(sql, args).fetchall()
        return [self._record(row) for row in rows]

    def set_gpu_efficiency(self, factors: dict[str, tuple[float, int, dict[str, Any]]]) -> None:
        """Replace the stored per-GPU-model step-time factors: name -> (factor, records, detail)."""
        with self._tx() as conn:
            conn.execute("DELETE FROM gpu_efficiency")
            for gpu, (factor, records, detail) in factors.items():
                conn.execute(
                    "INSERT INTO gpu_efficiency (gpu, factor, records, updated_at, detail) VALUES (?,?,?,?,?)",
                    (gpu, float(factor), int(records), time.time(), json.dumps(detail, default=str)),
                )

    def gpu_efficiency(self) -> dict[str, tuple[float, int]]:
        """Stored step-time factors: GPU model (catalog name) -> (factor, records)."""
        rows = self.conn.execute("SELECT gpu, factor, records FROM gpu_efficiency").fetchall()
        return {str(r["gpu"]): (float(r["factor"]), int(r["records"])) for r in rows}

    def _record(self, row: sqlite3.Row) -> RunRecord:
        pts = self.conn.execute("SELECT * FROM points WHERE run_id = ? ORDER BY id", (row["id"],)).fetchall()
        points = []
        for p in pts:
            item: dict[str, Any] = {
                "values": json.loads(p["vals"]),
                "ok": bool(p["ok"]),
                "status": p["status"],
                "error": p["error"],
            }
            item.update({c: p[c] for c in _POINT_COLUMNS})
            item.update(json.loads(p["data"] or "{}"))
            points.append(item)
        return RunRecord(
            id=int(row["id"]),
            started_at=float(row["started_at"]),
            kind=row["kind"],
            target=row["target"],
            variable=row["variable"],
            workload=json.loads(row["workload"]) if row["workload"] else None,
            host=row["host"],
            gpu=row["gpu"],
            status=row["status"],
            max_value=row["max_value"],
            points=points,
        )

"""The local results database: every trial run and point, and (later) benches. SQLite in WAL mode."""

from gpuready.store.db import SCHEMA_VERSION, ResultsDB, RunRecord, default_db_path

__all__ = ["SCHEMA_VERSION", "ResultsDB", "RunRecord", "default_db_path"]

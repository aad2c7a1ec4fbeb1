"""Benchmark a rented machine on one fixed job (`bench`) and set platforms side by side (`compare`).

`bench()` runs the job in a child process (the trial's probe in bench mode, or the user's command); nothing here
imports torch. Records are versioned JSON (record.py); compare.py reads them and computes cost per unit of work.
"""

from gpuready.bench.compare import Comparison, compare, load_records
from gpuready.bench.record import SCHEMA_VERSION, BenchRecord, load_record
from gpuready.bench.run import DEFAULT_JOB, bench, default_workload
from gpuready.bench.watch import Progress

__all__ = [
    "DEFAULT_JOB",
    "SCHEMA_VERSION",
    "BenchRecord",
    "Comparison",
    "Progress",
    "bench",
    "compare",
    "default_workload",
    "load_record",
    "load_records",
]

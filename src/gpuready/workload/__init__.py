"""The task definition shared by estimate, plan, trial and check (docs/cli.md, "The workload")."""

from gpuready.workload.spec import (
    FIELDS,
    Workload,
    describe,
    load_workload_file,
    make_workload,
    workload_from_args,
)

__all__ = ["FIELDS", "Workload", "describe", "load_workload_file", "make_workload", "workload_from_args"]

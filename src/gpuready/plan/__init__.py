"""`plan`: which GPUs hold the job, how fast it runs there (plan/steptime.py) and what the work costs.

For other commands (bench, compare): `step_time(workload, gpu) -> StepTime` predicts one step's seconds, its
throughput (tokens or images per second) and its breakdown by op class on any catalog card; `card_for(name)`
maps an NVML device name to the catalog; `refresh_factors(db)` turns measured records into per-card factors.
"""

from gpuready.plan.calibrate import card_for, refresh_factors, stored_factors
from gpuready.plan.plan import PlanOption, PlanResult, plan, step_flops
from gpuready.plan.steptime import StepTime, step_time

__all__ = [
    "PlanOption",
    "PlanResult",
    "StepTime",
    "card_for",
    "plan",
    "refresh_factors",
    "step_flops",
    "step_time",
    "stored_factors",
]

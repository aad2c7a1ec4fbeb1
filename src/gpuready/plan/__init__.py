"""`plan`: which GPUs hold the job, how long it takes there and what it costs."""

from gpuready.plan.plan import PlanOption, PlanResult, plan, step_flops

__all__ = ["PlanOption", "PlanResult", "plan", "step_flops"]

"""Trial runs: measure a job's real peak memory and speed on this GPU (built-in probe or your own command),
sweep one variable, find the largest batch or sequence that fits, and record everything.

torch is imported only in the probe's child process (probe.py), never here.
"""

from gpuready.trial.api import estimator_predictor, run_backend, trial_command, trial_probe
from gpuready.trial.result import LinearFit, Point, TrialResult
from gpuready.trial.search import doubling_then_bisect, find_max

__all__ = [
    "LinearFit",
    "Point",
    "TrialResult",
    "doubling_then_bisect",
    "estimator_predictor",
    "find_max",
    "run_backend",
    "trial_command",
    "trial_probe",
]

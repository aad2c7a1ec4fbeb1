"""Workload files people already have: axolotl, LLaMA-Factory and torchtune YAML, TRL/TrainingArguments JSON.

`read_workload_file` tells the format from the content (not the name), maps what the file says onto the
workload's fields and lists every key it did not use, with why: a key that changes memory but is not modelled
is a warning, never silently dropped. Our own TOML is read as before. PyYAML is imported only for YAML files.

Modules: `detect` (reading, parsing, detection, dispatch), `result` (WorkloadFile and the reasons), `reader`
(the mapping machinery), `shared` (mappings several tools share), and one per tool: `axolotl`,
`llamafactory`, `torchtune`, `trl`.

Field names and meanings, per tool's documentation (read 2026-11-30):
- axolotl: https://docs.axolotl.ai/docs/config-reference.html
- LLaMA-Factory: https://llamafactory.readthedocs.io/en/latest/advanced/arguments.html and
  https://github.com/hiyouga/LLaMA-Factory/blob/main/examples/README.md
- torchtune: https://docs.pytorch.org/torchtune/stable/deep_dives/configs.html and the shipped recipes, e.g.
  https://github.com/pytorch/torchtune/blob/main/recipes/configs/llama3/8B_lora_single_device.yaml
- transformers TrainingArguments: https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments
  (optimizer names: `transformers.training_args.OptimizerNames`); TRL SFTConfig / ModelConfig:
  https://huggingface.co/docs/trl/sft_trainer and https://huggingface.co/docs/trl/clis
"""

from gpuready.workload.formats.detect import detect_format, read_workload_file
from gpuready.workload.formats.result import (
    EMPTY,
    FORMAT_NAMES,
    NO_EFFECT,
    NOT_MODELLED,
    NOT_READ,
    Ignored,
    Mapped,
    WorkloadFile,
)

__all__ = [
    "EMPTY",
    "FORMAT_NAMES",
    "NOT_MODELLED",
    "NOT_READ",
    "NO_EFFECT",
    "Ignored",
    "Mapped",
    "WorkloadFile",
    "detect_format",
    "read_workload_file",
]

"""What reading a workload file gives: the format names, the reasons a key went unused, and `WorkloadFile` with
its `Mapped` and `Ignored` keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FORMAT_NAMES = {
    "gpuready": "gpuready TOML",
    "axolotl": "axolotl YAML",
    "llamafactory": "LLaMA-Factory YAML",
    "torchtune": "torchtune recipe YAML",
    "trl": "TRL / TrainingArguments",
}

# why a key was not used
NO_EFFECT = "no effect on memory"
NOT_MODELLED = "changes memory, not modelled"
NOT_READ = "not read by gpuready"
EMPTY = "empty"


@dataclass(frozen=True)
class Mapped:
    key: str  # the file's key (dotted for nested tables)
    value: Any  # the file's value
    field: str  # the workload field it set
    to: Any  # the value it set


@dataclass(frozen=True)
class Ignored:
    key: str
    value: Any
    reason: str
    detail: str = ""


@dataclass
class WorkloadFile:
    """What a workload file said, in workload fields, and what of it was not used."""

    path: str
    format: str
    fields: dict[str, Any] = field(default_factory=dict)
    mapped: list[Mapped] = field(default_factory=list)
    ignored: list[Ignored] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # assumptions made while mapping
    problems: dict[str, str] = field(default_factory=dict)  # workload field -> why the file's value can't be sized

    @property
    def label(self) -> str:
        return FORMAT_NAMES[self.format]

    @property
    def warnings(self) -> list[Ignored]:
        return [i for i in self.ignored if i.reason == NOT_MODELLED]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "format_name": self.label,
            "fields": self.fields,
            "mapped": [{"key": m.key, "value": m.value, "field": m.field, "to": m.to} for m in self.mapped],
            "ignored": [
                {"key": i.key, "value": i.value, "reason": i.reason} | ({"detail": i.detail} if i.detail else {})
                for i in self.ignored
            ],
            "notes": self.notes,
        }

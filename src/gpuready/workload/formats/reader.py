"""The mapping machinery every tool's translator uses: the flattened table, `_Reader` (keys taken as they are
used, the rest listed as ignored with a reason) and the value coercions."""

from __future__ import annotations

from typing import Any

from gpuready.errors import InputError
from gpuready.workload.formats.result import EMPTY, NO_EFFECT, NOT_MODELLED, NOT_READ, Ignored, Mapped, WorkloadFile


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key != "deepspeed":  # an inline DeepSpeed config stays one value
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _empty(v: Any) -> bool:
    return v is None or (isinstance(v, str | list | dict) and len(v) == 0)


class _Reader:
    """Keys are taken as they are used; whatever is left at the end is listed as ignored, with a reason."""

    def __init__(self, path: str, fmt: str, data: dict[str, Any]) -> None:
        self.out = WorkloadFile(path, fmt)
        self.flat = _flatten(data)
        self.used: set[str] = set()
        self.not_modelled: dict[str, str] = {}
        self.no_effect: set[str] = set()

    def known(self, no_effect: set[str] | frozenset[str], not_modelled: dict[str, str]) -> None:
        """The tool's keys gpuready does not use: those with no effect on memory, and those that change memory but
        are not modelled (an empty reason: no effect after all)."""
        self.no_effect |= no_effect
        self.not_modelled.update({k: v for k, v in not_modelled.items() if v})
        self.no_effect |= {k for k, v in not_modelled.items() if not v}

    def has(self, key: str) -> bool:
        return key in self.flat and not _empty(self.flat[key])

    def get(self, key: str, default: Any = None) -> Any:
        """The value (None when absent or empty); the key counts as used."""
        if key in self.flat:
            self.used.add(key)
        v = self.flat.get(key)
        return default if _empty(v) else v

    def peek(self, key: str) -> Any:
        v = self.flat.get(key)
        return None if _empty(v) else v

    def set(self, name: str, value: Any, key: str, theirs: Any = None) -> None:
        self.out.fields[name] = value
        self.out.mapped = [m for m in self.out.mapped if m.field != name]
        self.out.mapped.append(Mapped(key, theirs if theirs is not None else self.flat.get(key), name, value))
        self.used.add(key)

    def also(self, key: str, what: str) -> None:
        """A key read only as part of another's decision: listed as used, with what it meant."""
        if key in self.flat and key not in self.used:
            self.out.mapped.append(Mapped(key, self.flat[key], "", what))
            self.used.add(key)

    def note(self, line: str) -> None:
        self.out.notes.append(line)

    def problem(self, name: str, line: str) -> None:
        self.out.problems[name] = line

    def finish(self) -> WorkloadFile:
        for key, value in self.flat.items():
            if key in self.used:
                continue
            if _empty(value):
                self.out.ignored.append(Ignored(key, value, EMPTY))
                continue
            top = key.split(".")[0]
            detail = self.not_modelled.get(key, self.not_modelled.get(top))
            if detail is not None and value is not False:
                self.out.ignored.append(Ignored(key, value, NOT_MODELLED, detail))
            elif detail is not None or key in self.no_effect or top in self.no_effect:
                self.out.ignored.append(Ignored(key, value, NO_EFFECT))
            else:
                self.out.ignored.append(Ignored(key, value, NOT_READ))
        return self.out


def _as_bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes", "auto")
    return bool(v)


def _as_int(r: _Reader, key: str) -> int | None:
    v = r.get(key)
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise InputError("--workload", f"{r.out.path}: {key} must be an integer, got {v!r}") from None
